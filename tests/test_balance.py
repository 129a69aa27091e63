"""Balancing a group by queue or by message (``Balance``): the public enum,
the sources that refuse ``Balance.MESSAGE`` (embedded, Kafka) and what the
runtime does with a source that balances by message (a custom key is
refused; gaps other members took are not counted as filtered)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from helpers import wait_until
from prometheus_client import CollectorRegistry

import lite_push
from lite_push import (
    AsyncLitePushConsumer,
    Balance,
    ConfigError,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    MessageExt,
    PollBatch,
    PullSource,
    sources,
)
from lite_push.sources import ConsumeFromWhere, EmbeddedPullConsumer

FIRST = ConsumeFromWhere.FIRST_OFFSET


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.create_topic("T", queue_count=1)
    yield b
    b.close()


class MessageGrained(EmbeddedPullConsumer):
    """A member that says it balances as ``balance_said`` and whose batches
    lack every odd offset, as if other members of a group balanced by
    message had taken them."""

    def __init__(self, *args: object, balance_said: Balance, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._balance_said = balance_said

    @property
    def balance(self) -> Balance:
        return self._balance_said

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        return [
            PollBatch(b.queue, [m for m in b.messages if m.queue_offset % 2 == 0], b.next_offset)
            for b in super().poll(timeout, max_per_queue)
        ]


# -- the enum and the contract ---------------------------------------------------------


def test_balance_is_public_with_queue_the_default() -> None:
    assert lite_push.Balance is sources.Balance is Balance
    assert "Balance" in lite_push.__all__ and "Balance" in sources.__all__
    assert [(m.name, m.value) for m in Balance] == [("QUEUE", "QUEUE"), ("MESSAGE", "MESSAGE")]
    doc = inspect.getdoc(PullSource.balance) or ""
    assert "not contiguous" in doc and "acknowledge" in doc


def test_every_shipped_source_balances_by_queue(broker: EmbeddedBroker) -> None:
    src = broker.pull_consumer("g", balance=Balance.QUEUE)
    try:
        assert src.balance is Balance.QUEUE
    finally:
        src.close()


# -- sources that refuse MESSAGE -------------------------------------------------------


def test_the_embedded_broker_refuses_message_balancing(broker: EmbeddedBroker) -> None:
    for make in (
        lambda: broker.pull_consumer("g", balance=Balance.MESSAGE),
        lambda: EmbeddedPullConsumer(broker, "g", balance=Balance.MESSAGE),
    ):
        with pytest.raises(ConfigError) as info:
            make()
        assert info.value.field == "balance"
        text = str(info.value)
        assert text.startswith("balance: Balance.MESSAGE is refused")
        assert "one process" in text and "Redis source" in text and "Balance.QUEUE" in text
    with pytest.raises(ConfigError) as info:
        broker.pull_consumer("g", balance="MESSAGE")  # type: ignore[arg-type]
    assert info.value.field == "balance" and "must be Balance.QUEUE or Balance.MESSAGE" in str(info.value)
    assert broker.pull_consumer("g").balance is Balance.QUEUE  # nothing was left registered


def test_the_kafka_source_refuses_message_balancing() -> None:
    pytest.importorskip("confluent_kafka")
    from lite_push.sources.kafka import KafkaBroker

    kafka = KafkaBroker("127.0.0.1:1")  # never contacted: the arguments are checked first
    try:
        with pytest.raises(ConfigError) as info:
            kafka.pull_consumer("g", balance=Balance.MESSAGE)
        assert info.value.field == "balance"
        text = str(info.value)
        assert text.startswith("balance: Balance.MESSAGE is refused")
        for needed in ("share groups (KIP-932)", "key order", "no share consumer", "Balance.QUEUE", "Redis"):
            assert needed in text, needed
        with pytest.raises(ConfigError) as info:
            kafka.pull_consumer("g", balance=None)  # type: ignore[arg-type]
        assert info.value.field == "balance"
    finally:
        kafka.close()


# -- the runtime with a source that balances by message --------------------------------


def _by_account(msg: MessageExt) -> str | None:
    return msg.properties.get("account")


async def _async_listener(msgs: list[MessageExt]) -> None:
    return None


def test_a_custom_key_is_refused_with_message_balancing(broker: EmbeddedBroker) -> None:
    src = MessageGrained(broker, "g", balance_said=Balance.MESSAGE)
    with pytest.raises(ConfigError) as info:
        LitePushConsumer(ConsumerConfig(group="g", key_extractor=_by_account), src, lambda msgs: None)
    assert info.value.field == "key_extractor"
    assert "Balance.MESSAGE" in str(info.value) and "the message's keys" in str(info.value)
    with pytest.raises(ConfigError) as info:
        AsyncLitePushConsumer(
            ConsumerConfig(group="g", executor="asyncio", key_extractor=_by_account), src, _async_listener
        )
    assert info.value.field == "key_extractor"
    assert src.rebalance_listener is None  # refused before the consumer took the source
    LitePushConsumer(ConsumerConfig(group="g"), src, lambda msgs: None).shutdown(0.0)  # keys: accepted
    queued = broker.pull_consumer("g")
    LitePushConsumer(ConsumerConfig(group="g", key_extractor=_by_account), queued, lambda msgs: None).shutdown(0.0)


@pytest.mark.parametrize(("balance", "filtered"), [(Balance.MESSAGE, 0), (Balance.QUEUE, 20)])
def test_offsets_other_members_took_are_not_counted_as_filtered(
    broker: EmbeddedBroker, balance: Balance, filtered: int
) -> None:
    """The same non-contiguous batches: from a MESSAGE source the gaps are
    other members' messages; from a QUEUE source they are what its tag
    filter passed over (the control)."""
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(40)])
    src = MessageGrained(broker, "g", consume_from=FIRST, balance_said=balance)
    c = LitePushConsumer(
        ConsumerConfig(group="g", lanes=2, poll_timeout=0.02), src, lambda msgs: None, registry=CollectorRegistry()
    )
    c.subscribe("T")
    with c:
        assert wait_until(lambda: c.stats().consumed == 20)
        snap = c.metrics_snapshot()
        assert snap is not None
        ((polled, counted, _, _),) = snap.queue_counts.values()
    assert polled == 20 and counted == filtered

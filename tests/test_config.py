"""Invalid configuration raises at construction, naming the field."""

from __future__ import annotations

import re

import pytest

from lite_push import ConfigError, ConsumeMode, ConsumerConfig, LitePushError


def test_defaults_follow_rocketmq():
    c = ConsumerConfig(group="g")
    assert (c.pull_threshold_size_for_queue, c.max_span) == (100 * 1024 * 1024, 1 << 20)
    assert (c.commit_interval, c.batch_size, c.suspend_ms) == (5.0, 1, 1000)
    assert (c.max_reconsume_times, c.retry_start_level) == (16, 3)
    assert c.mode is ConsumeMode.KEY_ORDERLY
    assert c.lane_placement == "load"
    assert c.executor is None  # by the listener, when the consumer is built
    assert (c.lanes, c.pull_threshold_for_queue, c.pull_batch_size) == (None, None, None)  # by the executor too
    assert (c.queue_threshold, c.poll_size) == (1000, 32)  # RocketMQ's, until an executor is chosen


def test_lanes_and_the_queue_threshold_follow_the_executor():
    """Unset, ``lanes`` and ``pull_threshold_for_queue`` are the executor's:
    few threads and RocketMQ's threshold, or thousands of coroutine lanes
    (an idle one costs no task) with more queued per queue to keep them
    busy; set, they are kept."""
    threads = ConsumerConfig(group="g", executor="thread")
    assert (threads.lanes, threads.pull_threshold_for_queue, threads.pull_batch_size) == (16, 1000, 32)
    loop = ConsumerConfig(group="g", executor="asyncio")
    assert (loop.lanes, loop.pull_threshold_for_queue, loop.pull_batch_size) == (2048, 5000, 512)
    assert (loop.queue_threshold, loop.poll_size) == (5000, 512)
    kept = ConsumerConfig(group="g", executor="asyncio", lanes=8, pull_threshold_for_queue=7)
    assert (kept.lanes, kept.pull_threshold_for_queue) == (8, 7)
    from lite_push._core.listeners import resolve_executor

    async def handle(msgs: list[object]) -> None:
        return None

    chosen = resolve_executor(ConsumerConfig(group="g"), handle)
    assert (chosen.executor, chosen.lanes, chosen.pull_threshold_for_queue) == ("asyncio", 2048, 5000)
    chosen = resolve_executor(ConsumerConfig(group="g"), lambda msgs: None)
    assert (chosen.executor, chosen.lanes, chosen.pull_threshold_for_queue) == ("thread", 16, 1000)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("group", "  ", "a group name, or '' for the source's group"),
        ("group", None, "a group name"),
        ("mode", "SIDEWAYS", "ConsumeMode or its name (KEY_ORDERLY, CONCURRENTLY, QUEUE_ORDERLY)"),
        ("mode", 1, "ConsumeMode"),
        ("lanes", 0, "[1, 65536]"),  # executor unset: a plain listener's threads take at most 1024 (test_listeners)
        ("lanes", 2.5, "int"),
        ("lanes", True, "int"),
        ("lane_placement", "random", "'load', 'hash', 'java'"),
        ("lane_placement", None, "'load', 'hash', 'java'"),
        ("lane_capacity", -1, "[1,"),
        ("batch_size", 0, "[1, 1024]"),
        ("pull_batch_size", 5000, "[1, 1024]"),
        ("pull_threshold_for_queue", 0, "[1,"),
        ("pull_threshold_size_for_queue", 0, "[1,"),
        ("max_span", 0, "[1,"),
        ("offset_map_max_bytes", 10, "[64,"),
        ("max_reconsume_times", -2, "[-1,"),
        ("retry_start_level", 0, "[1,"),
        ("commit_interval", 0, "(0.0,"),
        ("commit_interval", "5", "number"),
        ("poll_timeout", -1, "(0.0,"),
        ("suspend_ms", -5, "[0,"),
        ("revoke_timeout", -1, "[0.0,"),
        ("key_extractor", "keys", "callable"),
        ("consume_thread_min", 0, "[1, 1000]"),
        ("consume_thread_max", 5, ">= consume_thread_min"),
        ("lock_lease", 0, "(0.0,"),
        ("lock_renew_interval", 60.0, "shorter than lock_lease"),
        ("max_continuous_consume", -1, "(0.0,"),
    ],
)
def test_invalid_value_names_the_field(field, value, fragment):
    kwargs = {"group": "g", field: value}
    with pytest.raises(ConfigError) as info:
        ConsumerConfig(**kwargs)
    err = info.value
    assert err.field == field
    assert str(err).startswith(f"{field}: ")
    assert fragment in str(err)
    assert isinstance(err, ValueError) and isinstance(err, LitePushError)


def test_config_is_frozen():
    c = ConsumerConfig(group="g")
    with pytest.raises(AttributeError):
        c.lanes = 3  # type: ignore[misc]


def test_the_consumer_and_its_source_must_name_the_same_group() -> None:
    """Retries go to the source group's retry topic: a consumer configured
    for another group would send them where nobody reads (issue 16.5)."""
    from lite_push import EmbeddedBroker, LitePushConsumer

    with EmbeddedBroker() as broker:
        broker.create_topic("T")
        source = broker.pull_consumer("orders")
        with pytest.raises(ConfigError, match="group") as info:
            LitePushConsumer(ConsumerConfig(group="sms"), source, lambda msgs: None)
        assert info.value.field == "group"
        assert "'sms'" in str(info.value) and "'orders'" in str(info.value)
        # the same name is fine
        LitePushConsumer(ConsumerConfig(group="orders"), source, lambda msgs: None)


def test_the_group_is_named_once_with_the_source() -> None:
    """Issue 41: ``ConsumerConfig()`` takes the source's group; a source of
    no group (a bare PullSource) needs it named."""
    from lite_push import EmbeddedBroker, LitePushConsumer

    with EmbeddedBroker() as broker:
        broker.create_topic("T")
        consumer = LitePushConsumer(ConsumerConfig(), broker.pull_consumer("orders"), lambda msgs: None)
        assert consumer.config.group == "orders"
        consumer.shutdown()


def test_a_source_of_no_group_needs_the_group_named() -> None:
    from lite_push import EmbeddedBroker, LitePushConsumer
    from lite_push.sources import EmbeddedPullConsumer

    class NoGroup(EmbeddedPullConsumer):
        @property
        def group(self) -> str | None:
            return None

    with EmbeddedBroker() as broker:
        source = NoGroup(broker, "x")
        with pytest.raises(ConfigError, match="source belongs to no group") as info:
            LitePushConsumer(ConsumerConfig(), source, lambda msgs: None)
        assert info.value.field == "group"
        source.close()


@pytest.mark.parametrize("name", ["KEY_ORDERLY", "key_orderly", " Concurrently ", "queue_orderly"])
def test_mode_takes_its_name_in_any_case(name: str) -> None:
    """Issue 30, 6: as the command line does; the field holds the member."""
    c = ConsumerConfig(group="g", mode=name)  # typed for its names too: no ignore needed
    assert c.mode is ConsumeMode[name.strip().upper()]


def test_help_documents_every_field() -> None:
    """Issue 41: ``help(ConsumerConfig)`` shows each field with what it
    means, not only its name."""
    import dataclasses
    import inspect
    import pydoc

    doc = inspect.getdoc(ConsumerConfig) or ""
    shown = pydoc.render_doc(ConsumerConfig, renderer=pydoc.plaintext)
    for f in dataclasses.fields(ConsumerConfig):
        entry = re.search(rf"^``{f.name}``\n((?:    \S.*\n?)+)", doc, re.MULTILINE)
        assert entry is not None, f.name
        assert len(entry.group(1).split()) >= 5, (f.name, entry.group(1))
        assert entry.group(1).splitlines()[0].strip() in shown, f.name

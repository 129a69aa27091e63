"""The application's rebalance hooks and its own pause and resume of queues
(issue 19, item 3); a source's own rebalance listener is the consumer's
(issue 27, item 7)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

import pytest
from helpers import PollCounter, wait_until

from lite_push import (
    AppHook,
    AsyncLitePushConsumer,
    ConfigError,
    ConsumeFromWhere,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    LitePushError,
    MessageExt,
    MessageQueue,
)
from lite_push.cli.queues import queue_ranges
from lite_push.sources import RebalanceListener


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.create_topic("T", queue_count=4)
    yield b
    b.close()


def _consumer(broker: EmbeddedBroker, listener, **kw) -> LitePushConsumer:  # type: ignore[no-untyped-def]
    c = LitePushConsumer(
        ConsumerConfig(group="g", poll_timeout=0.02, commit_interval=0.05, revoke_timeout=2.0),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=listener,
        **kw,
    )
    c.subscribe("T")
    return c


def test_hooks_run_after_lite_push_drained_and_committed_the_revoked_queues(broker: EmbeddedBroker) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(400)])
    events: list[tuple[str, str, list[MessageQueue], dict[MessageQueue, object]]] = []
    lock = threading.Lock()

    done_by_a: dict[MessageQueue, set[int]] = {}  # the offsets member a finished, per queue

    def listener_a(msgs):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        with lock:
            for m in msgs:
                done_by_a.setdefault(m.queue, set()).add(m.queue_offset)

    def lowest_unfinished(q: MessageQueue) -> int:
        done = done_by_a.get(q, set())
        return next(o for o in range(len(done) + 1) if o not in done)

    def listener(msgs):  # type: ignore[no-untyped-def]
        time.sleep(0.002)

    def hooks(name: str) -> dict[str, object]:
        def assigned(queues: list[MessageQueue]) -> None:
            with lock:
                events.append(("assigned", name, queues, {}))

        def revoked(queues: list[MessageQueue]) -> None:
            # by now lite_push committed them: the group's offset is where this member stopped
            committed = {q: getattr(broker.committed("g", q), "offset", None) for q in queues}
            with lock:
                # what a had finished of each, frozen now that its calls are over
                done = {q: lowest_unfinished(q) for q in queues} if name == "a" else {}
                events.append(("revoked", name, queues, {q: (committed[q], done.get(q)) for q in queues}))

        return {"on_assigned": assigned, "on_revoked": revoked}

    a = _consumer(broker, listener_a, **hooks("a"))
    with a:
        assert wait_until(lambda: any(e[0] == "assigned" and e[1] == "a" for e in events), timeout=10)
        assert wait_until(lambda: a.stats().consumed > 50, timeout=10)
        b = _consumer(broker, listener, **hooks("b"))  # joins the group now
        with b:  # b joins: a's revoke hook sees the queues drained and committed
            assert wait_until(lambda: any(e[0] == "revoked" and e[1] == "a" for e in events), timeout=20)
            assert wait_until(lambda: any(e[0] == "assigned" and e[1] == "b" for e in events), timeout=20)
    ((_, _, first, _),) = [e for e in events if e[:2] == ("assigned", "a")][:1]
    assert first == sorted(broker.queues("T"))  # all four, sorted
    revoked = next(e for e in events if e[:2] == ("revoked", "a"))
    # drained and committed before the hook: the group's offset of each is
    # a's lowest unfinished offset (a queue of which a finished nothing may
    # have no commit yet, or one at 0 from a periodic commit)
    for _q, (committed, done) in revoked[3].items():  # type: ignore[misc]
        assert committed == done or (done == 0 and committed is None), revoked
    gained = next(e for e in events if e[:2] == ("assigned", "b"))
    assert set(gained[2]) == set(revoked[2])  # what a gave up is what b got


def test_a_hook_that_raises_is_logged_and_consumption_goes_on(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(40)])

    def bad(queues: list[MessageQueue]) -> None:
        raise ValueError("application bug")

    with _consumer(broker, lambda msgs: None, on_assigned=bad) as c:
        assert wait_until(lambda: c.stats().consumed == 40, timeout=10)
    assert "on_assigned hook raised" in caplog.text and c.failure is None


@pytest.mark.parametrize("hook", [42, "f"])
def test_a_hook_must_be_a_plain_function(broker: EmbeddedBroker, hook: object) -> None:
    with pytest.raises(ConfigError, match="on_revoked"):
        _consumer(broker, lambda msgs: None, on_revoked=hook)


def test_an_async_hook_is_refused(broker: EmbeddedBroker) -> None:
    async def hook(queues: list[MessageQueue]) -> None: ...

    with pytest.raises(ConfigError, match="on_assigned"):
        _consumer(broker, lambda msgs: None, on_assigned=hook)


def test_pause_stops_polling_a_queue_until_resume_and_flow_control_does_not_undo_it(broker: EmbeddedBroker) -> None:
    q0 = broker.queues("T")[0]
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def listener(msgs):  # type: ignore[no-untyped-def]
        with lock:
            seen.extend((m.queue_id, m.queue_offset) for m in msgs)

    with _consumer(broker, listener) as c:
        polls = PollCounter(c._source)
        assert wait_until(lambda: len(c.stats().in_flight) == 4, timeout=10)
        c.pause([q0])
        assert c.paused_by_app() == {q0}
        assert wait_until(lambda: q0 in c.stats().paused, timeout=10)
        for i in range(20):
            for qid in range(4):
                broker.send("T", b"x", keys=f"k{i}", queue_id=qid)
        assert wait_until(lambda: len(seen) == 60, timeout=10)  # the three others
        polls.turns(10)  # flow control runs every turn of the pull loop: it must not resume q0
        with lock:
            assert not any(qid == 0 for qid, _ in seen)
        assert q0 in c.stats().paused
        c.resume([q0])
        assert wait_until(lambda: len(seen) == 80, timeout=10)
        with lock:
            assert sorted(o for qid, o in seen if qid == 0) == list(range(20))
        assert c.paused_by_app() == frozenset()
        assert wait_until(lambda: q0 not in c.stats().paused, timeout=10)


# -- the source's rebalance listener is the consumer's -------------------------------
#
# The consumer installs its own listener on the source (it drains and commits
# the revoked queues); the application's hooks are on_assigned / on_revoked.
# A listener set on the source would otherwise be replaced without a word, or
# replace the consumer's: both are refused.


class _Recorder(RebalanceListener):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        self.calls.append("assigned")


def test_the_hooks_are_typed_by_the_exported_apphook(broker: EmbeddedBroker) -> None:
    gained: list[list[MessageQueue]] = []
    hook: AppHook = gained.append
    with _consumer(broker, lambda msgs: None, on_assigned=hook):
        assert wait_until(lambda: len(gained) == 1, timeout=10)
    assert gained == [broker.queues("T")]


def test_a_source_that_has_a_rebalance_listener_is_refused(broker: EmbeddedBroker) -> None:
    source = broker.pull_consumer("g")
    recorder = _Recorder()
    source.set_rebalance_listener(recorder)
    for build in (
        lambda: LitePushConsumer(ConsumerConfig(group="g"), source, lambda msgs: None),
        lambda: AsyncLitePushConsumer(ConsumerConfig(group="g", executor="asyncio"), source, _async_listener),
    ):
        with pytest.raises(ConfigError, match="on_assigned= / on_revoked=") as info:
            build()
        assert info.value.field == "source"
        assert source.rebalance_listener is recorder  # left as it was
    source.close()


def test_a_source_serves_one_consumer(broker: EmbeddedBroker) -> None:
    source = broker.pull_consumer("g")
    first = LitePushConsumer(ConsumerConfig(group="g"), source, lambda msgs: None)
    assert source.rebalance_listener is not None  # the consumer's own
    with pytest.raises(ConfigError, match="already has a rebalance listener"):
        LitePushConsumer(ConsumerConfig(group="g"), source, lambda msgs: None)
    first.shutdown()


def test_a_listener_set_after_the_consumer_was_built_stops_the_start(broker: EmbeddedBroker) -> None:
    source = broker.pull_consumer("g")
    c = LitePushConsumer(ConsumerConfig(group="g"), source, lambda msgs: None)
    c.subscribe("T")
    recorder = _Recorder()
    source.set_rebalance_listener(recorder)
    with pytest.raises(LitePushError, match="replaced after the consumer was built"):
        c.start()
    assert c.metrics_url is None and c.shutdown()  # never started: nothing to drain
    assert recorder.calls == []


def test_a_listener_set_after_an_async_consumer_was_built_stops_the_start(broker: EmbeddedBroker) -> None:
    source = broker.pull_consumer("g")

    async def main() -> None:
        c = AsyncLitePushConsumer(ConsumerConfig(group="g", executor="asyncio"), source, _async_listener)
        c.subscribe("T")
        source.set_rebalance_listener(_Recorder())
        with pytest.raises(LitePushError, match="replaced after the consumer was built"):
            await c.start()
        assert await c.shutdown()

    asyncio.run(main())


async def _async_listener(msgs: list[object]) -> None:
    return None


# -- on_revoked does not run at shutdown ------------------------------------------------
#
# The README says so: shutdown() drains, commits and leaves the group without
# the application's on_revoked (close() of every source releases the queues
# without calling the rebalance listener); the queues go to the other members,
# whose on_assigned runs.


def _source_broker(kind: str, request: pytest.FixtureRequest) -> Iterator[object]:
    """A broker of ``kind`` with topic ``T`` of 4 queues, closed afterwards."""
    if kind == "embedded":
        b: object = EmbeddedBroker()
        b.create_topic("T", queue_count=4)  # type: ignore[attr-defined]
    elif kind == "redis":
        import uuid

        from lite_push.sources.redis import RedisBroker

        server = request.getfixturevalue("redis_server")
        b = RedisBroker(server.url, namespace=f"h-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5)
        b.create_topic("T", queue_count=4)  # type: ignore[attr-defined]
    else:
        from lite_push.sources.kafka import KafkaBroker
        from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

        cluster = MockKafkaCluster().start()
        request.addfinalizer(cluster.stop)
        b = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic, session_timeout=3.0)
        b.create_topic("T", 4)  # type: ignore[attr-defined]
    yield b
    b.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["embedded", "redis", "kafka"])
def any_broker(request: pytest.FixtureRequest) -> Iterator[object]:
    yield from _source_broker(request.param, request)


def _member(
    broker: object, name: str, events: list[tuple[str, str, list[MessageQueue]]], seen: set[tuple[int, int, str]]
) -> LitePushConsumer:
    def hook(what: str) -> AppHook:
        return lambda queues: events.append((what, name, queues))

    def listener(msgs: list[MessageExt]) -> None:
        seen.update((m.queue_id, m.queue_offset, name) for m in msgs)

    c = LitePushConsumer(
        # no periodic commit during the test: a queue is committed when it is revoked, or at shutdown
        ConsumerConfig(group="g", poll_timeout=0.02, commit_interval=600.0, revoke_timeout=2.0),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=name),  # type: ignore[attr-defined]
        listener=listener,
        on_assigned=hook("assigned"),
        on_revoked=hook("revoked"),
    )
    c.subscribe("T")
    return c


def test_on_revoked_does_not_run_at_shutdown_and_the_queues_go_to_the_others(any_broker: object) -> None:
    broker: Any = any_broker
    events: list[tuple[str, str, list[MessageQueue]]] = []
    seen: set[tuple[int, int, str]] = set()  # (queue id, offset, member) finished
    queues = set(broker.queues("T"))
    b = _member(broker, "b", events, seen)
    with b:
        a = _member(broker, "a", events, seen)
        a.start()
        # the group settled with both in it (b gave some queues up to a on the way: its on_revoked ran then)
        assert wait_until(lambda: _owned(events, "a") and _owned(events, "a") | _owned(events, "b") == queues, 30)
        held_by_a = _owned(events, "a")
        broker.send_batch("T", [(b"x", f"k{i}") for i in range(200)])  # for both members
        ranges = {r.queue: r for r in queue_ranges(broker, "T")}
        ends = {q: r.end for q, r in ranges.items()}
        # a has finished every message of its queues: the shutdown (which does not drain by default: a
        # message still queued in a lane stays uncommitted) then commits them all
        everything = {(q.queue_id, o, "a") for q in held_by_a for o in range(ranges[q].first, ends[q])}
        assert wait_until(lambda: everything <= seen, timeout=30)
        assert a.shutdown(timeout=10.0)  # commits, leaves the group
        assert not _revoked(events, "a")  # no on_revoked at shutdown
        for q in held_by_a:  # yet committed: the shutdown committed every message of a's queues
            assert broker.committed("g", q).offset == ends[q], q
        assert sum(ends[q] for q in held_by_a) > 0
        assert wait_until(lambda: _owned(events, "b") == queues, timeout=30)  # b's on_assigned got them
        revoked_from_b = _revoked(events, "b")
    assert _revoked(events, "b") == revoked_from_b  # b's own shutdown: none either


def _revoked(events: list[tuple[str, str, list[MessageQueue]]], name: str) -> list[list[MessageQueue]]:
    return [qs for what, who, qs in list(events) if (what, who) == ("revoked", name)]


def _owned(events: list[tuple[str, str, list[MessageQueue]]], name: str) -> set[MessageQueue]:
    """The queues member ``name`` owns by its hooks' account (assigned minus revoked)."""
    owned: set[MessageQueue] = set()
    for what, who, qs in list(events):
        if who == name:
            owned = owned | set(qs) if what == "assigned" else owned - set(qs)
    return owned

"""The lite_push runtime on the Kafka source, against librdkafka's mock
cluster (a Kafka protocol server the tests start in a helper process on
127.0.0.1 and stop by its PID): key order, no loss, commits to the end,
parking with the offset map in the commit metadata, retries held for their
delay and produced to the retry topic, dead letters, malformed records,
the 4,096-byte metadata limit, and a member joining mid-run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import PollCounter, Recorder, assert_offsets_increase, wait_consumed, wait_for, wait_until

from lite_push import ConsumeMode, ConsumerConfig, LitePushConsumer, ManualClock, MessageExt, OffsetAndMetadata
from lite_push._state.offset_map import decode, encode
from lite_push.sources import ConsumeFromWhere, dlq_topic
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

#: The mock's rebalances take the session less a second: keep it short.
SESSION = 3.0
#: Kafka's API key of OffsetCommit, and the error code of REBALANCE_IN_PROGRESS.
OFFSET_COMMIT = 8
REBALANCE_IN_PROGRESS = 27


@pytest.fixture
def cluster() -> Iterator[MockKafkaCluster]:
    with MockKafkaCluster() as c:
        yield c


@pytest.fixture
def broker(cluster: MockKafkaCluster) -> Iterator[KafkaBroker]:
    b = KafkaBroker(
        cluster.bootstrap, topic_creator=cluster.create_topic, session_timeout=SESSION, delay_levels=(1.0, 5.0)
    )
    yield b
    b.close()


def _consumer(broker, listener, client_id, clock=None, topic="T", **cfg):
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    cfg.setdefault("revoke_timeout", 2.0)  # + fence_margin inside the 3 s session
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client_id),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe(topic)
    return consumer


def _committed_total(broker: KafkaBroker, topic: str = "T") -> int:
    total = 0
    for q in broker.queues(topic):
        c = broker.committed("g", q)
        total += 0 if c is None else c.offset
    return total


@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.QUEUE_ORDERLY, ConsumeMode.CONCURRENTLY])
def test_runtime_on_kafka_keeps_key_order_and_commits_everything(broker, mode):
    broker.create_topic("T", 4)
    total = 3000
    broker.send_batch("T", [(b"x", f"k{i % 97}") for i in range(total)])
    rec = Recorder(jitter=0.0002)
    with _consumer(broker, rec, "c1", lanes=16, mode=mode) as consumer:
        assert wait_until(lambda: consumer.stats().consumed == total, timeout=60)
    if mode is not ConsumeMode.CONCURRENTLY:  # concurrent mode promises no key order
        assert rec.overlaps == []
        assert_offsets_increase(rec.order)
    assert len(set(rec.seen)) == total
    assert _committed_total(broker) == total  # shutdown committed to the end of every partition


def test_async_listener_on_uvloop_keeps_key_order(broker):
    broker.create_topic("T", 8)
    total = 4000
    broker.send_batch("T", [(b"x", f"k{i % 500}") for i in range(total)])
    active: set[str] = set()
    overlaps: list[str] = []
    order: dict[str, list[tuple[int, int]]] = {}

    async def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            assert m.keys is not None
            if m.keys in active:
                overlaps.append(m.keys)
            active.add(m.keys)
            order.setdefault(m.keys, []).append((m.queue_id, m.queue_offset))
            await asyncio.sleep(0.0005)
            active.discard(m.keys)

    with _consumer(broker, listener, "c1", lanes=64, executor="asyncio") as consumer:
        assert wait_until(lambda: consumer.stats().consumed == total, timeout=60)
    assert overlaps == []
    assert_offsets_increase(order)
    assert sum(len(v) for v in order.values()) == total
    assert _committed_total(broker) == total


def test_parked_key_commits_the_offset_map_in_the_metadata_and_the_next_member_replays_only_it(broker):
    broker.create_topic("T", 1)
    broker.send_batch("T", [(b"x", "P" if i % 100 == 5 else f"k{i}") for i in range(1000)])
    poison = {i for i in range(1000) if i % 100 == 5}
    done: list[int] = []
    lock = threading.Lock()

    def first(msgs):
        for m in msgs:
            if m.keys == "P":
                raise RuntimeError("poisoned")
            with lock:
                done.append(m.queue_offset)

    clock = ManualClock()
    q = broker.queues("T")[0]
    with _consumer(broker, first, "c1", clock, lanes=8, suspend_ms=60_000) as consumer:
        assert wait_until(lambda: len(done) == 1000 - len(poison), timeout=30)
        clock.advance(0.1)  # a commit, not the retry
        assert wait_until(lambda: consumer.stats().committed.get(q) == 5)
    c = broker.committed("g", q)
    assert c is not None and c.offset == 5 and c.metadata
    finished = decode(c.metadata, 5)
    assert finished is not None and all((o in finished) == (o not in poison) for o in range(6, finished.end))
    second: list[int] = []
    with _consumer(broker, lambda msgs: second.extend(m.queue_offset for m in msgs), "c2", lanes=8) as consumer:
        assert wait_until(lambda: set(second) == poison, timeout=30)
        # committed to the end: everything finished, nothing more to deliver
        end = broker.watermarks(q)[1]
        wait_for(lambda: consumer.stats().committed.get(q) == end, 30, lambda: f"a commit at {end}: {consumer.stats()}")
    assert sorted(second) == sorted(poison)  # the offset map skipped everything that had finished


def test_a_failed_message_is_held_for_its_delay_then_produced_to_the_retry_topic(broker):
    """Kafka has no delayed delivery: the runtime holds the send-back on its
    timer, the offset stays uncommitted until the copy is produced."""
    broker.create_topic("T", 1)
    broker.send_batch("T", [(b"%d" % i, f"k{i}") for i in range(20)])
    calls: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def listener(msgs):
        for m in msgs:
            with lock:
                calls.append((m.topic, m.queue_offset, m.reconsume_times))
            if m.body == b"7" and m.reconsume_times == 0:
                raise RuntimeError("first attempt fails")

    clock = ManualClock()
    q = broker.queues("T")[0]
    cfg = {"lanes": 4, "mode": ConsumeMode.CONCURRENTLY, "retry_start_level": 1}
    with _consumer(broker, listener, "c1", clock, **cfg) as consumer:
        polls = PollCounter(consumer._source)
        assert wait_until(lambda: len(calls) == 20, timeout=30)
        # everything but offset 7 finished; 7 is held on the timer, unfinished,
        # due a delay level (1 s) after it failed on the consumer's clock
        wait_for(
            lambda: consumer.stats().in_flight.get(q) == 1 and consumer.stats().next_retry_due is not None,
            30,
            lambda: f"offset 7 alone unfinished and held: {consumer.stats()}",
        )
        assert consumer.stats().next_retry_due - clock.monotonic() == pytest.approx(1.0)  # type: ignore[operator]
        clock.advance(0.1)  # two commit intervals: a commit, not yet the send-back
        held_for = 0.1
        # commits stop at the failed offset
        wait_for(lambda: consumer.stats().committed.get(q) == 7, 30, lambda: f"a commit at 7: {consumer.stats()}")
        assert broker.partition_count("%RETRY%g") in (None, 1)
        retry = broker.queues("%RETRY%g")[0] if broker.partition_count("%RETRY%g") else None
        assert retry is None or broker.messages(retry) == []  # nothing produced before the delay
        clock.advance(0.8 - held_for)
        polls.turns(3)  # the pull thread, which produces due send-backs, goes round
        assert broker.messages(broker.queues("%RETRY%g")[0]) == []  # 0.8 s of its 1 s: still held
        assert consumer.stats().committed.get(q) == 7
        clock.advance(0.3)  # level 1 (1 s) is due
        assert wait_until(lambda: ("%RETRY%g", 0, 1) in calls, timeout=30)
        clock.advance(0.1)
        assert wait_until(lambda: consumer.stats().committed.get(q) == 20, timeout=10)
    (copy,) = broker.messages(broker.queues("%RETRY%g")[0])
    assert copy.body == b"7" and copy.properties["ORIGIN_OFFSET"] == "7" and copy.reconsume_times == 1


def test_dead_letters_go_to_the_dlq_topic_and_malformed_records_too(broker):
    broker.create_topic("T", 2)
    broker.send_batch("T", [(b"%d" % i, f"k{i}") for i in range(10)])
    producer_records = [("T", 1, b"\xff\xfe", b"bad key", [])]
    assert broker.produce(producer_records) == [None]  # a key that is not UTF-8

    def listener(msgs):
        for m in msgs:
            if m.body == b"3":
                raise ValueError("never works")

    with _consumer(broker, listener, "c1", lanes=4, max_reconsume_times=0) as consumer:
        assert wait_until(lambda: _committed_total(broker) == 11, timeout=30)
        assert consumer.stats().dead_lettered == 1
    dead = broker.messages(broker.queues(dlq_topic("g"))[0])
    reasons = sorted((d.body, d.properties["DLQ_REASON"].split(":")[0]) for d in dead)
    assert reasons == [(b"3", "listener raised ValueError"), (b"bad key", "undecodable key")]
    (bad,) = [d for d in dead if d.body == b"bad key"]
    assert bad.keys is None and bad.properties["KAFKA_KEY_HEX"] == "fffe" and bad.properties["ORIGIN_OFFSET"] == "4"


def test_an_oversized_offset_map_is_cut_to_the_metadata_limit_and_never_fails_a_commit(broker):
    broker.create_topic("T", 1)
    q = broker.queues("T")[0]
    c = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("T")
    assert wait_until(lambda: bool(c.poll(0.05)) or bool(c.assignment()), timeout=10)
    unfinished = [0, *range(3, 100_000, 3)]  # a bitmap of ~16.7 KB
    md = encode(0, 100_000, unfinished)
    assert len(md) > 4096
    c.commit({q: OffsetAndMetadata(0, md)})
    stored = broker.committed("g", q)
    assert stored is not None and stored.offset == 0 and 0 < len(stored.metadata) <= 4096
    cut = decode(stored.metadata, 0)
    full = decode(md, 0)
    assert cut is not None and full is not None and cut.end > 1000
    assert all((o in cut) == (o in full) for o in range(0, cut.end))  # a prefix of the full map
    c.close()


def test_the_offset_map_stays_within_4096_bytes_while_keys_stay_parked(broker):
    """Many parked keys spread over a long span: flow control pauses the
    partition before its map outgrows Kafka's limit, and every commit's
    metadata fits."""
    broker.create_topic("T", 1)
    total = 20_000
    broker.send_batch("T", [(b"x", f"P{i}" if i % 7 == 3 else f"k{i}") for i in range(total)])
    sizes: list[int] = []
    clock = ManualClock()
    done = threading.Event()

    def listener(msgs):
        for m in msgs:
            if m.keys is not None and m.keys.startswith("P") and m.reconsume_times == 0 and not done.is_set():
                raise RuntimeError("parked")

    consumer = _consumer(broker, listener, "c1", clock, lanes=16, suspend_ms=600_000, max_span=1_000_000)
    assert consumer.config.offset_map_max_bytes == 4096  # clamped to the source's limit
    q = broker.queues("T")[0]
    with consumer:
        for _ in range(200):
            clock.advance(0.06)
            time.sleep(0.02)
            c = broker.committed("g", q)
            if c is not None:
                sizes.append(len(c.metadata))
            st = consumer.stats()
            if st.consumed > 3000 and st.paused:
                break
        st = consumer.stats()
        assert st.paused == {q}, "the partition was never paused for its map"
        assert st.consumed < total  # held back, not run to the end
        done.set()
        clock.advance(600.0)  # the parked keys retry and succeed

        def all_committed() -> bool:
            # commits run on the consumer's clock; and a key that failed just
            # before done.set() parked for 600 s from the moment it failed
            clock.advance(5.0)
            return _committed_total(broker) == total

        assert wait_until(all_committed, timeout=30, interval=0.02), (consumer.stats(), _committed_total(broker))
    assert sizes and max(sizes) <= 4096


def test_a_member_joining_mid_run_takes_partitions_after_they_were_drained_and_committed(broker, caplog):
    broker.create_topic("T", 8)
    total = 4000
    broker.send_batch("T", [(b"x", f"k{i % 200}") for i in range(total)])
    rec = Recorder(delay=0.0005, jitter=0.0005)
    a = _consumer(broker, rec, "c1", lanes=8)
    b = _consumer(broker, rec, "c2", lanes=8)
    with a:
        assert wait_until(lambda: rec.count() > 500, timeout=30)
        with b:  # joins mid-run: partitions move from a to b after a drained and committed them
            assert wait_until(lambda: len(set(rec.seen)) == total, timeout=90)
            assert wait_until(lambda: len(b.stats().committed) > 0, timeout=10)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order, first_only=True)
    # The hand-off replays nothing -- unless the mock completed the join
    # without the first member (it waits the session less 1 s for a member to
    # rejoin, where a real broker waits max.poll.interval.ms), which a loaded
    # machine can make it do: then that member's commits are refused (and
    # logged), and the next owner replays from the last accepted one.
    if "commit refused" not in caplog.text:
        assert len(rec.seen) == len(set(rec.seen))


def test_a_member_cut_off_from_its_coordinator_starts_no_call_past_its_session(cluster, broker):
    """Fencing: with the broker unreachable, no heartbeat is answered; the
    member's lanes stop starting listener calls before its session could
    have expired (last answer + session - fence_margin), although messages
    are still queued in them."""
    broker.create_topic("T", 2)
    broker.send_batch("T", [(b"x", f"k{i % 4}") for i in range(2000)])
    starts: list[float] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            starts.append(time.monotonic())
        time.sleep(0.01)

    margin = 0.5
    with _consumer(broker, listener, "c1", lanes=4, batch_size=1, fence_margin=margin, revoke_timeout=1.0) as consumer:
        assert wait_until(lambda: len(starts) > 50, timeout=30)
        down_at = time.monotonic()
        cluster.broker_down(1)
        try:
            time.sleep(SESSION + 1.0)
            with lock:
                late = [t - down_at for t in starts if t > down_at + SESSION - margin]
                after = len([t for t in starts if t > down_at])
            assert late == [], late
            assert after > 0  # the lanes went on until the fence
            assert consumer.stats().consumed < 2000  # and stopped with work left, not for lack of it
        finally:
            cluster.broker_up(1)


def test_a_topic_pattern_subscribes_every_matching_topic_with_its_tag_filter(broker):
    for t in ("orders-eu", "orders-us", "audit"):
        broker.create_topic(t, 2)
    for t in ("orders-eu", "orders-us", "audit"):
        items = [{"body": b"%d" % i, "keys": f"k{i % 5}", "tags": "A" if i % 2 else "B"} for i in range(40)]
        broker.send_batch(t, items)
    rec = Recorder()
    with _consumer(broker, rec, "c1", topic="^orders-.*", lanes=4) as consumer:
        polls = PollCounter(consumer._source)
        assert wait_until(lambda: consumer.stats().consumed == 80, timeout=30)
        # every owned queue committed to its end, and the pull thread goes on:
        # the consumer owns the orders topics' queues, and no other
        orders = {q: broker.watermarks(q)[1] for t in ("orders-eu", "orders-us") for q in broker.queues(t)}
        wait_for(lambda: consumer.stats().committed == orders, 30, lambda: f"commits at {orders}: {consumer.stats()}")
        polls.turns(3)
        assert set(consumer.stats().committed) == set(orders)
    assert {t for t, _, _ in rec.seen} == {"orders-eu", "orders-us"}  # not "audit"
    assert len(rec.seen) == 80
    with pytest.raises(ValueError, match="pattern"):
        broker.pull_consumer("x").subscribe("^orders-(")
    c = broker.pull_consumer("g2", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("^orders-.*", "A")
    got: list[MessageExt] = []
    assert wait_until(lambda: got.extend(m for b in c.poll(0.05) for m in b.messages) or len(got) >= 40, timeout=20)
    assert len(got) == 40 and {m.tags for m in got} == {"A"}
    c.close()


def test_a_commit_the_group_refuses_is_reported_not_claimed(cluster, broker):
    """Issue 41: the coordinator refuses every commit (REBALANCE_IN_PROGRESS,
    injected into the mock): the stop reads the group's offsets back and
    says they were not committed, rather than "offsets committed"; the
    refused commit is tried again, not taken for done."""
    broker.create_topic("T", 2)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(40)])
    gate, started = threading.Event(), threading.Event()

    def listener(msgs):
        started.set()
        gate.wait(30)

    consumer = _consumer(broker, listener, "c1", commit_interval=3600.0)
    with consumer:
        assert started.wait(30)
        cluster.push_request_errors(OFFSET_COMMIT, [REBALANCE_IN_PROGRESS] * 2000)
        gate.set()
        wait_consumed(consumer, 40)
    report = consumer.stop_report
    assert report is not None and not report.committed and not report.clean
    assert all(q.committed is None and q.finished_to > 0 for q in report.queues), report
    assert report.summary().startswith("offsets NOT committed for 2 of 2 queues"), report.summary()
    assert [broker.committed("g", q) for q in broker.queues("T")] == [None, None]

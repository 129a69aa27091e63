"""The Redis Streams source: the source contract on a real redis-server, plus
what only the Redis source does (atomic offsets under concurrent senders,
per-queue atomic batches)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import wait_until

from lite_push import ConfigError, MessageQueue, MessageTooLargeError, SourceUnavailableError, UnknownTopicError
from lite_push._kernels.router import lane_of
from lite_push.sources import ConsumeFromWhere, PullSource, RebalanceListener
from lite_push.sources.redis import RedisBroker, RedisPullConsumer
from lite_push.sources.redis import connection as redis_connection
from lite_push.sources.redis_server import RedisCluster, RedisServer, free_port
from lite_push.testing import SkewedClock, SourceContract, SourceHarness, offsets, poll_messages, poll_until, split

FIRST = ConsumeFromWhere.FIRST_OFFSET


class RedisHarness(SourceHarness):
    """A fresh namespace per harness, so tests never see each other's keys."""

    def __init__(self, url: str | redis.Redis | redis.RedisCluster, **kw: object) -> None:
        self.clock = SkewedClock()
        self.broker = RedisBroker(url, namespace=f"t-{uuid.uuid4().hex[:12]}", clock=self.clock, **kw)  # type: ignore[arg-type]
        self.consumers: list[RedisPullConsumer] = []

    def create_topic(self, topic: str, queue_count: int) -> list[MessageQueue]:
        return self.broker.create_topic(topic, queue_count)

    def send(self, topic, body, *, keys=None, tags=None, queue_id=None, properties=None):  # type: ignore[no-untyped-def]
        r = self.broker.send(topic, body, keys=keys, tags=tags, queue_id=queue_id, properties=properties)
        return r.queue, r.offset

    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def consumer(self, group, *, consume_from=FIRST, consume_timestamp=None, client_id=None) -> PullSource:  # type: ignore[no-untyped-def]
        c = self.broker.pull_consumer(
            group, consume_from=consume_from, consume_timestamp=consume_timestamp, client_id=client_id
        )
        self.consumers.append(c)
        return c

    def close(self) -> None:
        for c in self.consumers:
            c.close()
        self.broker.close()


@pytest.fixture
def harness(redis_server: RedisServer) -> Iterator[RedisHarness]:
    h = RedisHarness(redis_server.url)
    yield h
    h.close()


class TestRedisContract(SourceContract):
    pass


class TestRedisClusterContract(SourceContract):
    """The same suite on a three-node Redis Cluster (scripts are not
    pipelined there; every script's keys share one hash tag)."""

    @pytest.fixture
    def harness(self, cluster_harness: RedisHarness) -> RedisHarness:
        return cluster_harness


# -- Redis-specific -------------------------------------------------------------


def test_offsets_are_consecutive_per_queue_under_concurrent_senders(harness: RedisHarness) -> None:
    queues = harness.create_topic("T", 3)
    results: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def sender(n: int) -> None:
        try:
            for i in range(200):
                r = harness.broker.send("T", b"s%d-%d" % (n, i), keys=f"k{n}-{i}")
                with lock:
                    results.append((r.queue.queue_id, r.offset))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    by_q: dict[int, list[int]] = defaultdict(list)
    for qid, off in results:
        by_q[qid].append(off)
    assert sum(len(v) for v in by_q.values()) == 1200
    for q in queues:
        offs = sorted(by_q[q.queue_id])
        assert offs == list(range(len(offs)))
        assert harness.broker.max_offset(q) == len(offs)
        stored = harness.broker.messages(q)
        assert [m.queue_offset for m in stored] == offs


def test_batch_send_is_atomic_per_queue(harness: RedisHarness) -> None:
    queues = harness.create_topic("T", 2)
    errors: list[BaseException] = []
    batches: list[list] = []
    lock = threading.Lock()

    def sender(n: int) -> None:
        try:
            for b in range(10):
                items = [{"body": b"%d-%d-%d" % (n, b, i), "queue_id": i % 2} for i in range(40)]
                rs = harness.broker.send_batch("T", items)
                with lock:
                    batches.append(rs)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for rs in batches:
        for q in queues:
            offs = [r.offset for r in rs if r.queue == q]
            assert len(offs) == 20
            assert offs == list(range(offs[0], offs[0] + 20))  # contiguous: nobody interleaved
    for q in queues:
        stored = harness.broker.messages(q)
        assert [m.queue_offset for m in stored] == list(range(800))
    # a bad item anywhere stores nothing
    with pytest.raises(TypeError):
        harness.broker.send_batch("T", [b"ok", "not bytes"])
    assert all(harness.broker.max_offset(q) == 800 for q in queues)


def test_messages_carry_their_fields(harness: RedisHarness) -> None:
    (q0,) = harness.create_topic("T", 1)
    r = harness.broker.send("T", b"body", keys="k", tags="TagA", properties={"a": "1"})
    (m,) = harness.broker.messages(q0)
    assert (m.topic, m.queue_id, m.queue_offset, m.body, m.keys, m.tags, m.properties) == (
        "T",
        0,
        0,
        b"body",
        "k",
        "TagA",
        {"a": "1"},
    )
    assert m.msg_id == r.msg_id and m.queue == q0 == r.queue
    assert m.born_timestamp <= m.store_timestamp + 1000


def test_a_gap_in_a_stream_keeps_every_offset_right(harness: RedisHarness) -> None:
    # polls take offsets from the first id and the count while the entries
    # are consecutive; an entry deleted by hand (XDEL) makes a gap, and then
    # every offset comes from its own id
    (q0,) = harness.create_topic("T", 1)
    harness.broker.send_batch("T", [b"%d" % i for i in range(600)])
    key = harness.broker.queue_key("T", 0, "log")
    harness.broker.client.xdel(key, "11-0", "301-0")  # offsets 10 and 300
    c = harness.consumer("g")
    c.subscribe("T")
    got = []
    assert wait_until(lambda: got.extend(m for b in c.poll(0.05, 256) for m in b.messages) or len(got) == 598)
    assert [m.queue_offset for m in got] == [o for o in range(600) if o not in (10, 300)]
    assert all(m.body == b"%d" % m.queue_offset for m in got)
    assert [m.queue_offset for m in harness.broker.messages(q0, 8, 13)] == [8, 9, 11, 12]


def test_poll_survives_a_dropped_connection(harness: RedisHarness, redis_server: RedisServer) -> None:
    harness.create_topic("T", 1)
    for i in range(5):
        harness.send("T", b"%d" % i)
    c = harness.consumer("g")
    c.subscribe("T")
    got = []
    while len(got) < 5:
        got += [m.queue_offset for b in c.poll(0.2) for m in b.messages]
    # kill every client connection of the server: the next poll fails once
    admin = redis.Redis.from_url(redis_server.url)
    try:
        harness.send("T", b"5")
        admin.client_kill_filter(_type="normal", skipme=True)
    finally:
        admin.close()
    for _ in range(50):
        got += [m.queue_offset for b in c.poll(0.1) for m in b.messages]
        if len(got) >= 6:
            break
    assert got == list(range(6))


def test_a_server_outage_is_logged_once_and_consumption_resumes(caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer()  # its own server: this test stops it
    server.start()
    h = RedisHarness(server.url)
    try:
        h.create_topic("T", 1)
        for i in range(3):
            h.send("T", b"%d" % i)
        c = h.consumer("g")
        c.subscribe("T")
        got = poll_messages(c, 3)
        caplog.set_level(logging.WARNING, logger="lite_push.sources.redis")
        c.prefetch(3)  # a read in flight when the server goes: poll drops it
        server.stop(remove=False)
        for _ in range(5):
            c.prefetch(3)  # nothing to send it to: no error, the poll meets the outage
            t0 = time.monotonic()
            assert c.poll(0.2) == []
            assert time.monotonic() - t0 < 1.5
        server.start()
        deadline = time.monotonic() + 10
        while True:  # the server may still be loading its AOF
            try:
                h.send("T", b"3")
                break
            except redis.BusyLoadingError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        got += poll_messages(c, 1)
        assert [m.queue_offset for b in got for m in b.messages] == [0, 1, 2, 3]
        lost = [r for r in caplog.records if "connection lost" in r.getMessage()]
        back = [r for r in caplog.records if "connection back" in r.getMessage()]
        assert (len(lost), len(back)) == (1, 1)
    finally:
        h.close()
        server.stop()


def test_a_broker_on_a_server_that_does_not_answer_raises_source_unavailable() -> None:
    """The broker asks the server once: a server that is not there is
    lite_push's error naming its address (never the password), one line
    without the client's error chained to it."""
    port = free_port()
    with pytest.raises(SourceUnavailableError) as caught:
        RedisBroker(f"redis://user:s3cret@127.0.0.1:{port}/2")
    e = caught.value
    assert (
        str(e) == f"cannot connect to redis://127.0.0.1:{port}/2: ConnectionError: Error 111 connecting to "
        f"127.0.0.1:{port}. Connection refused."
    )
    assert e.address == f"redis://127.0.0.1:{port}/2" and "s3cret" not in str(e)
    assert e.__cause__ is None and e.__suppress_context__
    client = redis.Redis(port=port)  # a client of the caller's: the same
    with pytest.raises(SourceUnavailableError, match=f"cannot connect to redis://localhost:{port}/0: "):
        RedisBroker(client)
    # uncaught, it is one exception, not redis-py's traceback with ours after it
    code = f"from lite_push.sources.redis import RedisBroker; RedisBroker('redis://127.0.0.1:{port}/0')"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"lite_push._errors.SourceUnavailableError: cannot connect to redis://127.0.0.1:{port}/0: "
        f"ConnectionError: Error 111 connecting to 127.0.0.1:{port}. Connection refused."
    )
    assert "redis.exceptions" not in done.stderr and "During handling" not in done.stderr, done.stderr


def test_a_silent_member_is_evicted_and_its_late_commits_are_ignored(redis_server: RedisServer) -> None:
    h = RedisHarness(redis_server.url, session_timeout=1.0, heartbeat_interval=0.3, rebalance_interval=0.5)
    try:
        queues = h.create_topic("T", 4)
        a = h.consumer("g", client_id="member-a")
        b = h.consumer("g", client_id="member-b")
        revoked_b: list[MessageQueue] = []

        class Listener(RebalanceListener):
            def on_revoked(self, qs):  # type: ignore[no-untyped-def]
                revoked_b.extend(qs)

        b.set_rebalance_listener(Listener())
        a.subscribe("T")
        b.subscribe("T")
        split(a, b, (2, 2))
        assert b.assignment() == frozenset(queues[2:])
        # b stops polling; a takes its queues once b's session ran out
        t0 = time.monotonic()
        poll_until(a, lambda _: len(a.assignment()) == 4, timeout=10.0)
        assert a.assignment() == frozenset(queues)
        assert time.monotonic() - t0 >= 0.5  # not before the session timeout
        b.commit({queues[3]: 99})  # late: fenced off
        assert a.committed(queues[3]) is None
        # b comes back: it sees its loss (on_revoked), rejoins, and the group splits again
        split(a, b, (2, 2), timeout=10.0)
        assert set(revoked_b) == set(queues[2:])
        assert b.assignment() == frozenset(queues[2:])
    finally:
        h.close()


def test_topics_and_queue_selection(harness: RedisHarness) -> None:
    b = harness.broker
    qs = b.create_topic("T", 4)
    assert qs == [MessageQueue("T", b.broker_name, i) for i in range(4)]
    assert b.create_topic("T", 4) == qs  # idempotent
    with pytest.raises(ConfigError, match="queue_count"):
        b.create_topic("T", 5)
    with pytest.raises(ConfigError, match="queue_count"):
        b.create_topic("U", 0)
    with pytest.raises(UnknownTopicError):
        b.send("nope", b"x")
    # another broker on the same namespace sees the topic
    other = RedisBroker(b.client, namespace=b.namespace)
    try:
        assert other.queues("T") == qs
    finally:
        other.close()
    assert [b.send("T", b"x").queue.queue_id for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    for key in ["Aa", "BB", "polygenelubricants", "order-1", "ключ", "emoji-😀"]:
        assert b.send("T", b"x", keys=key).queue.queue_id == lane_of(key, 4)
    assert b.send("T", b"x", keys="Aa", queue_id=3).queue.queue_id == 3
    for bad in (4, -1, "1"):
        with pytest.raises(ValueError, match="queue_id"):
            b.send("T", b"x", queue_id=bad)  # type: ignore[arg-type]
    results = b.send_batch("T", [(b"x", f"k{i}") for i in range(20)])
    assert [r.queue.queue_id for r in results] == [lane_of(f"k{i}", 4) for i in range(20)]


def test_body_rules_and_duplicate_client_ids(redis_server: RedisServer) -> None:
    h = RedisHarness(redis_server.url, max_message_size=10)
    try:
        (q0,) = h.create_topic("T", 1)
        h.send("T", b"x" * 10)
        with pytest.raises(MessageTooLargeError):
            h.send("T", b"x" * 11)
        for bad in ("text", bytearray(b"x"), None):
            with pytest.raises(TypeError):
                h.broker.send("T", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            h.broker.send("T", b"x", properties={"a": 1})  # type: ignore[dict-item]
        with pytest.raises(MessageTooLargeError):
            h.broker.send_batch("T", [b"ok", b"x" * 11])
        assert h.broker.max_offset(q0) == 1
        h.consumer("g", client_id="dup")
        with pytest.raises(ConfigError, match="client_id"):
            h.consumer("g", client_id="dup")
        h.consumer("other", client_id="dup")  # another group: fine
    finally:
        h.close()


def test_a_big_batch_is_split_into_chunks_with_correct_results(
    harness: RedisHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_connection, "SEND_CHUNK", 7)
    q0, q1 = harness.create_topic("T", 2)
    harness.broker.send("T", b"first", queue_id=1)
    results = harness.broker.send_batch("T", [{"body": b"%d" % i, "queue_id": i % 2} for i in range(30)])
    assert [r.offset for r in results if r.queue == q0] == list(range(15))
    assert [r.offset for r in results if r.queue == q1] == list(range(1, 16))
    stored = {m.msg_id: m.body for q in (q0, q1) for m in harness.broker.messages(q)}
    assert [stored[r.msg_id] for r in results] == [b"%d" % i for i in range(30)]


@pytest.fixture
def cluster_harness(redis_cluster: RedisCluster) -> Iterator[RedisHarness]:
    client = redis.RedisCluster.from_url(redis_cluster.url)
    h = RedisHarness(client)
    yield h
    h.close()
    client.close()


@pytest.mark.parametrize("kind", ["server", "cluster"])
def test_a_first_offset_group_misses_nothing_sent_while_it_starts(kind: str, request: pytest.FixtureRequest) -> None:
    # regression: the start position of an empty queue was read in a way a
    # concurrent send could slip past (offset 0 was skipped; seen on a cluster,
    # where the reads are not pipelined)
    harness = request.getfixturevalue("harness" if kind == "server" else "cluster_harness")
    for round_ in range(5):
        topic = f"T{round_}"
        queues = harness.create_topic(topic, 8)
        stop = threading.Event()

        def sender(topic: str = topic, stop: threading.Event = stop) -> None:
            i = 0
            while not stop.is_set():
                harness.broker.send(topic, b"x", queue_id=i % 8)
                i += 1

        c = harness.consumer(f"g{round_}")
        c.subscribe(topic)
        t = threading.Thread(target=sender)
        t.start()
        try:
            got = poll_until(c, lambda got, queues=queues: all(offsets(got).get(q) for q in queues))
        finally:
            stop.set()
            t.join(10)
        firsts = {q.queue_id: offsets(got)[q][0] for q in queues}
        assert firsts == dict.fromkeys(range(8), 0)
        c.close()


def test_a_waiting_poll_is_woken_by_the_send_notification(harness: RedisHarness) -> None:
    # the wait slice is 0.25 s; pub/sub makes a waiting poll read at once
    harness.create_topic("T", 1)
    c = harness.consumer("g")
    c.subscribe("T")
    wait_assigned = poll_until(c, lambda _: bool(c.assignment()))
    assert wait_assigned == [] and c.assignment()
    latencies = []
    poller = threading.get_ident()

    def waiting_in_poll() -> bool:
        """This thread is in the poll's wait between two reads (not reading,
        nor yet to poll)."""
        frame = sys._current_frames().get(poller)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        return "in poll" in stack and "self._event.wait(max(MIN_WAIT" in stack

    for _ in range(5):
        sent_at: list[float] = []

        def send(sent_at: list[float] = sent_at) -> None:
            # send once the poll waits: read at once, it would not need waking
            if wait_until(waiting_in_poll, 10, interval=0.001):
                sent_at.append(time.monotonic())
                harness.broker.send("T", b"x")

        t = threading.Thread(target=send)
        t.start()
        got = c.poll(5.0)
        done = time.monotonic()
        t.join()
        assert sent_at, "the poll was never seen waiting"
        latencies.append(done - sent_at[0])
        assert sum(len(b.messages) for b in got) == 1
    assert sorted(latencies)[2] < 0.2, latencies


def _calls(admin: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` (``INFO commandstats``)."""
    stats = admin.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_read_is_one_round_trip_and_a_read_sent_ahead_is_taken(
    harness: RedisHarness, redis_server: RedisServer
) -> None:
    """A poll's pipeline asks no SCRIPT EXISTS (redis-py's pipelines do,
    once per execute with a script on them), and ``poll_nowait`` takes the
    read that ``prefetch`` sent instead of reading again."""
    queues = harness.create_topic("T", 4)
    for i in range(40):
        harness.send("T", b"%d" % i, queue_id=i % 4)
    c = harness.consumer("g")
    c.subscribe("T")
    got = poll_until(c, lambda _: len(c.assignment()) == 4, max_per_queue=2)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        exists, xrange = _calls(admin, "script|exists"), _calls(admin, "xrange")
        for _ in range(3):
            got += c.poll_nowait(2) or []
        assert _calls(admin, "xrange") - xrange == 3 * 4  # one XRANGE per queue and read
        c.prefetch(2)
        assert _calls(admin, "xrange") - xrange == 4 * 4  # sent: the server runs it now
        got += c.poll_nowait(2) or []
        assert _calls(admin, "xrange") - xrange == 4 * 4  # taken, not read again
        assert _calls(admin, "script|exists") == exists
    finally:
        admin.close()
    got += poll_messages(c, 40 - sum(len(b.messages) for b in got))
    assert offsets(got) == {q: list(range(10)) for q in queues}


@pytest.mark.parametrize("ahead", [False, True])
def test_reads_go_on_after_the_server_lost_its_scripts(
    harness: RedisHarness, redis_server: RedisServer, ahead: bool
) -> None:
    """A server restarted or flushed has none of lite_push's scripts: the
    read that meets NOSCRIPT (sent ahead or not) loads them and reads again,
    delivering each message once."""
    (q,) = harness.create_topic("T", 1)
    for i in range(3):
        harness.send("T", b"%d" % i)
    c = harness.consumer("g")
    c.subscribe("T")
    got = poll_messages(c, 3)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        admin.script_flush()
        for i in range(3, 5):
            harness.send("T", b"%d" % i)
        admin.script_flush()  # sending loaded SEND again
    finally:
        admin.close()
    if ahead:
        c.prefetch(32)
    read = c.poll_nowait(32)
    assert read is not None
    got += read
    assert offsets(got) == {q: [0, 1, 2, 3, 4]}


def test_a_read_sent_ahead_is_dropped_by_close(harness: RedisHarness) -> None:
    """Closing with a read in flight closes its connection; nothing is
    committed or lost: the group's next member reads every message."""
    (q,) = harness.create_topic("T", 1)
    for i in range(5):
        harness.send("T", b"%d" % i)
    c = harness.consumer("g")
    c.subscribe("T")
    poll_until(c, lambda _: len(c.assignment()) == 1)
    c.prefetch(32)
    c.close()
    d = harness.consumer("g")
    d.subscribe("T")
    assert offsets(poll_messages(d, 5)) == {q: [0, 1, 2, 3, 4]}

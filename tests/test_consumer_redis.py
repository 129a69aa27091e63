"""The lite_push runtime on the Redis Streams source, in one process: key
order, no loss, exact commits, parking with the offset map, and two members
sharing the queues."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from helpers import Recorder, assert_offsets_increase, wait_until
from lite_push import ConsumeMode, ConsumerConfig, LitePushConsumer, ManualClock
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis_server import RedisServer
from lite_push.sources.redis_streams import RedisBroker


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False) as s:
        yield s


@pytest.fixture
def broker(server: RedisServer) -> Iterator[RedisBroker]:
    b = RedisBroker(server.url, namespace=f"c-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5)
    yield b
    b.close()


def _consumer(broker, listener, client_id, clock=None, **cfg):
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", **cfg),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id=client_id),
        listener=listener,
        clock=clock,
    )
    consumer.subscribe("T")
    return consumer


@pytest.mark.parametrize("mode", [ConsumeMode.KEY_ORDERLY, ConsumeMode.QUEUE_ORDERLY])
def test_runtime_on_redis_keeps_key_order_and_commits_everything(broker, mode):
    broker.create_topic("T", queue_count=4)
    total = 3000
    broker.send_batch("T", [(b"x", f"k{i % 97}") for i in range(total)])
    rec = Recorder(jitter=0.0002)
    with _consumer(broker, rec, "c1", lanes=16, mode=mode) as consumer:
        assert wait_until(lambda: consumer.stats().consumed == total, timeout=60)
    assert rec.overlaps == []
    assert_offsets_increase(rec.order)
    assert len(set(rec.seen)) == total
    assert sum(broker.committed("g", q).offset for q in broker.queues("T")) == total


def test_parked_key_on_redis_commits_the_offset_map_and_the_next_member_replays_only_it(broker):
    broker.create_topic("T", queue_count=1)
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
    with _consumer(broker, first, "c1", clock, lanes=8, suspend_ms=60_000) as consumer:
        assert wait_until(lambda: len(done) == 1000 - len(poison), timeout=30)
        clock.advance(0.1)  # a commit, not the retry
        q = broker.queues("T")[0]
        assert wait_until(lambda: consumer.stats().committed[q] == 5)
    c = broker.committed("g", q)
    assert c is not None and c.offset == 5 and c.metadata
    second: list[int] = []
    with _consumer(broker, lambda msgs: second.extend(m.queue_offset for m in msgs), "c2", lanes=8):
        assert wait_until(lambda: set(second) == poison, timeout=30)
        time.sleep(0.2)
    assert sorted(second) == sorted(poison)  # the offset map skipped everything that had finished


def test_two_members_share_the_queues_without_breaking_key_order(broker):
    broker.create_topic("T", queue_count=8)
    total = 4000
    broker.send_batch("T", [(b"x", f"k{i % 200}") for i in range(total)])
    rec = Recorder(jitter=0.0003)
    a = _consumer(broker, rec, "c1", lanes=8)
    b = _consumer(broker, rec, "c2", lanes=8)
    with a:
        assert wait_until(lambda: rec.count() > 500, timeout=30)
        with b:  # joins mid-run: queues move from a to b after a drained and committed them
            assert wait_until(lambda: len(set(rec.seen)) == total, timeout=60)
            assert len(b.stats().committed) > 0
    assert rec.overlaps == []
    assert_offsets_increase(rec.order, first_only=True)

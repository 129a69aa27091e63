"""The runtime on a Redis group balanced by message (Balance.MESSAGE):
several consumers in one process, under real concurrency (lane threads,
random listener delays, members joining and leaving at random)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict

from helpers import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lite_push import Balance, ConsumerConfig, ConsumeResult, LitePushConsumer, MessageQueue
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer
from lite_push.testing import TcpProxy


def _broker(redis_server: RedisServer) -> RedisBroker:
    return RedisBroker(
        redis_server.url, namespace=f"mr-{uuid.uuid4().hex[:10]}", session_timeout=3.0, heartbeat_interval=0.3
    )


class Watch:
    """Who is in a listener call of which key now, and every call, checked
    as they happen: a key in two members' listeners at once is recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, str] = {}
        self.overlaps: list[tuple[str, str, str]] = []
        self.calls: list[tuple[str, int, int, str]] = []  # member, queue, offset, key (first call first)
        self.delay = 0.0

    def listener(self, name: str, rng: random.Random):  # type: ignore[no-untyped-def]
        def call(msgs):  # type: ignore[no-untyped-def]
            for m in msgs:
                with self.lock:
                    other = self.active.get(m.keys)
                    if other is not None and other != name:
                        self.overlaps.append((m.keys, other, name))
                    self.active[m.keys] = name
                    self.calls.append((name, m.queue_id, m.queue_offset, m.keys))
                try:
                    time.sleep(rng.random() * self.delay)
                finally:
                    with self.lock:
                        self.active.pop(m.keys, None)
            return None

        return call

    def done(self) -> set[tuple[int, int]]:
        with self.lock:
            return {(q, o) for _, q, o, _ in self.calls}

    def first_order_ok(self) -> bool:
        with self.lock:
            first: dict[tuple[int, int], str] = {}
            order: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for _, q, o, k in self.calls:
                if (q, o) not in first:
                    first[(q, o)] = k
                    order[k].append((q, o))
        return all(v == sorted(v) for v in order.values())


def _member(broker: RedisBroker, watch: Watch, name: str, seed: int, **cfg: object) -> LitePushConsumer:
    cfg.setdefault("lanes", 4)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", poll_timeout=0.02, commit_interval=0.05, revoke_timeout=1.0, **cfg),  # type: ignore[arg-type]
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=Balance.MESSAGE),
        listener=watch.listener(name, random.Random(seed)),
    )
    consumer.subscribe("T")
    return consumer


def test_three_consumers_share_one_queue_in_key_order_and_commit_everything(redis_server: RedisServer) -> None:
    broker = _broker(redis_server)
    try:
        broker.create_topic("T", 1)
        n = 1500
        watch = Watch()
        watch.delay = 0.002
        members = [_member(broker, watch, f"m{i}", i) for i in range(3)]
        for m in members:
            m.start()
        live = broker.queue_key("T", 0, "mg:g:live")
        wait_for(lambda: broker.conn.client.zcard(live) == 3, 30, "three members in the queue")
        broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(n)])
        wait_for(lambda: len(watch.done()) == n, 60, lambda: f"{len(watch.done())} of {n} done")
        for m in members:
            m.shutdown(5)
        assert watch.overlaps == []
        assert watch.first_order_ok()
        assert len({name for name, *_ in watch.calls}) == 3  # every member took part in the one queue
        assert broker.committed("g", MessageQueue("T", broker.namespace, 0)).offset == n  # type: ignore[union-attr]
    finally:
        broker.close()


def test_a_failed_message_is_retried_in_its_member_and_its_key_stays_held(redis_server: RedisServer) -> None:
    """e: no retry topic; the key's later messages wait behind the failed one
    in the same member (no other member runs them meanwhile)."""
    broker = _broker(redis_server)
    try:
        broker.create_topic("T", 1)
        broker.send_batch("T", [(b"x", f"k{i % 5}") for i in range(40)])
        watch = Watch()
        fails = {3: 0}
        lock = threading.Lock()

        def listener(msgs):  # type: ignore[no-untyped-def]
            for m in msgs:
                with watch.lock:
                    watch.calls.append((name_of[threading.get_ident()], m.queue_id, m.queue_offset, m.keys))
                with lock:
                    if m.queue_offset in fails and fails[m.queue_offset] < 2:
                        fails[m.queue_offset] += 1
                        return ConsumeResult.RETRY_LATER
            return None

        name_of: dict[int, str] = defaultdict(lambda: "?")
        members = []
        for _ in range(2):
            c = LitePushConsumer(
                ConsumerConfig(
                    group="g", lanes=2, poll_timeout=0.02, commit_interval=0.05, revoke_timeout=1.0, suspend_ms=100
                ),
                source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=Balance.MESSAGE),
                listener=listener,
            )
            c.subscribe("T")
            members.append(c)
        for c in members:
            c.start()
        subs = broker.conn.client.hgetall(broker.group_key("g", "subs"))
        assert len(subs) == 2 and all(b"%RETRY%" not in v for v in subs.values()), subs  # no retry topic
        wait_for(lambda: len(watch.done()) == 40 and fails[3] == 2, 30, lambda: f"{len(watch.done())} done, {fails}")
        for c in members:
            c.shutdown(5)
        offs = [o for _, _, o, k in watch.calls if k == "k3"]
        assert offs[:3] == [3, 3, 3]  # failed twice, then done, before the key's next message
        assert offs == sorted(offs)
        assert broker.committed("g", MessageQueue("T", broker.namespace, 0)).offset == 40  # type: ignore[union-attr]
    finally:
        broker.close()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    events=st.lists(st.sampled_from(["join", "leave", "cut", "slow", "fast"]), min_size=2, max_size=6),
    queues=st.integers(1, 3),
)
def test_random_joins_leaves_cuts_and_delays_keep_keys_apart_ordered_and_lose_nothing(
    redis_server: RedisServer, seed: int, events: list[str], queues: int
) -> None:
    """2b, c, f: whatever the joins, leaves, cut-offs (a member's traffic to
    Redis stops for good, its sockets open: to the group it is dead, while
    its lanes still run) and listener delays, no key is ever in two members'
    listeners at once, nothing is lost, and first deliveries keep key order."""
    rng = random.Random(seed)
    ns = f"mp-{uuid.uuid4().hex[:10]}"
    admin = RedisBroker(redis_server.url, namespace=ns)
    members: list[tuple[LitePushConsumer, TcpProxy, RedisBroker]] = []
    watch = Watch()

    def join(i: int) -> None:
        proxy = TcpProxy("127.0.0.1", redis_server.port).start()
        b = RedisBroker(proxy.url(), namespace=ns, session_timeout=2.0, heartbeat_interval=0.2)
        c = LitePushConsumer(
            ConsumerConfig(group="g", lanes=4, poll_timeout=0.02, revoke_timeout=1.0),
            source=b.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=Balance.MESSAGE),
            listener=watch.listener(f"m{i}", random.Random(seed + i)),
        )
        c.subscribe("T")
        c.start()
        members.append((c, proxy, b))

    try:
        admin.create_topic("T", queues)
        chunk = 200
        n = chunk * (len(events) + 1)
        watch.delay = 0.006
        join(0)
        serial = 1
        live = [0]
        for ev in events:  # messages keep coming while members come and go
            admin.send_batch("T", [(b"x", f"k{rng.randrange(60)}") for _ in range(chunk)])
            time.sleep(rng.random() * 0.3)
            if ev == "join" and len(live) < 4:
                join(serial)
                live.append(serial)
                serial += 1
            elif ev in ("leave", "cut") and len(live) > 1:
                i = live.pop(rng.randrange(len(live)))
                c, proxy, _ = members[i]
                if ev == "leave":
                    c.shutdown(5)
                else:
                    proxy.partition()
            elif ev == "slow":
                watch.delay = 0.02
            elif ev == "fast":
                watch.delay = 0.002
        admin.send_batch("T", [(b"x", f"k{rng.randrange(60)}") for _ in range(chunk)])
        wait_for(lambda: len(watch.done()) == n, 60, lambda: f"{len(watch.done())} of {n} done")
        assert watch.overlaps == []
        assert watch.first_order_ok()
    finally:
        for c, proxy, b in members:
            proxy.close()
            c.shutdown(2)
            b.close()
        admin.close()


def test_hooks_pause_resume_dead_letters_and_stats_work_as_with_queues(redis_server: RedisServer) -> None:
    """e: the application's hooks hear of every queue; a queue it pauses
    gets nothing until it resumes it; a message failing past
    max_reconsume_times goes to the DLQ with its reason; stats count."""
    broker = _broker(redis_server)
    try:
        broker.create_topic("T", 2)
        assigned: list[MessageQueue] = []
        seen: list[int] = []

        def listener(msgs):  # type: ignore[no-untyped-def]
            for m in msgs:
                seen.append(m.queue_offset)
                if m.keys == "bad":
                    return ConsumeResult.RETRY_LATER
            return None

        c = LitePushConsumer(
            ConsumerConfig(
                group="g", lanes=2, poll_timeout=0.02, revoke_timeout=1.0, suspend_ms=50, max_reconsume_times=1
            ),
            source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, balance=Balance.MESSAGE),
            listener=listener,
            on_assigned=lambda qs: assigned.extend(qs),
        )
        c.subscribe("T")
        c.start()
        wait_for(lambda: len(assigned) == 2, 10, "both queues assigned")
        q0 = MessageQueue("T", broker.namespace, 0)
        c.pause([q0])
        broker.send_batch("T", [{"body": b"x", "keys": f"k{i}", "queue_id": 0} for i in range(5)])
        broker.send_batch("T", [{"body": b"x", "keys": "bad", "queue_id": 1}])
        wait_for(lambda: c.stats().dead_lettered == 1, 20, lambda: f"{c.stats()}")
        assert seen.count(0) == 2  # queue 1's offset 0: the first attempt and one retry; queue 0 is paused
        assert len(broker.messages(MessageQueue("T", broker.namespace, 0))) == 5 and c.stats().consumed == 0
        c.resume([q0])
        wait_for(lambda: c.stats().consumed == 5, 20, lambda: f"{c.stats()}")
        c.shutdown(5)
        dlq = broker.messages(MessageQueue("%DLQ%g", broker.namespace, 0))
        assert len(dlq) == 1 and dlq[0].keys == "bad" and dlq[0].properties.get("DLQ_REASON")
        for q in (q0, MessageQueue("T", broker.namespace, 1)):
            assert broker.committed("g", q).offset == broker.max_offset(q)  # type: ignore[union-attr]
    finally:
        broker.close()

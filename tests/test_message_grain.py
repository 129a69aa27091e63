"""Balance.MESSAGE on Redis, at the source: the contract of message-grain
balancing (README, "Balancing a group"), line by line, with real members
(RedisPullConsumer) on a real redis-server."""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
import redis
from helpers import wait_until

from lite_push import ConfigError, LitePushError, MessageQueue, OffsetAndMetadata
from lite_push.sources import ConsumeFromWhere, MessageModel, RebalanceListener
from lite_push.sources.contract import Balance
from lite_push.sources.redis import RedisBroker, RedisPullConsumer
from lite_push.sources.redis_server import RedisServer

FIRST = ConsumeFromWhere.FIRST_OFFSET


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisBroker]:
    ns = f"mg-{uuid.uuid4().hex[:8]}"
    b = RedisBroker(redis_server.url, namespace=ns, session_timeout=1.0, heartbeat_interval=0.2)
    yield b
    b.close()


def member(broker: RedisBroker, topic: str = "t", group: str = "g", **kw: object) -> RedisPullConsumer:
    c = broker.pull_consumer(group, consume_from=FIRST, balance=Balance.MESSAGE, **kw)  # type: ignore[arg-type]
    c.subscribe(topic)
    return c


class Member:
    """A member and what it holds: delivered, not acknowledged offsets."""

    def __init__(self, consumer: RedisPullConsumer) -> None:
        self.c = consumer
        self.held: dict[MessageQueue, dict[int, str]] = defaultdict(dict)

    def poll(self, n: int = 8) -> list[tuple[MessageQueue, int, str]]:
        got = []
        for b in self.c.poll(0.02, n):
            for m in b.messages:
                self.held[b.queue][m.queue_offset] = m.keys
                got.append((b.queue, m.queue_offset, m.keys))
        return got

    def ack_below(self, q: MessageQueue, offset: int) -> None:
        """Commit ``offset``: everything held below it is done."""
        for o in [o for o in self.held[q] if o < offset]:
            del self.held[q][o]
        self.c.commit({q: OffsetAndMetadata(offset)})

    def ack_all(self) -> None:
        for q, h in self.held.items():
            if h:
                self.ack_below(q, max(h) + 1)

    def keys(self) -> set[str]:
        return {k for h in self.held.values() for k in h.values()}


def send(broker: RedisBroker, n: int, keys: int, topic: str = "t", seed: int = 0) -> dict[str, list[int]]:
    rng = random.Random(seed)
    by_key: dict[str, list[int]] = defaultdict(list)
    items = [(b"x", f"k{rng.randrange(keys)}") for _ in range(n)]
    for (_, k), r in zip(items, broker.send_batch(topic, items), strict=True):
        by_key[k].append(r.offset)
    return by_key


@pytest.mark.parametrize("seed", range(4))
def test_members_share_one_queue_key_held_by_one_member_in_order_nothing_lost(broker: RedisBroker, seed: int) -> None:
    """a, b, d: every member receives from the one queue; a key is never
    delivered to two members while unacknowledged; each key's messages come
    in offset order; everything is delivered once; the group's committed
    position ends past everything."""
    broker.create_topic("t", 1)
    sent = send(broker, 600, 25, seed=seed)
    rng = random.Random(seed)
    members = [Member(member(broker)) for _ in range(3)]
    seen: dict[str, list[int]] = defaultdict(list)
    count = defaultdict(int)
    for _ in range(400):
        for i, m in enumerate(members):
            for _q, o, k in m.poll(rng.randint(1, 12)):
                others = set().union(*(x.keys() for j, x in enumerate(members) if j != i))
                assert k not in others, (k, i)
                seen[k].append(o)
                count[i] += 1
            for q, h in m.held.items():
                if h and rng.random() < 0.5:
                    m.ack_below(q, rng.choice(sorted(h)) + 1)
        if sum(len(v) for v in seen.values()) == 600:
            break
    for m in members:
        m.ack_all()
    assert dict(seen) == dict(sent)
    assert all(count[i] > 0 for i in range(3)), count
    q = MessageQueue("t", broker.namespace, 0)
    assert members[0].c.committed(q) == OffsetAndMetadata(600)
    assert broker.committed("g", q) is None or broker.committed("g", q).offset <= 600


def test_a_held_key_stays_with_its_member_until_acknowledged_then_goes_to_whoever_asks(broker: RedisBroker) -> None:
    """b: while A holds k0, k0's later messages go only to A, in order; when
    A acknowledged them all, k0's next message goes to B."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"1", "k0")])
    a, b = Member(member(broker)), Member(member(broker))
    assert [o for _, o, _ in a.poll()] == [0]
    broker.send_batch("t", [(b"2", "k0"), (b"3", "k1"), (b"4", "k0")])
    assert [(o, k) for _, o, k in b.poll()] == [(2, "k1")]  # k0 is A's
    assert [(o, k) for _, o, k in a.poll()] == [(1, "k0"), (3, "k0")]  # parked for A, in order
    a.ack_below(q, 2)  # 3 still unacknowledged: k0 stays A's
    broker.send_batch("t", [(b"5", "k0")])
    assert b.poll() == []
    assert [o for _, o, _ in a.poll()] == [4]
    a.ack_below(q, 5)
    broker.send_batch("t", [(b"6", "k0")])
    assert [(o, k) for _, o, k in b.poll()] == [(5, "k0")]


def test_a_member_receives_at_most_what_it_asks_for(broker: RedisBroker) -> None:
    """a: a poll delivers at most ``max_per_queue`` per queue; an idle
    member gets the free keys while another holds many."""
    broker.create_topic("t", 2)
    send(broker, 200, 50)
    a, b = Member(member(broker)), Member(member(broker))
    got = a.poll(3)
    assert 0 < len(got) <= 6 and all(sum(1 for x in got if x[0] == q) <= 3 for q in {x[0] for x in got})
    got_b = b.poll(30)
    assert got_b and not {k for _, _, k in got_b} & a.keys()


def test_a_lapsed_session_gives_its_messages_and_keys_to_others_in_order_after_its_fence(broker: RedisBroker) -> None:
    """c: A stops (no poll, no renewal); B gets nothing of A's keys until
    A's session lapsed (A's own fence, ``owned_for``, closed first); then B
    gets A's unacknowledged messages, in offset order per key.  A finds out
    at its next poll: on_revoked, on_assigned again; its late
    acknowledgements change nothing."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", f"k{i % 3}") for i in range(9)])
    calls: list[tuple[str, list[MessageQueue]]] = []

    class Listener(RebalanceListener):
        def on_revoked(self, queues):  # type: ignore[no-untyped-def]
            calls.append(("revoked", list(queues)))

        def on_assigned(self, queues):  # type: ignore[no-untyped-def]
            calls.append(("assigned", list(queues)))

    a_c = member(broker)
    a_c.set_rebalance_listener(Listener())
    a, b = Member(a_c), Member(member(broker))
    assert len(a.poll(5)) == 5  # offsets 0-4: keys k0, k1, k2 held by A
    assert b.poll(20) == []  # every key is A's: the rest is parked for A
    first_b: list[tuple[int, str]] = []

    def b_got_some() -> bool:
        first_b.extend((o, k) for _, o, k in b.poll(20))
        return bool(first_b)

    assert wait_until(b_got_some, timeout=10)
    assert a_c.owned_for()[q] <= 0  # A's fence closed before B got anything
    while len(first_b) < 9:
        got = b.poll(20)
        first_b += [(o, k) for _, o, k in got]
        if not got:
            break
    assert sorted(first_b) == [(o, f"k{o % 3}") for o in range(9)]
    for k in ("k0", "k1", "k2"):
        offs = [o for o, kk in first_b if kk == k]
        assert offs == sorted(offs)
    calls.clear()
    a.ack_below(q, 5)  # fenced: they are B's now
    a.poll()
    a.poll()
    assert ("revoked", [q]) in calls and calls[-1] == ("assigned", [q])
    b.ack_all()
    assert b.c.committed(q) == OffsetAndMetadata(9)


def test_a_join_or_a_leave_moves_no_held_key(broker: RedisBroker) -> None:
    """f: B joining changes nothing of A's keys; A leaving (close) gives its
    unacknowledged messages to the others at once, in order."""
    broker.create_topic("t", 1)
    broker.send_batch("t", [(b"x", "k0"), (b"x", "k1"), (b"x", "k0")])
    a = Member(member(broker))
    assert [o for _, o, _ in a.poll(2)] == [0, 1]
    b = Member(member(broker))
    assert b.poll() == []  # k0 and k1 are A's; offset 2 (k0) is parked for A
    assert [o for _, o, _ in a.poll()] == [2]
    a.c.close()
    assert [(o, k) for _, o, k in b.poll()] == [(0, "k0"), (1, "k1"), (2, "k0")]


def test_a_restart_of_the_whole_group_redelivers_only_unacknowledged_messages(broker: RedisBroker) -> None:
    """d: acknowledgements above the committed position live on the server."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", f"k{i}") for i in range(10)])
    a = Member(member(broker))
    assert len(a.poll(10)) == 10
    a.c.commit({q: OffsetAndMetadata(3, '{"v":1,"b":3,"e":8,"r":[1,2,1,1]}')})  # 0-2 done; 4, 5, 7 finished
    assert a.c.committed(q) == OffsetAndMetadata(3)
    a.c.close()
    b = Member(member(broker))
    assert sorted(o for _, o, _ in b.poll(20)) == [3, 6, 8, 9]


def test_tag_filter_skips_and_the_committed_position_passes_skipped_messages(broker: RedisBroker) -> None:
    """e: a tag filter works as in queue mode."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [{"body": b"x", "keys": f"k{i}", "tags": "A" if i % 2 else "B"} for i in range(6)])
    c = broker.pull_consumer("g", consume_from=FIRST, balance=Balance.MESSAGE)
    c.subscribe("t", "A")
    m = Member(c)
    assert [o for _, o, _ in m.poll(10)] == [1, 3, 5]
    m.ack_all()
    assert c.committed(q) == OffsetAndMetadata(6)


def test_the_group_records_its_balance_and_refuses_the_other(broker: RedisBroker) -> None:
    """1: a member that asks for the other balance than the live members
    gets a ConfigError naming both; once they left, the group may change."""
    broker.create_topic("t", 1)
    queue_member = broker.pull_consumer("g", consume_from=FIRST)
    queue_member.subscribe("t")
    msg = broker.pull_consumer("g", consume_from=FIRST, balance=Balance.MESSAGE)
    with pytest.raises(ConfigError, match=r"balance.*QUEUE.*MESSAGE"):
        msg.subscribe("t")
    queue_member.close()
    m = member(broker)
    with pytest.raises(ConfigError, match=r"balance.*MESSAGE.*QUEUE"):
        broker.pull_consumer("g", consume_from=FIRST).subscribe("t")
    m.close()


def test_bad_arguments_are_refused(broker: RedisBroker) -> None:
    with pytest.raises(ConfigError, match="balance"):
        broker.pull_consumer("g", balance="MESSAGE")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="balance.*CLUSTERING"):
        broker.pull_consumer("g", balance=Balance.MESSAGE, message_model=MessageModel.BROADCASTING)
    broker.create_topic("t", 1)
    c = member(broker)
    assert c.balance is Balance.MESSAGE
    c.poll(0.01)
    with pytest.raises(LitePushError, match="seek"):
        c.seek(MessageQueue("t", broker.namespace, 0), 0)


def test_malformed_entries_go_to_the_dlq_and_are_acknowledged(broker: RedisBroker) -> None:
    """e: a malformed entry goes to the dead-letter queue with the reason."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", "k0")])
    client = broker.conn.client
    off = int(client.incr(broker.queue_key("t", 0, "seq"))) - 1
    client.xadd(broker.queue_key("t", 0, "log"), {b"b": b"x", b"m": b"{bad", b"s": b"1"}, id=f"{off + 1}-0")
    broker.send_batch("t", [(b"x", "k1")])
    m = Member(member(broker))
    assert [o for _, o, _ in m.poll(10)] == [0, 2]
    assert len(broker.messages(MessageQueue("%DLQ%g", broker.namespace, 0))) == 1
    m.ack_below(q, 3)
    assert m.c.committed(q) == OffsetAndMetadata(3)


def test_on_a_redis_cluster(redis_cluster) -> None:  # type: ignore[no-untyped-def]
    """g: every script touches one slot."""
    client = redis.RedisCluster.from_url(redis_cluster.url)
    b = RedisBroker(client, namespace=f"mgc-{uuid.uuid4().hex[:6]}", session_timeout=2.0, heartbeat_interval=0.3)
    try:
        b.create_topic("t", 3)
        sent = send(b, 150, 10)
        ms = [Member(member(b)) for _ in range(2)]
        seen: dict[str, list[int]] = defaultdict(list)
        deadline = time.monotonic() + 30
        while sum(len(v) for v in seen.values()) < 150 and time.monotonic() < deadline:
            for m in ms:
                for _, o, k in m.poll(10):
                    seen[k].append(o)
                m.ack_all()
        by_key = {k: sorted(v) for k, v in seen.items()}
        assert by_key == {k: sorted(v) for k, v in sent.items()}
        assert all(seen[k] == sorted(seen[k]) for k in seen)  # one key, one queue: in offset order
    finally:
        b.close()
        client.close()


def test_a_new_group_from_the_last_offset_skips_what_is_stored_and_says_so(
    broker: RedisBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """e: consume_from and the new-group warning work as in queue mode."""
    broker.create_topic("t", 1)
    broker.send_batch("t", [(b"old", f"k{i}") for i in range(5)])
    c = broker.pull_consumer("g", balance=Balance.MESSAGE)  # LAST_OFFSET
    with caplog.at_level("WARNING"):
        c.subscribe("t")
        assert c.poll(0.01) == []
    assert any("g" in r.getMessage() and "5" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    broker.send_batch("t", [(b"new", "k0")])
    m = Member(c)
    assert [(o, k) for _, o, k in m.poll()] == [(5, "k0")]
    late = Member(broker.pull_consumer("g", balance=Balance.MESSAGE))  # a later member agrees on the start
    late.c.subscribe("t")
    broker.send_batch("t", [(b"new", "k9")])
    assert [(o, k) for _, o, k in late.poll()] == [(6, "k9")]


def test_a_lost_dispatch_reply_is_asked_for_again_not_left_stuck(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll whose dispatch ran on the server but whose reply was lost (the
    connection dropped): the next poll gets those messages (RESYNC), so they
    are neither lost nor held by this member for ever."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    m = Member(member(broker))
    assert m.poll() == []  # joined
    broker.send_batch("t", [(b"x", f"k{i}") for i in range(5)])
    real = redis.client.Pipeline.execute
    lost = []

    def execute(self, *a, **k):  # type: ignore[no-untyped-def]
        scripts = any(args[0] == "EVALSHA" for args, _ in self.command_stack)  # the poll's, not the read ahead
        res = real(self, *a, **k)
        if not lost and scripts:
            lost.append(res)
            raise redis.ConnectionError("reply lost")
        return res

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    assert m.poll() == []  # the reply was lost: the poll returns nothing
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    assert lost
    assert sorted(o for _, o, _ in m.poll()) == [0, 1, 2, 3, 4]
    m.ack_all()
    assert m.c.committed(q) == OffsetAndMetadata(5)


def test_a_malformed_entry_whose_dead_letter_fails_stays_unacknowledged_until_stored(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    client = broker.conn.client
    off = int(client.incr(broker.queue_key("t", 0, "seq"))) - 1
    client.xadd(broker.queue_key("t", 0, "log"), {b"b": b"x", b"m": b"{bad", b"s": b"1"}, id=f"{off + 1}-0")
    broker.send_batch("t", [(b"x", "k1")])
    real = broker.retries.store_dead_letters
    monkeypatch.setattr(broker.retries, "store_dead_letters", lambda *a: [redis.ConnectionError("down")])
    m = Member(member(broker))
    assert [o for _, o, _ in m.poll()] == [1]  # the good one reaches the runtime all the same
    m.ack_below(q, 2)
    assert m.c.committed(q) == OffsetAndMetadata(0)  # the malformed one is not acknowledged
    monkeypatch.setattr(broker.retries, "store_dead_letters", real)
    m.poll()  # stored now
    assert len(broker.messages(MessageQueue("%DLQ%g", broker.namespace, 0))) == 1
    m.ack_below(q, 2)
    assert m.c.committed(q) == OffsetAndMetadata(2)


def test_a_poll_failing_after_its_dispatch_keeps_the_batches_and_acknowledges_none_of_them(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch delivered, then the poll failed (the registry heartbeat
    after it lost Redis): the batches come with the next poll, and no
    commit before that acknowledges them (they never reached a listener)."""
    from lite_push.sources.redis.membership import Membership

    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    m = Member(member(broker))
    assert m.poll() == []  # joined
    broker.send_batch("t", [(b"x", f"k{i}") for i in range(4)])
    real = Membership.heartbeat

    def heartbeat(self, *a, **k):  # type: ignore[no-untyped-def]
        raise redis.ConnectionError("lost after the dispatch")

    monkeypatch.setattr(Membership, "heartbeat", heartbeat)
    time.sleep(0.25)  # the registry heartbeat is due
    assert m.poll() == []
    monkeypatch.setattr(Membership, "heartbeat", real)
    m.c.commit({q: OffsetAndMetadata(10)})  # a commit point past them: still not theirs to acknowledge
    assert m.c.committed(q) == OffsetAndMetadata(0)
    assert sorted(o for _, o, _ in m.poll()) == [0, 1, 2, 3]
    m.ack_all()
    assert m.c.committed(q) == OffsetAndMetadata(4)

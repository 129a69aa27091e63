"""Balance.MESSAGE on Redis: how the server keeps what it delivered
(``grain_scripts``: one record per DISPATCH, holds only while two members or
more are live, acknowledgements by record) and how a member reads ahead
(``grain_ahead``), with real members on a real redis-server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from test_message_grain import Member, member

from lite_push import MessageQueue, OffsetAndMetadata
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis.grain_ahead import Ahead
from lite_push.sources.redis.message_grain import grain_keys
from lite_push.sources.redis_server import RedisServer


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisBroker]:
    ns = f"mr-{uuid.uuid4().hex[:8]}"
    b = RedisBroker(redis_server.url, namespace=ns, session_timeout=1.0, heartbeat_interval=0.2)
    yield b
    b.close()


def holds(broker: RedisBroker, q: MessageQueue) -> dict[str, tuple[str, int]] | None:
    """The queue's holds as the server keeps them, key -> (client id,
    count) (None: not kept)."""
    raw = broker.conn.client.hgetall(grain_keys(broker.conn, "g", q)[4])
    if not raw:
        return None
    out = {}
    for k, v in raw.items():
        if k != b"\xff":
            token, _, count = v.decode().partition("\t")
            out[k.decode()] = (token.rpartition("/")[0], int(count))
    return out


def test_a_lone_member_keeps_no_holds_a_second_one_finds_them_rebuilt(broker: RedisBroker) -> None:
    """Alone, a member holds every key: nothing is written per key.  When a
    second member comes, the holds are rebuilt from the records (A's
    unacknowledged messages, counted per key), so B gets none of A's keys;
    when B leaves, A's next poll drops them again."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", k) for k in ("k0", "k1", "k0", "k2")])
    a = Member(member(broker))
    assert [o for _, o, _ in a.poll(2)] == [0, 1]
    assert [o for _, o, _ in a.poll(1)] == [2]  # a second record
    assert holds(broker, q) is None
    b = Member(member(broker))
    assert [(o, k) for _, o, k in b.poll()] == [(3, "k2")]  # k0 and k1 are A's
    ida, idb = a.c.client_id, b.c.client_id
    assert holds(broker, q) == {"k0": (ida, 2), "k1": (ida, 1), "k2": (idb, 1)}
    a.ack_below(q, 2)  # 0 and 1: k1 is free, k0 still held once (offset 2)
    assert holds(broker, q) == {"k0": (ida, 1), "k2": (idb, 1)}
    broker.send_batch("t", [(b"x", "k0"), (b"x", "k1")])
    assert [(o, k) for _, o, k in b.poll()] == [(5, "k1")]
    assert [(o, k) for _, o, k in a.poll()] == [(4, "k0")]
    b.c.close()
    a.poll()  # alone again: the holds go
    assert holds(broker, q) is None
    a.ack_all()
    assert a.c.committed(q) == OffsetAndMetadata(6)


def test_an_acknowledgement_sent_again_lowers_no_hold_twice(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose reply was lost is sent again; the record it named is
    gone by then, and its key's hold is not lowered a second time: A's
    other message of that key keeps it A's until acknowledged."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    a, b = Member(member(broker)), Member(member(broker))
    assert a.poll() == [] and b.poll() == []  # both joined: holds are kept
    broker.send_batch("t", [(b"x", "k0")])
    assert [o for _, o, _ in a.poll()] == [0]
    broker.send_batch("t", [(b"x", "k0")])
    assert [o for _, o, _ in a.poll()] == [1]  # k0 held twice by A, in two records
    real = redis.client.Pipeline.execute
    lost: list[object] = []

    def execute(self, *args, **kw):  # type: ignore[no-untyped-def]
        res = real(self, *args, **kw)
        if not lost:
            lost.append(res)
            raise redis.ConnectionError("reply lost")
        return res

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    with pytest.raises(redis.ConnectionError):
        a.c.commit({q: OffsetAndMetadata(1)})
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    assert lost and lost[0] == [[1, 1, 1]]  # it did acknowledge offset 0
    a.c.commit({q: OffsetAndMetadata(1)})  # sent again
    a.c.commit({q: OffsetAndMetadata(1)})
    broker.send_batch("t", [(b"x", "k0")])
    assert b.poll() == []  # offset 1 is still A's: k0 too
    assert [o for _, o, _ in a.poll()] == [2]
    a.ack_below(q, 3)
    broker.send_batch("t", [(b"x", "k0")])
    assert [o for _, o, _ in b.poll()] == [3]


def test_a_proposal_that_leaves_a_gap_after_the_cursor_is_not_used(broker: RedisBroker) -> None:
    """DISPATCH takes a member's proposal only if it starts at or before the
    group's cursor: one starting after it would skip what lies between."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", f"k{i}") for i in range(4)])
    conn = broker.conn
    keys = grain_keys(conn, "g", q)
    join = conn.run(conn.grain_dispatch, keys, ["m/1", 10_000, 0, 100, "1", 0, "0"])
    assert join[2] == b"0"
    gap = conn.run(conn.grain_dispatch, keys, ["m/1", 10_000, 8, 100, "0", 0, "2", "2", "kk2", "3", "kk3"])
    assert (gap[2], gap[3], gap[4]) == (b"0", b"", [])  # nothing delivered, the cursor unmoved
    whole = ["0", "kk0", "1", "kk1", "2", "kk2", "3", "kk3"]
    ok = conn.run(conn.grain_dispatch, keys, ["m/1", 10_000, 3, 100, "0", 0, "0", *whole])
    assert (ok[2], ok[3]) == (b"3", b"0-2")  # indexes 0 to 2
    again = conn.run(conn.grain_dispatch, keys, ["m/1", 10_000, 8, 100, "0", 0, "0", *whole])  # starts behind: fine
    assert (again[2], again[3]) == (b"4", b"3-3")  # only what lies past the cursor


def test_scripts_flushed_between_polls_lose_and_repeat_nothing(broker: RedisBroker) -> None:
    """The poll's DISPATCHes go as bare EVALSHAs: after SCRIPT FLUSH the
    poll loads every script and runs again."""
    broker.create_topic("t", 1)
    q = MessageQueue("t", broker.namespace, 0)
    broker.send_batch("t", [(b"x", f"k{i}") for i in range(6)])
    a = Member(member(broker))
    assert [o for _, o, _ in a.poll(3)] == [0, 1, 2]
    broker.conn.client.script_flush()
    assert [o for _, o, _ in a.poll(3)] == [3, 4, 5]
    a.ack_all()
    assert a.c.committed(q) == OffsetAndMetadata(6)


# -- the read-ahead ----------------------------------------------------------------


def entries(*offsets: int) -> list[tuple[bytes, list[bytes]]]:
    meta = b'{"bt":1,"k":"k"}'
    return [(f"{o + 1}-0".encode(), [b"b", b"x", b"m", meta, b"s", b"1"]) for o in offsets]


Q = MessageQueue("t", "ns", 0)


def test_the_read_ahead_drops_what_the_cursor_passed_and_reads_on_after_it() -> None:
    ahead = Ahead("0")
    assert ahead.read_from() == "0-0"
    ahead.add("ns", Q, entries(0, 1, 2, 3), None, "0-0")
    items, args = ahead.proposal(2)
    assert args == ["0", "0", "kk", "1", "kk"] and len(items) == 2
    ahead.seen("2")  # offsets 0 and 1 looked at
    assert [it[1] for it in ahead.items] == ["2", "3"] and ahead.after == "2"
    ahead.seen("9")  # others went further than this member read
    assert ahead.items == [] and ahead.read_from() == "9-0"
    ahead.add("ns", Q, entries(4, 5, 9, 10), None, "4-0")  # a read sent before the jump: only what lies past it
    assert [it[1] for it in ahead.items] == ["9", "10"]


def test_the_read_ahead_starts_over_behind_a_reset_and_drops_a_read_from_before() -> None:
    ahead = Ahead("5")
    ahead.add("ns", Q, entries(5, 6), None, "5-0")
    start = ahead.read_from()
    ahead.seen("2")  # the group was reset to offset 2
    assert ahead.items == [] and ahead.after == "2" and ahead.read_from() == "2-0"
    ahead.add("ns", Q, entries(7, 8), None, start)  # read from before the reset, past where it now starts: dropped
    assert ahead.items == []


def test_the_read_ahead_marks_tags_skipped_and_foreign_ids_unrecorded() -> None:
    ahead = Ahead("0")
    tagged = [(b"1-0", [b"b", b"x", b"m", b'{"bt":1,"k":"a","t":"A"}', b"s", b"1"])]
    other = [(b"2-0", [b"b", b"x", b"m", b'{"bt":1,"k":"b","t":"B"}', b"s", b"1"])]
    foreign = [(b"2-1", [b"b", b"x", b"m", b'{"bt":1}', b"s", b"1"])]
    broken = [(b"3-0", [b"b", b"x", b"m", b"{bad", b"s", b"1"])]
    ahead.add("ns", Q, tagged + other + foreign + broken, frozenset({"A"}), "0-0")
    assert [(it[0], it[1], it[2]) for it in ahead.items] == [
        ((1, 0), "0", "ka"),
        ((2, 0), "1", "s"),
        ((2, 1), "2-1", "x"),
        ((3, 0), "2", "k"),
    ]
    assert ahead.items[2][4] is not None and ahead.items[3][4] is not None  # dead letters, with their reasons

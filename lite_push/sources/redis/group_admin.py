"""A consumer group on Redis, read and changed from outside it
(``lite-push group describe`` / ``reset-offsets``).

What it reads is the group's state as the package docstring lays it out:
the members zset (client id -> session expiry, server ms) and the subs hash
(client id -> its topics), the owner keys, the offsets hash; for a group
balanced by message, each queue's message-grain state
(:mod:`.grain_scripts`): its committed position, the live sessions there,
and the messages delivered and not acknowledged (the in-flight count).

A member's last heartbeat is the server's time its heartbeat recorded in
the group's beats hash (client id -> server ms), read against the server's
time now.  A member of an earlier lite_push records none: its age is read
from its session expiry (the server's time at its heartbeat plus its
session timeout), taking that timeout to be this broker's
(``RedisBroker.session_timeout``; ``lite-push consume`` uses the default,
30 s).

A reset is one script on the group's slot (:data:`RESET`): it stores the
offsets only when no member's session is live, so a member cannot join
between the check and the write.  For a group balanced by message each
queue's message-grain state is then reset too (:data:`GRAIN_RESET`, on the
queue's slot): its cursor and position move to the new offset, and what
was delivered, parked or held there is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..._errors import GroupActiveError
from ..._types import MessageQueue
from ..group_admin import GroupAdmin, GroupMember
from .connection import Connection, qfield
from .membership import owner_key
from .message_grain import grain_keys, grain_position
from .topics import TopicCatalog

__all__ = ["GRAIN_RESET", "RESET", "RedisGroupAdmin"]

_NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

#: Store committed offsets unless a member's session lives.  KEYS: members
#: zset, offsets hash.  ARGV: field, value, ...  Returns the live members'
#: client ids (nothing was stored), or an empty list (all were stored).
RESET = (
    _NOW
    + """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
if #live > 0 then return live end
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return {}
"""
)

#: A message-grain queue's state starts over at an offset.  KEYS: the
#: queue's grain keys (log, cur, out, outz, hold, live, park).  ARGV: offset.
GRAIN_RESET = """
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
return 1
"""


class RedisGroupAdmin(GroupAdmin):
    """Group ``group`` on the Redis of ``conn`` (``topics``: the broker's
    topic catalog; ``session_timeout``: the members' session timeout as
    this broker knows it, for their last heartbeat)."""

    def __init__(self, group: str, conn: Connection, topics: TopicCatalog, session_timeout: float) -> None:
        super().__init__(group)
        self._conn = conn
        self._topics = topics
        self._session_timeout = session_timeout
        self._reset = conn.client.register_script(RESET)
        self._grain_reset = conn.client.register_script(GRAIN_RESET)

    # -- reading -------------------------------------------------------------------

    def _key(self, what: str) -> str:
        return self._conn.group_key(self.group, what)

    def _now_ms(self) -> int:
        seconds, micros = self._conn.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def by_message(self) -> bool:
        """Whether the group is balanced by message (``Balance.MESSAGE``)."""
        return bool(self._conn.client.get(self._key("balance")) == b"MESSAGE")

    def _live(self) -> tuple[list[tuple[str, float]], dict[str, list[str]]]:
        """The live members with the seconds since their last heartbeat,
        and every member's subscriptions."""
        now = self._now_ms()
        client = self._conn.client
        scored = client.zrangebyscore(self._key("members"), f"({now}", "+inf", withscores=True)
        subs = {k.decode(): orjson.loads(v) for k, v in client.hgetall(self._key("subs")).items()}
        beats = {k.decode(): int(v) for k, v in client.hgetall(self._key("beats")).items()}
        live = []
        for m, expiry in scored:
            cid = m.decode()
            beat = beats.get(cid)
            # (no beat recorded: a member of an earlier lite_push, see the module docstring)
            age = (now - beat) / 1000.0 if beat is not None else self._session_timeout - (expiry - now) / 1000.0
            live.append((cid, max(0.0, age)))
        return live, subs

    def members(self) -> list[GroupMember]:
        live, subs = self._live()
        return sorted(
            (GroupMember(cid, tuple(sorted(subs.get(cid, ()))), age) for cid, age in live),
            key=lambda m: m.client_id,
        )

    def topics(self) -> list[str]:
        live, subs = self._live()
        names = {t for cid, _ in live for t in subs.get(cid, ())}
        for f in self._conn.client.hkeys(self._key("offsets")):
            names.add(f.decode().rpartition("#")[0])
        return sorted(names)

    def known(self) -> bool:
        """Whether any key of the group's state exists: its members, their
        subscriptions, its committed offsets, its balance (a group balanced
        by message keeps its positions per queue)."""
        keys = [self._key(what) for what in ("members", "subs", "offsets", "balance")]
        return bool(self._conn.client.exists(*keys))

    def committed(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        if not queues:
            return {}
        if self.by_message():
            found = {q: grain_position(self._conn, self.group, q) for q in queues}
            return {q: om.offset for q, om in found.items() if om is not None}
        raw = self._conn.client.hmget(self._key("offsets"), [qfield(q) for q in queues])
        return {q: int(orjson.loads(r)[0]) for q, r in zip(queues, raw, strict=True) if r is not None}

    def owners(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[str, ...]]:
        if not queues:
            return {}
        if self.by_message():
            now = self._now_ms()
            out = {}
            for q in queues:
                live_key = grain_keys(self._conn, self.group, q)[5]
                tokens = self._conn.client.zrangebyscore(live_key, f"({now}", "+inf")
                cids = sorted({t.decode().rpartition("/")[0] for t in tokens})
                if cids:
                    out[q] = tuple(cids)
            return out
        raw = self._conn.client.mget([owner_key(self._conn, self.group, q) for q in queues])
        return {q: (r.decode(),) for q, r in zip(queues, raw, strict=True) if r is not None}

    def in_flight(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int] | None:
        """A group balanced by message: per queue, the messages delivered to
        a member and not acknowledged (the server keeps them); ``None`` for
        a group balanced by queue (only its members know)."""
        if not self.by_message():
            return None
        conn = self._conn
        return {q: int(conn.run(conn.grain_in_flight, grain_keys(conn, self.group, q), [])) for q in queues}

    def offsets_at(self, queues: Sequence[MessageQueue], timestamp: int) -> dict[MessageQueue, int]:
        out = {}
        for q in queues:
            lo, hi = self._topics.stored_range(q)
            out[q] = self._topics.first_stored_at(q, lo, hi, timestamp)
        return out

    # -- changing ------------------------------------------------------------------

    def reset(self, offsets: Mapping[MessageQueue, int]) -> None:
        if not offsets:
            return
        message = self.by_message()
        args: list[Any] = []
        for q, offset in offsets.items():
            args += (qfield(q), orjson.dumps([int(offset), ""]))
        live = self._conn.run(self._reset, [self._key("members"), self._key("offsets")], args)
        if live:
            raise GroupActiveError(self.group, sorted(m.decode() for m in live))
        if message:
            for q, offset in offsets.items():
                self._conn.run(self._grain_reset, grain_keys(self._conn, self.group, q), [int(offset)])

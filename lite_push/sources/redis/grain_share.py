"""A message-grain member's part in one queue: its token, its session, its
read-ahead, and the records the server keeps of what it delivered to the
member (see :mod:`.grain_scripts`): which offsets of each record are not
acknowledged yet, so that a commit names each record once, whole (``*``)
or by the offsets it acknowledges."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, cast

from ..._state.offset_map import FinishedOffsets
from ..._types import MessageExt, MessageQueue
from .codec import decode, offset_of
from .gaps import GAP_LIMIT, take_within
from .grain_ahead import Ahead, Item, cursor_pos

__all__ = ["MIN_EXTRA", "SCAN_EXTRA", "Share", "text"]

#: Entries a proposal carries beyond those wanted, at least (some may be
#: parked, skipped by tag, or already passed by other members).
MIN_EXTRA = 16
#: Entries a read ahead takes beyond ``4 * want`` (and about the most a
#: proposal carries past ``3 * want``).
SCAN_EXTRA = 64

#: A malformed entry's stand-in and the reason it is no message.
Bad = tuple[MessageExt, str]


def text(v: Any) -> str:
    """A reply's string (bytes decoded)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def taken_items(proposed: list[Item], indexes: bytes) -> list[Item]:
    """The proposed items a DISPATCH delivered (``indexes``: runs
    ``<first>-<last>`` from 0, joined by ",")."""
    if not indexes:
        return []
    out: list[Item] = []
    for run in indexes.split(b","):
        first, _, last = run.partition(b"-")
        out += proposed[int(first) : int(last) + 1]
    return out


class Share:
    """This member's part in one queue (see the module docstring)."""

    __slots__ = (
        "token",
        "keys",
        "renewed",
        "base",
        "ahead",
        "extra",
        "proposed",
        "records",
        "rid_of",
        "top",
        "bad",
        "unstored",
    )

    def __init__(self, token: str, keys: list[str], renewed: float, base: int, cursor: str) -> None:
        self.token = token
        self.keys = keys
        #: When the session was last renewed (``time.monotonic``, when sent).
        self.renewed = renewed
        #: The group's committed position as last seen.
        self.base = base
        self.ahead = Ahead(cursor)
        #: How many entries past ``want`` the next proposal carries.
        self.extra = MIN_EXTRA
        #: What the DISPATCH in flight proposed.
        self.proposed: list[Item] = []
        #: record id -> its offsets not acknowledged, increasing (a dict: in
        #: order, each removed in O(1)).
        self.records: dict[int, dict[int, None]] = {}
        #: offset -> its record id: every offset delivered, not acknowledged.
        self.rid_of: dict[int, int] = {}
        #: The highest offset ever recorded (a bound of those delivered).
        self.top = -1
        #: Offsets of malformed entries, dead-lettered, never handed to the runtime.
        self.bad: set[int] = set()
        #: Offsets of malformed entries whose dead letter is not stored yet
        #: (not to be acknowledged until it is).
        self.unstored: set[int] = set()

    # -- a DISPATCH's reply -------------------------------------------------------------

    def lapsed(self, reply: Sequence[Any]) -> None:
        """A DISPATCH found the session lapsed: what it proposed is void."""
        self.proposed = []
        self.base = int(reply[1])
        self.ahead.seen(text(reply[2]))

    def dispatched(self, namespace: str, q: MessageQueue, reply: Sequence[Any]) -> tuple[list[MessageExt], list[Bad]]:
        """A DISPATCH's reply ``{1, base, cursor, indexes, parked entries}``:
        the group's cursor and position recorded, the next proposal sized,
        and what was delivered (see :meth:`delivered`)."""
        proposed, self.proposed = self.proposed, []
        self.base = int(reply[1])
        taken = taken_items(proposed, reply[3])
        self._size(proposed, len(taken) + len(reply[4]), text(reply[2]))
        if not taken and not reply[4]:
            return [], []
        return self.delivered(namespace, q, None, reply[4], taken)

    def _size(self, proposed: list[Item], delivered: int, cursor: str) -> None:
        """Record the group's cursor and size the next proposal: larger
        when this one ran out before ``want`` (others had passed its start,
        or parked or skipped its entries), smaller while it had entries to
        spare."""
        want = len(proposed) - self.extra
        self.ahead.seen(cursor)
        if proposed and cursor_pos(cursor) >= proposed[-1][0]:
            if delivered < want:
                self.extra = min(2 * self.extra, 3 * max(want, 1) + SCAN_EXTRA)
        else:
            self.extra = max(MIN_EXTRA, self.extra - self.extra // 8)

    def delivered(
        self, namespace: str, q: MessageQueue, rid: int | None, entries: Sequence[Any], taken: Sequence[Item]
    ) -> tuple[list[MessageExt], list[Bad]]:
        """What one DISPATCH (or, ``rid`` given, one record of a RESYNC)
        delivered: the ``entries`` it read (parked messages), then the
        proposed items ``taken``, as messages and malformed entries,
        recorded."""
        qbad: list[Bad] = []
        msgs = decode(namespace, q, entries, qbad) if entries else []
        offsets = [offset_of(e[0]) for e in entries]
        if taken:
            got = [it[3] for it in taken]
            first, last = taken[0][0][0], taken[-1][0][0]
            if None in got:  # entries that are no message among them
                qbad += [it[4] for it in taken if it[4] is not None]
                msgs += [m for m in got if m is not None]
                offsets += [it[0][0] - 1 for it in taken if it[2] != "x"]  # an "x" entry is never recorded
            else:  # messages only: ids "<n>-0", increasing
                msgs += cast(list[MessageExt], got)
                offsets += range(first - 1, last) if last - first == len(taken) - 1 else [it[0][0] - 1 for it in taken]
        if offsets:
            self.record(offsets[0] if rid is None else rid, offsets)
            if qbad:
                self.unstored.update(b[0].queue_offset for b in qbad if b[0].queue_offset in self.rid_of)
        return msgs, qbad

    # -- the records -----------------------------------------------------------------------

    def record(self, rid: int, offsets: list[int]) -> None:
        """The server recorded ``offsets`` (increasing) under ``rid`` for
        this member."""
        self.records[rid] = dict.fromkeys(offsets)
        self.rid_of.update(dict.fromkeys(offsets, rid))
        if offsets[-1] > self.top:
            self.top = offsets[-1]

    def ack_calls(
        self, top: int, finished: FinishedOffsets | None, excluded: AbstractSet[int], per_call: int
    ) -> list[tuple[list[str], list[int]]]:
        """ACK calls for this member's offsets below ``top`` or in
        ``finished``, but not in ``excluded``, each naming at most
        ``per_call`` records: its arguments after the token (per record its
        id, then ``*`` or the offsets) and the offsets it acknowledges."""
        calls: list[tuple[list[str], list[int]]] = []
        args: list[str] = []
        offs: list[int] = []
        named = 0
        for rid, rec in self.records.items():
            if next(reversed(rec)) < top and (not excluded or excluded.isdisjoint(rec)):
                mine = list(rec)  # the whole record (its offsets increase: the last is the highest)
            else:
                mine = [o for o in rec if (o < top or (finished is not None and o in finished)) and o not in excluded]
                if not mine:
                    continue
            args.append(str(rid))
            args.append("*" if len(mine) == len(rec) else ",".join(map(str, mine)))
            offs += mine
            named += 1
            if named == per_call:
                calls.append((args, offs))
                args, offs, named = [], [], 0
        if named:
            calls.append((args, offs))
        return calls

    def acked(self, acks: Iterable[int]) -> None:
        """Forget ``acks`` (acknowledged, or refused: the session lapsed)."""
        records, rid_of = self.records, self.rid_of
        for o in acks:
            rid = rid_of.pop(o, None)
            if rid is None:
                continue
            rest = records[rid]
            del rest[o]
            if not rest:
                del records[rid]
            self.bad.discard(o)

    def deliverable(self, messages: Sequence[MessageExt]) -> int:
        """How many of ``messages`` (delivered, in offset order) the runtime
        may be handed now: all, unless their offsets lie further than
        :data:`~.gaps.GAP_LIMIT` from those it has unacknowledged."""
        delivered = self.rid_of
        if not messages or not delivered:
            return len(messages)
        lo, hi = messages[0].queue_offset, messages[-1].queue_offset
        # bounds of what is delivered: a record's id is at most its offsets,
        # ``top`` at least the highest ever recorded
        if max(hi, self.top) - min(lo, min(self.records)) <= GAP_LIMIT:
            return len(messages)
        offs = [m.queue_offset for m in messages]
        mine = set(offs)
        pending = [o for o in delivered if o not in mine and o not in self.bad and o not in self.unstored]
        return take_within(offs, min(pending, default=None), max(pending, default=None))

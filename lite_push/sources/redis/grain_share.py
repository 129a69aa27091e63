"""A message-grain member's part in one queue: its token, its session, its
read-ahead, and the records the server keeps of what it delivered to the
member (see :mod:`.grain_scripts`): which offsets of each record are not
acknowledged yet, so that a commit names each record once, whole (``*``)
or by the offsets it acknowledges."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from ..._offset_map import FinishedOffsets
from ..._types import MessageExt
from .gaps import GAP_LIMIT, take_within
from .grain_ahead import Ahead, Item

__all__ = ["MIN_EXTRA", "Share"]

#: Entries a proposal carries beyond those wanted, at least (some may be
#: parked, skipped by tag, or already passed by other members).
MIN_EXTRA = 16


class Share:
    """This member's part in one queue (see the module docstring)."""

    __slots__ = (
        "token", "keys", "renewed", "base", "ahead", "extra", "proposed", "records", "rid_of", "top", "bad", "unstored",
    )  # fmt: skip

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
                mine = [
                    o for o in rec if (o < top or (finished is not None and o in finished)) and o not in excluded
                ]  # fmt: skip
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

"""A message-grain member's part in one queue: its token, its session, its
read-ahead, and the records the server keeps of what it delivered to the
member (see :mod:`.grain_scripts`): which offsets of each record are not
acknowledged yet, so that a commit names each record once, whole (``*``)
or by the offsets it acknowledges."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
        "token", "keys", "renewed", "base", "ahead", "extra", "proposed", "records", "rid_of", "bad", "unstored",
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
        #: record id -> its offsets not acknowledged, with their keys.
        self.records: dict[int, dict[int, str]] = {}
        #: offset -> its record id: every offset delivered, not acknowledged.
        self.rid_of: dict[int, int] = {}
        #: Offsets of malformed entries, dead-lettered, never handed to the runtime.
        self.bad: set[int] = set()
        #: Offsets of malformed entries whose dead letter is not stored yet
        #: (not to be acknowledged until it is).
        self.unstored: set[int] = set()

    def record(self, rid: int, delivered: Iterable[tuple[int, str]]) -> None:
        """The server recorded ``delivered`` (offsets with their keys) under
        ``rid`` for this member."""
        offs = dict(delivered)
        self.records[rid] = offs
        rid_of = self.rid_of
        for o in offs:
            rid_of[o] = rid

    def ack_calls(self, acks: Sequence[int], per_call: int) -> list[tuple[list[str], list[int]]]:
        """ACK calls for ``acks`` (offsets of this member's records), each
        naming at most ``per_call`` records: its arguments after the token
        (per record its id, then ``*`` and each key with its count, or the
        offsets) and the offsets it acknowledges."""
        by_rid: dict[int, list[int]] = {}
        rid_of = self.rid_of
        for o in acks:
            by_rid.setdefault(rid_of[o], []).append(o)
        records = self.records
        calls = []
        rids = list(by_rid)
        for i in range(0, len(rids), per_call):
            args: list[str] = []
            offs: list[int] = []
            for rid in rids[i : i + per_call]:
                mine = by_rid[rid]
                rec = records[rid]
                args.append(str(rid))
                if len(mine) == len(rec):
                    counts: dict[str, int] = {}
                    for k in rec.values():
                        counts[k] = counts.get(k, 0) + 1
                    args.append("*")
                    args.append(str(2 * len(counts)))
                    for k, c in counts.items():
                        args.append(k)
                        args.append(str(c))
                else:  # the server lowers the holds of those it still has
                    args.append(",".join(map(str, mine)))
                    args.append("0")
                offs += mine
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
        # a record's id is at most its offsets: the lowest id bounds them from below
        if max(hi, max(delivered)) - min(lo, min(self.records)) <= GAP_LIMIT:
            return len(messages)
        offs = [m.queue_offset for m in messages]
        mine = set(offs)
        pending = [o for o in delivered if o not in mine and o not in self.bad and o not in self.unstored]
        return take_within(offs, min(pending, default=None), max(pending, default=None))

"""A message-grain member's read-ahead of one queue's stream.

With ``Balance.MESSAGE`` the member reads the queue's stream itself, past
the group's cursor, and proposes what it read to DISPATCH (see
:mod:`.grain_scripts`, "Who reads the stream"): the server then never
copies an entry into Lua and back.  :class:`Ahead` keeps the entries read
and not yet looked at by the group as far as the member knows (each
DISPATCH reply carries the cursor), decoded once, with what a proposal says
of each: its offset (its id for an entry whose id's sequence part is not
0) and ``k<key>``, ``s`` (not of the member's tags) or ``x`` (that foreign
id: delivered, never recorded).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from ..._types import MessageExt, MessageQueue
from .codec import decode

__all__ = ["Ahead", "Item", "cursor_pos"]

#: One entry read ahead: ``(position, arg, info, message, bad)`` with
#: ``position`` its id as ``(ms, seq)``, ``arg`` and ``info`` what a
#: proposal says of it, and either the decoded message or, for an entry that
#: is no message, ``(stand-in, reason)`` for the dead-letter queue.
Item = tuple[tuple[int, int], str, str, MessageExt | None, tuple[MessageExt, str] | None]

_first = itemgetter(0)


def cursor_pos(cursor: str) -> tuple[int, int]:
    """A cursor (``<n>`` for ``<n>-0``, or a whole id) as ``(ms, seq)``."""
    ms, _, seq = cursor.partition("-")
    return int(ms), int(seq or 0)


def _pos(eid: bytes | str) -> tuple[int, int]:
    ms, _, seq = (eid.decode() if isinstance(eid, bytes) else str(eid)).partition("-")
    return int(ms), int(seq or 0)


def _items(namespace: str, q: MessageQueue, entries: Sequence[Any], tags: frozenset[str] | None) -> list[Item]:
    bad: list[tuple[MessageExt, str]] = []
    msgs = decode(namespace, q, entries, bad)
    if not bad:
        if tags is None:  # the common case, per entry as little as can be
            return [
                ((o + 1, 0), str(o), "k" + m.keys if m.keys.__class__ is str else "k", m, None)
                for m in msgs
                for o in (m.queue_offset,)
            ]
        return [_item((m.queue_offset + 1, 0), str(m.queue_offset), m, tags) for m in msgs]
    out: list[Item] = []
    for e in entries:  # some entry is no message: one by one, to pair each with its id
        one: list[tuple[MessageExt, str]] = []
        got = decode(namespace, q, [e], one)
        eid = e[0].decode() if isinstance(e[0], bytes) else str(e[0])
        pos = _pos(eid)
        if got:
            out.append(_item(pos, str(got[0].queue_offset), got[0], tags))
        elif pos[1]:
            out.append((pos, eid, "x", None, one[0]))
        else:
            out.append((pos, str(pos[0] - 1), "k", None, one[0]))
    return out


def _item(pos: tuple[int, int], arg: str, m: MessageExt, tags: frozenset[str] | None) -> Item:
    if tags is not None and m.tags not in tags:
        return (pos, arg, "s", m, None)
    return (pos, arg, "k" + m.keys if isinstance(m.keys, str) else "k", m, None)


class Ahead:
    """The entries of one queue read past ``after`` (a cursor), in order.

    The entries the cursor passed are dropped by moving a head index (the
    list is compacted once most of it is behind it), so a DISPATCH costs no
    copy of what is kept."""

    __slots__ = ("after", "_after_pos", "_items", "_args", "_head", "_end")

    def __init__(self, cursor: str) -> None:
        #: The id the kept entries start after, in the cursor's form.
        self.after = cursor
        self._after_pos = cursor_pos(cursor)
        self._items: list[Item] = []
        #: Each item's arg and info, in turn (a proposal is a slice of it).
        self._args: list[str] = []
        #: The first kept item's index.
        self._head = 0
        #: Where the next read starts: just after this id.
        self._end = self._id(cursor)

    @staticmethod
    def _id(cursor: str) -> str:
        return cursor if "-" in cursor else cursor + "-0"

    @property
    def items(self) -> list[Item]:
        """The entries kept, in order (a copy)."""
        return self._items[self._head :]

    def __len__(self) -> int:
        return len(self._items) - self._head

    def read_from(self) -> str:
        """Where the next read starts: just after this id (XRANGE's
        exclusive start is ``"(" + read_from()``)."""
        return self._end

    def add(
        self, namespace: str, q: MessageQueue, entries: Sequence[Any], tags: frozenset[str] | None, start: str
    ) -> None:
        """Keep ``entries``, read just after id ``start`` (a
        :meth:`read_from` of before; what the group's cursor has passed
        since is dropped, and a read from before a reset is not kept)."""
        if not entries:
            return
        if start != self._end:
            end = cursor_pos(self._end)
            if cursor_pos(start) > end:
                return
            entries = [e for e in entries if _pos(e[0]) > end]
            if not entries:
                return
        items = _items(namespace, q, entries, tags)
        self._items += items
        self._args += [a for it in items for a in (it[1], it[2])]
        last = entries[-1][0]
        self._end = last.decode() if isinstance(last, bytes) else str(last)

    def proposal(self, n: int) -> tuple[list[Item], list[str]]:
        """The first ``n`` entries kept, and the DISPATCH arguments that
        propose them (their arg and info each, after :attr:`after`)."""
        h = self._head
        args = [self.after]
        args += self._args[2 * h : 2 * (h + n)]
        return self._items[h : h + n], args

    def seen(self, cursor: str) -> None:
        """The group's cursor is ``cursor``: drop what it has passed.  A
        cursor behind the kept entries (the group's state was reset) starts
        the read-ahead over from it."""
        pos = cursor_pos(cursor)
        if pos <= self._after_pos:
            if pos < self._after_pos:
                self._items, self._args, self._head = [], [], 0
                self.after, self._after_pos = cursor, pos
                self._end = self._id(cursor)
            return
        items = self._items
        i = bisect_right(items, pos, lo=self._head, key=_first)
        self.after, self._after_pos = cursor, pos
        if i == len(items):
            self._items, self._args, self._head = [], [], 0
            if pos > cursor_pos(self._end):
                self._end = self._id(cursor)
        elif i > 256 and 2 * i > len(items):
            self._items = items[i:]
            self._args = self._args[2 * i :]
            self._head = 0
        else:
            self._head = i

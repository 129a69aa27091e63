"""A consumer group of the embedded broker, read and changed from outside
it (``lite-push group describe`` / ``reset-offsets``).

Everything here is read from the group coordinator (:mod:`.groups`) and the
log store (:mod:`.log`) under the broker's one lock.  Members live in the
process that opened the broker: a durable broker's directory is open in one
process at a time, so a tool that opens it sees no member of another
process (that process holds the directory, and the open itself fails).
A reset is stored in the group's committed offsets and, for a durable
broker, written to offsets.json at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._errors import GroupActiveError
from ..._types import MessageQueue, OffsetAndMetadata
from .._common import BrokerClock
from ..group_admin import GroupAdmin, GroupMember
from .groups import GroupCoordinator
from .log import LogStore

__all__ = ["EmbeddedGroupAdmin"]


class EmbeddedGroupAdmin(GroupAdmin):
    """Group ``group`` of the embedded broker whose parts are ``log``,
    ``groups`` and ``clock`` (``last_heartbeat`` is each member's last poll,
    on the clock's ``monotonic``)."""

    def __init__(self, group: str, log: LogStore, groups: GroupCoordinator, clock: BrokerClock) -> None:
        super().__init__(group)
        self._log = log
        self._groups = groups
        self._clock = clock

    def members(self) -> list[GroupMember]:
        now = self._clock.monotonic()
        with self._groups.lock:
            g = self._groups.find(self.group)
            if g is None:
                return []
            return [
                GroupMember(m.cid, tuple(sorted(m.topics)), max(0.0, now - m.last_seen))
                for m in sorted(g.members.values(), key=lambda m: m.cid)
            ]

    def topics(self) -> list[str]:
        with self._groups.lock:
            g = self._groups.find(self.group)
            if g is None:
                return []
            names = {q.topic for q in g.committed}
            for m in g.members.values():
                names.update(m.topics)
            return sorted(names)

    def committed(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        with self._groups.lock:
            g = self._groups.find(self.group)
            if g is None:
                return {}
            return {q: g.committed[q].offset for q in queues if q in g.committed}

    def owners(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[str, ...]]:
        with self._groups.lock:
            g = self._groups.find(self.group)
            if g is None:
                return {}
            return {q: (g.owner[q],) for q in queues if q in g.owner}

    def offsets_at(self, queues: Sequence[MessageQueue], timestamp: int) -> dict[MessageQueue, int]:
        out = {}
        with self._groups.lock:
            for q in queues:
                self._log.queue_log(q)  # an unknown queue is an error here
                lo, hi = self._log.stored_range(q)
                out[q] = self._log.first_stored_at(q, lo, hi, timestamp)
        return out

    def reset(self, offsets: Mapping[MessageQueue, int]) -> None:
        groups = self._groups
        with groups.lock:
            for q in offsets:
                self._log.queue_log(q)
            g = groups.group(self.group)
            if g.members:
                raise GroupActiveError(self.group, sorted(g.members))
            for q, offset in offsets.items():
                g.committed[q] = OffsetAndMetadata(offset)
            snapshot, version = groups.offsets_snapshot()
        groups.save_offsets(snapshot, version)

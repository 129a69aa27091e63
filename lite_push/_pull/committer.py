"""The committer: each owned queue's commit point, stored in the source.

A queue's commit point is its lowest unfinished offset (so a commit never
passes a message still in a lane, in the listener or being retried) with
its offset map: the finished offsets above it, so the next owner skips them
(``_state.offset_map``).  The pull thread commits every ``commit_interval``, for
the queues being revoked before it releases them, and at shutdown; and once
at the first quiet moment of a spell of work (see ``_pull.loop``): when
nothing polled is left unfinished (:meth:`Committer.quiet`), so the
committed offsets and the lag show finished work without waiting for the
interval.  A
failed commit is logged once per episode; each queue's commit point, as it
stands then, is committed next time.

A commit point can move down: a message-grain source may redeliver to this
member, below what it polled, a message another member did not finish (a
late offset, see ``_kernels.offsets``).  The lower offset is committed like any
other (a commit is skipped only when nothing changed): such a source turns a
commit into acknowledgements of what it delivered below the offset and
tolerates a lower one.
"""

from __future__ import annotations

import time

from .._state.process_queue import ProcessQueue
from .._state.shared import Episode
from .._types import MessageQueue, OffsetAndMetadata
from ..sources.contract import PullSource

__all__ = ["Committer"]


class Committer:
    """Commits for the pull thread (the only thread that calls it)."""

    __slots__ = ("_episode", "_group", "_owned", "_source")

    def __init__(self, source: PullSource, *, owned: dict[MessageQueue, ProcessQueue], group: str) -> None:
        self._source = source
        #: The owned queues (assignment writes them): :meth:`commit_all`.
        self._owned = owned
        #: The consumer's group, for the log.
        self._group = group
        self._episode = Episode("commit")

    def commit(self, pqs: list[ProcessQueue]) -> bool:
        """Commit each queue's lowest unfinished offset with its offset map
        (skipped when neither changed since the last commit); return whether
        any had changed (committed, or tried and failed)."""
        offsets: dict[MessageQueue, OffsetAndMetadata] = {}
        now = time.time()
        for pq in pqs:
            offset, offset_map = pq.commit_point()
            if offset != pq.last_committed or offset_map != pq.last_map:
                offsets[pq.queue] = OffsetAndMetadata(offset, offset_map)
            else:  # the committed offset is current: as good as a commit now
                pq.commit_current(now)
        if not offsets:
            return False
        group = self._group
        try:
            self._source.commit(offsets)
        except Exception:
            self._episode.failed(group, f" ({len(offsets)} queue(s))")
            return True
        self._episode.ok(group)
        for pq in pqs:
            c = offsets.get(pq.queue)
            if c is not None:
                pq.committed(c.offset, c.metadata, now)
        return True

    def commit_all(self) -> bool:
        """Commit every owned queue; whether any commit point had changed."""
        return self.commit(list(self._owned.values()))

    def quiet(self) -> bool:
        """Whether no owned queue holds a message (polled, not finished or
        skipped): every commit point is as high as what was polled allows."""
        return not any([pq.holding for pq in self._owned.values()])

"""When the pull side commits: every ``commit_interval``, and once more at
the first quiet moment of a spell of work.

The quiet moment: something was routed since, a poll found nothing more
and no owned queue holds a message any more (caught up, not a lull between
two polls of a backlog).  The pull side commits at once then, so the
committed offsets (``stats().committed``) and the lag show finished work
without waiting for the interval (a backlog consumed in one second is not
shown as the whole backlog for the next four).  That early commit is armed
at the start and again by each periodic commit that found nothing to move,
so a trickle of messages, each quiet moment after the other, still commits
about once per interval.  Either way a commit point is the lowest
unfinished offset (``_pull.committer``): it never passes a message still
held.  Pull side only.
"""

from __future__ import annotations

from .committer import Committer
from .turn import Turn

__all__ = ["CommitSchedule"]


class CommitSchedule:
    """The commits of the pull side's turns (see the module docstring)."""

    __slots__ = ("_committer", "_early", "_interval", "_next", "_worked")

    def __init__(self, committer: Committer, *, interval: float) -> None:
        self._committer = committer
        #: ``commit_interval``, in seconds.
        self._interval = interval
        #: When the next periodic commit is due (set by :meth:`start`).
        self._next = 0.0
        #: Whether the next quiet moment after work commits at once (armed at
        #: the start and by a periodic commit that had nothing to move).
        self._early = True
        #: Whether anything was routed since the last early commit.
        self._worked = False

    def start(self, now: float) -> None:
        """Time the first periodic commit from ``now``."""
        self._next = now + self._interval

    def turn(self, now: float, polled: bool) -> Turn:
        """A turn's commit, if one is due (``polled``: the turn's poll
        returned messages, which were routed); yields the commit."""
        if polled:
            self._worked = True
        if now >= self._next:
            if not (yield self._committer.commit_all):
                self._early = True  # nothing moved: the next spell of work commits when it is done
            self._next = now + self._interval
        elif not polled and self._early and self._worked and self._committer.quiet():
            yield self._committer.commit_all  # the first quiet moment: show the finished work now
            self._early = self._worked = False
            self._next = now + self._interval

"""Keys the application paused: ``consumer.pause_keys`` / ``resume_keys``.

RocketMQ LiteTopic's per-key suspend, on lanes.  A paused key's messages
wait, in offset order, until it is resumed, while its lane goes on with its
other keys; they are unfinished meanwhile, so its queue's commit point
stays below the first of them (the other keys' finished offsets above it
travel in the offset map) and flow control counts them.

Three parts, one per thread that touches them:

* :class:`KeyPauses` (any application thread writes, under ``_lock``):
  the paused set, ``keys``, replaced whole, never changed in place, so the
  pull thread and ``stats()`` read it without a lock.
* :class:`KeyPauseSync` (pull thread): after every poll, before what it
  returned is routed, it compares ``keys`` with the set it last handed on
  (an identity test: nothing to do while nobody calls) and hands every lane
  one :class:`KeyPauseChange`: the whole set, and which keys were added and
  removed.  A pause and a resume that it never saw in between cancel out;
  the lanes apply the changes in the order they were handed.
* The lanes (``_lanes.parked_keys``, ``_lanes.worker``): a paused key is a park
  without a timer entry; a resumed key's waiting messages run as a due
  key's do (one at a time, in order; a failure parks it again as usual).

The guarantee: a lane holds the key's messages it starts after it took
the change (a lane runs its work before the messages it takes with it), so
every message of the key stored after ``pause_keys`` returned waits (it is
polled later, and routed after the change went to every lane); one polled
before may still run if its lane took it before the change, and a call
already running finishes.  ``pause_keys`` wakes the pull thread, so the
change goes out at once even when nothing is polled.  After
``resume_keys`` the waiting messages run before the key's later ones.
The pause belongs to this consumer process:
it is not stored anywhere, so a revoked queue's waiting messages go,
unfinished, to the queue's next owner, which does not know the pause, and
after a restart they are delivered again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable

from .._errors import LitePushError
from .._lanes.steps import Steps
from .._state.timer import KeyRetrier, LaneWork
from .dispatch import Dispatcher

__all__ = ["KeyPauseChange", "KeyPauseSync", "KeyPauses", "checked_keys"]

logger = logging.getLogger(__name__)

#: Most keys a log line names.
LOGGED_KEYS = 10


def checked_keys(keys: Iterable[str]) -> frozenset[str]:
    """``keys`` as a frozenset, or ``TypeError`` / ``ValueError`` naming
    the argument: an iterable (not a single ``str``) of non-empty strings,
    the keys messages are routed by (``message.keys``, or what the
    ``key_extractor`` returns)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"keys: must be an iterable of keys, e.g. [{keys!r}], not a single {type(keys).__name__}")
    try:
        items = list(keys)
    except TypeError:
        raise TypeError(f"keys: must be an iterable of str, got {type(keys).__name__}") from None
    for key in items:
        if not isinstance(key, str):
            raise TypeError(f"keys: each key must be a str (a message's key), got {key!r}")
        if not key:
            raise ValueError("keys: a key must not be empty (messages without a key are routed by their queue)")
    return frozenset(items)


def _named(keys: frozenset[str]) -> str:
    shown = sorted(keys)[:LOGGED_KEYS]
    more = len(keys) - len(shown)
    return ", ".join(map(repr, shown)) + (f" and {more} more" if more else "")


class KeyPauses:
    """The keys the application paused (see the module docstring).
    ``lanes``: whether the consumer has lanes to hold keys in (QUEUE_ORDERLY,
    the baseline, has none: pausing keys raises :class:`LitePushError`)."""

    __slots__ = ("_group", "_lanes", "_lock", "keys")

    def __init__(self, group: str, *, lanes: bool = True) -> None:
        self._group = group
        self._lanes = lanes
        #: Makes concurrent pauses and resumes of the application's threads add up.
        self._lock = threading.Lock()
        #: Paused now: replaced whole, read without the lock.
        self.keys: frozenset[str] = frozenset()

    def _check(self, what: str) -> None:
        if not self._lanes:
            raise LitePushError(
                f"{what}() is not available in QUEUE_ORDERLY mode (the baseline serialises whole queues, "
                "not keys): use pause(queues), or ConsumeMode.KEY_ORDERLY"
            )

    def pause(self, keys: Iterable[str]) -> None:
        """Add ``keys`` (checked: :func:`checked_keys`) to the paused set."""
        self._check("pause_keys")
        add = checked_keys(keys)
        with self._lock:
            new = add - self.keys
            self.keys = self.keys | add
        if new:
            logger.info("consumer %r: the application paused key(s) %s", self._group, _named(new))

    def resume(self, keys: Iterable[str]) -> None:
        """Remove ``keys`` (checked) from the paused set; keys not paused
        are ignored."""
        self._check("resume_keys")
        drop = checked_keys(keys)
        with self._lock:
            gone = drop & self.keys
            self.keys = self.keys - drop
        if gone:
            logger.info("consumer %r: the application resumed key(s) %s", self._group, _named(gone))


class KeyPauseChange(LaneWork):
    """Work for every lane: the paused keys are now ``paused``; ``added``
    were paused and ``removed`` resumed since the last change."""

    __slots__ = ("added", "paused", "removed")

    def __init__(self, paused: frozenset[Hashable], added: frozenset[Hashable], removed: frozenset[Hashable]) -> None:
        self.paused = paused
        self.added = added
        self.removed = removed

    def steps(self, lane: KeyRetrier) -> Steps:
        return lane.apply_pauses(self.paused, self.added, self.removed)


class KeyPauseSync:
    """The pull thread's side: hands every lane what changed (see the
    module docstring)."""

    __slots__ = ("_applied", "_dispatcher", "_lanes", "_pauses")

    def __init__(self, pauses: KeyPauses, *, dispatcher: Dispatcher, lanes: int) -> None:
        self._pauses = pauses
        #: Puts the change into each lane (``put_due``, then ``flush``).
        self._dispatcher = dispatcher
        self._lanes = lanes
        #: The set the lanes were last handed.
        self._applied: frozenset[Hashable] = frozenset()

    def apply(self) -> None:
        """Hand every lane the change since the last call, if any (pull
        thread, before a dispatch)."""
        now = self._pauses.keys
        applied = self._applied
        if now is applied:
            return
        self._applied = now
        added = now - applied
        removed = applied - now
        if not added and not removed:
            return
        work: list[LaneWork] = [KeyPauseChange(now, added, removed)]
        self._dispatcher.put_due({i: work for i in range(self._lanes)})
        self._dispatcher.flush()

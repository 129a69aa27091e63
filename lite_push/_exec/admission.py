"""Admission (asyncio executor): how many lanes may be in listener calls at
once, so the event loop keeps turning over fast.

With a thousand lanes on one loop, every lane with work is on the loop's
ready queue once per turn, so a turn costs the loop's CPU for a thousand
listener steps (about 10 ms with a 1 ms awaited listener here).  Past the
number of lanes the loop can turn over within a listener's latency, more
lanes add no throughput, only a longer turn: each key's next message waits
a whole turn, and the busiest keys, whose lanes get one step per turn like
every other lane, finish long after the rest (measured in RESULTS.md,
issue 17).  :class:`Admission` measures a turn every
:data:`ADMISSION_PROBE` and lets only as many lanes into listener calls as
keep it near the target (``ConsumerConfig.loop_turn_target``), the lanes
with the most work first; once the keys with work are as many as the
lanes, the pull thread places new keys on the lanes admitted
(``KeyRouter.limit``; before that each key gets a lane of its own:
``_pull.dispatch.placement_limit``).  A loop that keeps up is never limited.

Owned by the loop thread; the pull thread only reads :attr:`Admission.limit`
(a racy read of an int: a placement hint).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

__all__ = [
    "ADMISSION_SLOT_TIME",
    "ADMISSION_MIN",
    "ADMISSION_PROBE",
    "HEAD_START_PER_MESSAGE",
    "LATENCY_SHARE",
    "TURN_PER_CALL",
    "Admission",
]

#: Seconds between two measurements of a turn of the loop (admission).
ADMISSION_PROBE = 0.005
#: Admission never aims at a turn shorter than this many times the loop's
#: CPU per listener call: a listener that holds the loop that long makes
#: turns that long with any number of lanes, and fewer lanes would only
#: cost throughput.
TURN_PER_CALL = 4.0
#: Admission never aims at a turn shorter than this share of the listener's
#: own latency (its awaited time, estimated from the calls made: see
#: :meth:`Admission.turned`): a lane resumed a turn after its await ends
#: loses little when turns are short against the await, and limiting lanes
#: then only costs throughput (a 10 ms listener ran at 30,000-39,000 msg/s
#: against 47,000 without admission, the limit pulled under the keys with
#: work by turns of 2 ms; benchmarks/RESULTS.md, issue 31).
LATENCY_SHARE = 0.5
#: Seconds a lane keeps its slot while it has work and other lanes wait
#: for one (so none waits forever).
ADMISSION_SLOT_TIME = 1.0
#: Fewest lanes admission lets into listener calls at once (so a consumer
#: with this many lanes or fewer is never limited).  Listeners that spend
#: long on the loop's CPU bunch up in turns of any length; with fewer lanes
#: than this they would leave the loop idle.
ADMISSION_MIN = 128
#: Admission order: a lane waiting with ``n`` messages counts as having
#: waited ``n`` times this long already (seconds), so the lanes with the
#: most work -- the busiest keys, which finish last -- run first, and a lane
#: with little work waits at most its own wait plus this times the largest
#: backlog.
HEAD_START_PER_MESSAGE = 0.001


class Admission:
    """How many lanes may be in listener calls at once (loop thread only).

    Each listener call costs the loop CPU, and a lane in a call is on the
    loop's ready queue once per turn.  Past the number of lanes the loop
    can turn over within a listener's latency, more lanes add no
    throughput, only a longer turn: every key's next message waits longer,
    and the busiest keys -- whose lanes get one step per turn like all the
    others -- finish last.  So lanes queue for ``limit`` slots (the ones
    with the most work first, see :data:`HEAD_START_PER_MESSAGE`); a
    lane keeps its slot while it has work (up to :data:`ADMISSION_SLOT_TIME`
    while others wait), and ``limit`` follows the length of a turn,
    measured every :data:`ADMISSION_PROBE` in the loop thread's CPU (a
    turn spent waiting for the GIL is not the lanes' doing): down while a
    turn takes longer than ``target`` (or :data:`TURN_PER_CALL` times the
    loop's CPU per call, or :data:`LATENCY_SHARE` of the listener's own
    latency, whichever is most), never under :data:`ADMISSION_MIN`, and up
    while it takes less than half of that.  A loop that keeps up (few lanes busy,
    or listeners that mostly await) turns fast: the limit stays at the
    lane count and nothing changes.  The pull thread also places new keys
    on the first ``limit`` lanes only (:meth:`AsyncExecutor.lane_limit`),
    so the lanes that run hold more work each and the others stay idle.
    """

    __slots__ = (
        "_calls_seen",
        "_closed",
        "_cpu",
        "_handle",
        "_loop",
        "_monotonic",
        "_probe_at",
        "_probe_cpu",
        "_seen_at",
        "_seq",
        "_thread_time",
        "_waiters",
        "active",
        "calls",
        "limit",
        "most",
        "target",
        "turn",
    )

    def __init__(
        self,
        lanes: int,
        *,
        loop: asyncio.AbstractEventLoop,
        target: float,
        monotonic: Callable[[], float] = time.monotonic,
        thread_time: Callable[[], float] = time.thread_time,
    ) -> None:
        self.most = lanes
        self.limit = lanes
        self.target = target
        self.active = 0
        #: Listener calls made on the hot path (lanes add; for the CPU per call).
        self.calls = 0
        #: A turn of the loop, a moving average (seconds).
        self.turn = 0.0
        self._loop = loop
        #: The clocks (injectable for tests): wall time, and the loop thread's CPU.
        self._monotonic = monotonic
        self._thread_time = thread_time
        #: A heap of ``(when, seq, future)``: who runs next (see
        #: :data:`HEAD_START_PER_MESSAGE`).
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._cpu = self._thread_time()
        self._seen_at = self._monotonic()
        self._calls_seen = 0
        self._probe_at = 0.0
        self._probe_cpu = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._closed = False

    # -- the probe: a turn measured every ADMISSION_PROBE ---------------------------

    def start(self) -> None:
        """Start measuring turns (loop thread)."""
        self._handle = self._loop.call_later(ADMISSION_PROBE, self._probe)

    def close(self) -> None:
        """Stop measuring (any thread)."""
        self._closed = True
        handle = self._handle
        if handle is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # closed meanwhile
                pass

    def _probe(self) -> None:
        # time the next whole turn: from the head of one turn's ready
        # callbacks to the head of the next one's
        if not self._closed:
            self._loop.call_soon(self._probe_turn)

    def _probe_turn(self) -> None:
        self._probe_at = self._monotonic()
        self._probe_cpu = self._thread_time()
        self._loop.call_soon(self._probed)

    def _probed(self) -> None:
        if self._closed:
            return
        # the loop thread's CPU in the turn too: a turn that waited for the
        # GIL (the pull thread routing a dispatch, the cyclic GC run by
        # another thread) is not the lanes' doing
        self.turned(self._monotonic() - self._probe_at, self._thread_time() - self._probe_cpu)
        self._handle = self._loop.call_later(ADMISSION_PROBE, self._probe)

    # -- slots ----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Lanes with work waiting for a slot."""
        return len(self._waiters)

    def enter(self, backlog: int) -> asyncio.Future[None] | None:
        """Take a slot for a lane holding ``backlog`` messages: ``None``
        when one was free, else a future resolved once the caller holds one."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._seq += 1
        heapq.heappush(self._waiters, (self._monotonic() - backlog * HEAD_START_PER_MESSAGE, self._seq, fut))
        return fut

    def must_yield(self, occupied: float) -> bool:
        """Whether a lane that has had its slot for ``occupied`` seconds (and
        still has work) should give it back and queue again: the limit went
        down under the slots in use, or others have waited while it had
        one longer than :data:`ADMISSION_SLOT_TIME`."""
        return self.active > self.limit or (bool(self._waiters) and occupied > ADMISSION_SLOT_TIME)

    async def admitted(self, backlog: int) -> None:
        """Wait for a slot for a lane holding ``backlog`` messages; a lane
        cancelled meanwhile gives back one it got."""
        fut = self.enter(backlog)
        if fut is None:
            return
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.leave()
            raise

    def leave(self) -> None:
        """Give a slot back (to the next waiting lane, if any)."""
        self.active -= 1
        self._admit()

    def _admit(self) -> None:
        waiters = self._waiters
        while waiters and self.active < self.limit:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():  # a cancelled waiter's future is done
                self.active += 1
                fut.set_result(None)

    # -- the limit ------------------------------------------------------------------

    def turned(self, seconds: float, cpu_seconds: float | None = None) -> None:
        """(the probe) A turn of the loop took ``seconds``, ``cpu_seconds``
        of them on the loop thread's CPU: adjust the limit on the shorter,
        as a moving average (one stall -- the cyclic GC, another thread
        holding the GIL -- moves it little)."""
        if cpu_seconds is not None and cpu_seconds < seconds:
            seconds = cpu_seconds
        cpu = self._thread_time()
        now = self._monotonic()
        calls = self.calls - self._calls_seen
        target = self.target
        if calls > 0:
            # Little's law: the lanes holding slots times the time since the
            # last look, over the calls made, is a call's time in a slot; less
            # the turn it waits to be resumed, the listener's own latency.
            latency = self.active * (now - self._seen_at) / calls - self.turn
            target = max(target, TURN_PER_CALL * (cpu - self._cpu) / calls, LATENCY_SHARE * latency)
            self._cpu = cpu
            self._seen_at = now
            self._calls_seen = self.calls
        # a turn far past the target is a stall, not the lanes' doing (the
        # cyclic GC, another thread holding the GIL): count it as 4 targets
        turn = self.turn = 0.7 * self.turn + 0.3 * min(seconds, 4 * target)
        if turn > target:
            floor = min(self.most, ADMISSION_MIN)
            self.limit = max(floor, min(self.limit, int(self.limit * max(0.8, target / turn))))
        elif turn < target / 2 and self.limit < self.most:
            # the loop has time to spare: let more lanes in (new keys spread
            # over them too), whether or not any waits now
            self.limit = min(self.most, self.limit + max(1, self.limit // 8))
            self._admit()

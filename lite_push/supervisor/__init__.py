"""ProcessSupervisor: N member processes of one consumer group, one per core.

One Python process runs one consumer on one core (the GIL).  A
:class:`ProcessSupervisor` runs ``processes`` member processes of the same
group on a shared source (Redis, Kafka: the group shares the queues out
among them), restarts the ones that die, stops them all cleanly, and serves
their metrics on one scrape target::

    def member(index: int) -> LitePushConsumer:       # module level: members import it
        broker = RedisBroker("redis://127.0.0.1:6379/0")
        consumer = LitePushConsumer(ConsumerConfig(group="sms", metrics_port=0),
                                    broker.pull_consumer("sms"), handle)
        consumer.subscribe("ORDER")
        return consumer

    if __name__ == "__main__":                       # members import this module again
        supervisor = ProcessSupervisor(member, processes=4, metrics_port=9464)
        sys.exit(supervisor.run())                   # until SIGTERM / SIGINT

**Members.** Each is a ``multiprocessing`` *spawn* process (fork is unsafe
with threads and librdkafka): it imports the program's main module again
(as ``__mp_main__``, so the entry point is guarded as above) and unpickles
the factory, which must be a module-level function or a
``functools.partial`` of one.  The factory is called in the member with the
member's index and returns an unstarted, subscribed
:class:`~lite_push.LitePushConsumer`, or a context manager yielding one (to
close a broker after the consumer).  A member runs in a fresh interpreter:
the factory configures its logging.  Members ignore SIGINT (Ctrl-C reaches
the whole process group; the supervisor decides); on the supervisor's
SIGTERM a member stops polling, drains (``shutdown(shutdown_timeout)``),
commits and exits 0 (1 when not everything finished or its consumer
failed).  A member whose supervisor vanished (SIGKILL) notices its pipe
closing and does the same.  See :mod:`lite_push.supervisor._member_process`.

**Restarts.** A member that ends while the supervisor is not stopping
(crash, SIGKILL, a failed consumer's exit 1, even exit 0) is logged at
WARNING with its PID and exit code or signal, and started again after a
back-off: ``restart_backoff`` seconds, doubled per death in a row up to
``restart_backoff_max``, back to ``restart_backoff`` once a run lasted
``stable_after`` seconds.  A member that dies ``max_start_failures`` times
in a row without its consumer ever starting (a listener that does not
import, a source that refuses it) is a crash loop: the supervisor logs an
ERROR naming the member and its last exit, stops every member and ends with
exit code 1 (:attr:`failure` says why).  Back-off and stability are timed on
``clock`` (:class:`~lite_push.ManualClock` in tests); the shutdown deadline on
the real monotonic clock.

**Counts.** A running member reports what its consumer consumed every
second or so, and its final count when it stops; :attr:`consumed` adds up
every member's processes, a restarted member's earlier ones included.  A
process killed before its final count is counted as of its last report
(:attr:`consumed_short` names such members).

**Stopping** (:meth:`stop`, SIGTERM or SIGINT in :meth:`run`): pending
restarts are cancelled, every running member gets SIGTERM, and each has
``shutdown_timeout`` (+ :data:`STOP_MARGIN`) to exit; one still running then
is killed (SIGKILL, logged at ERROR).  The exit code is 0 when every member
drained and exited 0; 1 when one did not, when one was waiting for its
restart (it died without draining), or after a crash loop.

**Metrics** (``metrics_port``): one endpoint, ``http://metrics_addr:port``,
with ``/metrics`` (every member's series, labelled ``member="<index>"``, and
the supervisor's own, :data:`lite_push.metrics.names.SUPERVISOR_METRICS`),
``/healthz`` and ``/readyz`` (200 when every member is alive / ready, else
503 naming the first that is not); see :mod:`lite_push.metrics._members`.  For
this each member's consumer must serve its own metrics on
``metrics_port=0`` (a free port) and ``metrics_addr="127.0.0.1"``: a member
whose consumer has another ``metrics_port`` fails at start with a
:class:`~lite_push.ConfigError` naming ``metrics_port``.  Without
``metrics_port`` the members' consumers may serve metrics as they like (on
``9464 + index``, say, one scrape target per member).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
from types import TracebackType
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._core.signals import StopOnSignal
from .._errors import ConfigError, LitePushError
from ..metrics._members import MembersEndpoint
from ._member_process import (
    MemberFactory,
    MemberProcess,
    MemberStarted,
    MemberState,
)
from ._restart_policy import RestartPolicy, RestartTracker, check_seconds

__all__ = ["STOP_MARGIN", "MemberFactory", "MemberState", "ProcessSupervisor"]

logger = logging.getLogger(__name__)

#: Seconds a stopping member gets beyond ``shutdown_timeout`` (its consumer's
#: own grace, committing, closing the source, exiting).
STOP_MARGIN = 10.0
#: Longest wait of the monitor thread between two looks at the clock.
_TURN = 0.2


class _Slot:
    """One member index: its process now, its restart series, its history
    (the monitor thread's alone)."""

    __slots__ = (
        "commits",
        "consumed_before",
        "exact",
        "index",
        "last_exit",
        "proc",
        "restart_at",
        "restarts",
        "tracker",
    )

    def __init__(self, index: int, policy: RestartPolicy) -> None:
        self.index = index
        self.tracker = RestartTracker(policy)
        self.proc: MemberProcess | None = None
        self.restarts = 0
        self.restart_at: float | None = None
        self.last_exit: str | None = None
        #: What its ended processes consumed, as each last reported.
        self.consumed_before = 0
        #: Whether every ended process reported its final count.
        self.exact = True
        #: What its last process's stop committed (its summary line).
        self.commits: str | None = None

    def ended(self, proc: MemberProcess) -> None:
        """Its process ``proc`` ended: keep its count (a killed one's as of
        its last progress report)."""
        self.consumed_before += proc.consumed
        if proc.finished is None and proc.started is not None:
            self.exact = False
        if proc.finished is not None:
            self.commits = proc.finished.commits or None
        elif proc.started is None and proc.error is None and proc.exitcode == 0:
            # asked to stop before its consumer ran (a slow start): it owned nothing
            self.commits = "stopped before its consumer started, nothing to commit"
        else:
            self.commits = None

    def state(self) -> MemberState:
        proc = self.proc
        started = None if proc is None else proc.started
        return MemberState(
            index=self.index,
            pid=None if proc is None else proc.pid,
            alive=proc is not None,
            ready=started is not None,
            restarts=self.restarts,
            metrics_url=None if started is None else started.metrics_url,
            last_exit=self.last_exit,
            consumed=self.consumed_before + (0 if proc is None else proc.consumed),
            consumed_exact=self.exact,
            commits=self.commits,
        )


def _check_arguments(factory: MemberFactory, processes: int, metrics_port: int | None, metrics_addr: str) -> None:
    """:class:`~lite_push.ConfigError` naming the first argument of
    :class:`ProcessSupervisor` that is wrong."""
    if not callable(factory):
        raise ConfigError("factory", f"must be callable, got {factory!r}")
    try:
        pickle.dumps(factory)
    except Exception as e:
        raise ConfigError(
            "factory",
            f"must be picklable (a module-level function or a functools.partial of one), got {factory!r}: {e}",
        ) from None
    if type(processes) is not int or processes < 1:
        raise ConfigError("processes", f"must be an int >= 1, got {processes!r}")
    if metrics_port is not None and (type(metrics_port) is not int or not 0 <= metrics_port <= 65535):
        raise ConfigError("metrics_port", f"must be None or a port in [0, 65535], got {metrics_port!r}")
    if not isinstance(metrics_addr, str) or not metrics_addr.strip():
        raise ConfigError("metrics_addr", f"must be a host address string, got {metrics_addr!r}")


class ProcessSupervisor:
    """Runs ``processes`` member processes of one group (see the module
    docstring).  Invalid arguments raise :class:`~lite_push.ConfigError`
    naming the argument.  :meth:`run` blocks until SIGTERM / SIGINT; to
    embed it, :meth:`start`, :meth:`stop` and :meth:`wait` (or ``with``)."""

    def __init__(
        self,
        factory: MemberFactory,
        processes: int,
        *,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
        shutdown_timeout: float = 30.0,
        restart_backoff: float = 1.0,
        restart_backoff_max: float = 30.0,
        stable_after: float = 60.0,
        max_start_failures: int = 5,
        clock: Clock | None = None,
    ) -> None:
        _check_arguments(factory, processes, metrics_port, metrics_addr)
        self._factory = factory
        self._processes = processes
        self._metrics_port = metrics_port
        self._metrics_addr = metrics_addr
        self._shutdown_timeout = check_seconds("shutdown_timeout", shutdown_timeout)
        self._policy = RestartPolicy(restart_backoff, restart_backoff_max, stable_after, max_start_failures)
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # guards _states
        self._states = tuple(_Slot(i, self._policy).state() for i in range(processes))
        self._stop_requested = threading.Event()
        self._hurry = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._failure: str | None = None
        self._exit_code: int | None = None
        self._endpoint: MembersEndpoint | None = None
        #: ``http://metrics_addr:port/metrics`` once started with ``metrics_port``.
        self.metrics_url: str | None = None

    # -- the public view --------------------------------------------------------------

    @property
    def processes(self) -> int:
        """How many member processes it runs."""
        return self._processes

    @property
    def members(self) -> tuple[MemberState, ...]:
        """Each member now, by index (any thread)."""
        with self._lock:
            return self._states

    @property
    def consumed(self) -> int:
        """Messages the members consumed, restarted ones' earlier processes
        included: each process's final count, or, for one that ended
        without it (killed), its last progress report (see
        :attr:`consumed_short`)."""
        return sum(m.consumed for m in self.members)

    @property
    def consumed_short(self) -> tuple[int, ...]:
        """The members whose count may be short: one of their processes
        ended without reporting its final count (killed), so it is counted
        as of its last progress report."""
        return tuple(m.index for m in self.members if not m.consumed_exact)

    @property
    def failure(self) -> str | None:
        """Why the supervisor stopped by itself (a crash loop, or an error of
        its own), else ``None``."""
        return self._failure

    @property
    def exit_code(self) -> int | None:
        """0 or 1 once it finished (see :meth:`wait`); ``None`` before."""
        return self._exit_code

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Serve the metrics endpoint (``metrics_port``: a port in use raises
        :class:`~lite_push.ConfigError` naming it) and start the members;
        returns at once.  Only once."""
        if self._thread is not None:
            raise LitePushError("the supervisor was started already")
        self._start_metrics()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._monitor, name="lite-push-supervisor", daemon=True)
        self._thread.start()
        atexit.register(self._stop_at_exit)

    def stop(self) -> None:
        """Ask every member to stop (any thread, any number of times); returns
        at once: :meth:`wait` for the end."""
        self._stop_requested.set()
        self._wake()

    def stop_now(self) -> None:
        """Stop the members at once (a second SIGTERM each): they commit what
        finished and do not wait for the listener calls running."""
        self._hurry.set()
        self.stop()

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the supervisor finished (at most ``timeout`` seconds);
        its exit code, or ``None`` if it is still running.  0: every member
        drained and exited 0; 1: a member did not, or a crash loop."""
        if self._thread is None:
            raise LitePushError("the supervisor was not started")
        if timeout is not None:
            return self._exit_code if self._done.wait(timeout) else None
        while not self._done.wait(_TURN):  # in slices: signal handlers run between them
            pass
        return self._exit_code

    def run(self) -> int:
        """Start, run until SIGTERM or SIGINT (handlers installed when called
        from the main thread, restored after) or :meth:`stop` from another
        thread, stop the members; return the exit code (see :meth:`wait`)."""
        signals = StopOnSignal(on_signal=self._signalled)
        main = threading.current_thread() is threading.main_thread()
        if main:
            signals.install()
        try:
            if self._thread is None:
                self.start()
            code = self.wait()
            assert code is not None
            return code
        finally:
            if main:
                signals.restore()

    def __enter__(self) -> ProcessSupervisor:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.wait()

    def _signalled(self, name: str) -> None:
        logger.info("%s: stopping %d members", name, self._processes)
        self.stop()

    def _stop_at_exit(self) -> None:
        if not self._done.is_set():
            logger.warning("the interpreter is exiting: stopping the members")
            self.stop()
            self._done.wait()

    def _wake(self) -> None:
        with self._lock:  # never a write to a closed (and maybe reused) descriptor
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the pipe is full: awake already
                pass

    # -- the monitor thread -----------------------------------------------------------

    def _monitor(self) -> None:
        slots: list[_Slot] = []
        code = 1
        try:
            slots = [_Slot(i, self._policy) for i in range(self._processes)]
            for slot in slots:
                self._spawn(slot, slots)
            while not self._stopping():
                self._turn(slots)
            code = self._shutdown(slots)
        except BaseException as e:
            self._failure = f"the supervisor failed: {type(e).__name__}: {e}"
            logger.exception("the supervisor failed; killing its members")
            for slot in slots:
                if slot.proc is not None:
                    slot.proc.kill()
        finally:
            self._exit_code = code
            self._stop_metrics()
            with self._lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1
            atexit.unregister(self._stop_at_exit)
            self._done.set()

    def _publish(self, slots: list[_Slot]) -> None:
        states = tuple(s.state() for s in slots)
        with self._lock:
            self._states = states

    def _spawn(self, slot: _Slot, slots: list[_Slot]) -> None:
        restart = slot.last_exit is not None
        slot.restart_at = None
        slot.proc = MemberProcess(
            self._ctx, self._factory, slot.index, self._metrics_port is not None, self._shutdown_timeout
        )
        slot.tracker.started(self._clock.monotonic())
        if restart:
            slot.restarts += 1
            logger.info("member %d restarted as pid %d (restart %d)", slot.index, slot.proc.pid, slot.restarts)
        else:
            logger.info("member %d started as pid %d", slot.index, slot.proc.pid)
        self._publish(slots)

    def _turn(self, slots: list[_Slot]) -> None:
        """Wait for a report, a death, a due restart or a stop; handle them."""
        due = [s.restart_at for s in slots if s.restart_at is not None]
        timeout = _TURN if not due else min(_TURN, max(0.0, min(due) - self._clock.monotonic()))
        waitables: list[Any] = [self._wake_r]
        for s in slots:
            if s.proc is not None:
                waitables += s.proc.waitables()
        ready = multiprocessing.connection.wait(waitables, timeout)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        changed = False
        for s in slots:
            if s.proc is not None:
                changed |= self._read(s)
                if s.proc.exited():
                    self._died(s)
                    changed = True
        now = self._clock.monotonic()
        for s in slots:
            if s.restart_at is not None and now >= s.restart_at and not self._stopping():
                self._spawn(s, slots)
                changed = False  # _spawn published
        if changed:
            self._publish(slots)

    def _stopping(self) -> bool:
        return self._stop_requested.is_set() or self._failure is not None

    def _read(self, slot: _Slot) -> bool:
        """Take in what the member reported (its start, its counts); whether
        its state changed."""
        assert slot.proc is not None
        reports = slot.proc.read()
        for report in reports:
            if isinstance(report, MemberStarted):
                slot.tracker.ready()
                where = f", metrics {report.metrics_url}" if report.metrics_url else ""
                logger.info("member %d (pid %d) consuming%s", slot.index, report.pid, where)
        return bool(reports)

    def _died(self, slot: _Slot) -> None:
        """The member's process ended without being asked to."""
        proc = slot.proc
        assert proc is not None
        proc.close()
        slot.ended(proc)
        slot.proc = None
        slot.last_exit = proc.exit_text()
        now = self._clock.monotonic()
        delay = slot.tracker.died(now)
        if delay is None:
            self._failure = (
                f"member {slot.index} ended {self._policy.max_start_failures} times in a row before its consumer "
                f"started; last: pid {proc.pid} {slot.last_exit}"
            )
            logger.error("%s; giving up: stopping every member", self._failure)
            return
        slot.restart_at = now + delay
        logger.warning(
            "member %d (pid %d) ended while not asked to stop: %s; restarting it in %gs",
            slot.index,
            proc.pid,
            slot.last_exit,
            delay,
        )

    def _shutdown(self, slots: list[_Slot]) -> int:
        """SIGTERM every running member, wait for each (up to the shutdown
        timeout + margin), kill what is left; the exit code."""
        code = 0 if self._failure is None else 1
        for s in slots:
            if s.restart_at is not None:  # it died and did not drain: its work is delivered again
                logger.warning("member %d was waiting for its restart (it ended: %s)", s.index, s.last_exit)
                s.restart_at = None
                code = 1
        live = [s for s in slots if s.proc is not None]
        logger.info("stopping %d members (SIGTERM; draining up to %gs)", len(live), self._shutdown_timeout)
        for s in live:
            assert s.proc is not None
            s.proc.terminate()
        deadline = time.monotonic() + self._shutdown_timeout + STOP_MARGIN
        while live and (left := deadline - time.monotonic()) > 0:
            if self._hurry.is_set():  # SIGTERM again, each turn (a pending one absorbs the next): at once
                for s in live:
                    s.proc.terminate()  # type: ignore[union-attr]
            waitables = [w for s in live if s.proc is not None for w in s.proc.waitables()]
            if waitables:
                multiprocessing.connection.wait(waitables, min(left, _TURN))
            for s in list(live):
                assert s.proc is not None
                self._read(s)
                if s.proc.exited():
                    if not self._stopped(s):
                        code = 1
                    live.remove(s)
        for s in live:
            proc = s.proc
            assert proc is not None
            logger.error(
                "member %d (pid %d) did not stop within %gs; killing it (SIGKILL)",
                s.index,
                proc.pid,
                self._shutdown_timeout + STOP_MARGIN,
            )
            proc.kill()
            proc.close()
            s.ended(proc)
            slot_exit = proc.exit_text()
            s.proc, s.last_exit = None, slot_exit
            code = 1
        self._publish(slots)
        return code

    def _stopped(self, slot: _Slot) -> bool:
        """A member asked to stop ended; whether it ended cleanly."""
        proc = slot.proc
        assert proc is not None
        proc.close()
        slot.ended(proc)
        slot.proc = None
        slot.last_exit = proc.exit_text()
        finished = proc.finished
        if proc.exitcode == 0:
            consumed = "" if finished is None else f"; consumed {finished.consumed:,}"
            logger.info("member %d (pid %d) stopped%s", slot.index, proc.pid, consumed)
            return True
        if proc.started is None and proc.error is None:  # stopped before it ran a consumer: nothing to drain
            logger.info("member %d (pid %d) stopped before its consumer started", slot.index, proc.pid)
            return True
        logger.warning("member %d (pid %d) stopped: %s", slot.index, proc.pid, slot.last_exit)
        return False

    # -- metrics ----------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        if self._metrics_port is not None:
            self._endpoint = MembersEndpoint(
                self._metrics_addr, self._metrics_port, lambda: self.members, self._processes
            )
            self.metrics_url = self._endpoint.url

    def _stop_metrics(self) -> None:
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()

"""One member process of a :class:`~lite_push.ProcessSupervisor`: both ends.

**In the member** (:func:`run_member`, the target of a ``spawn`` process):
SIGINT is ignored (the supervisor decides) and SIGTERM is blocked, then
waited for with ``sigtimedwait`` (no handler, so no lock can be taken at
the wrong moment; every thread the consumer starts inherits the blocked
mask).  The member calls the factory with its index, starts the consumer,
tells the supervisor over its pipe (:class:`MemberStarted`, with the
consumer's metrics URL), and waits for SIGTERM, for its consumer to fail,
or for the pipe to close (the supervisor is gone), reporting what it has
consumed so far every :data:`PROGRESS_INTERVAL` (:class:`MemberProgress`:
the count a member killed with SIGKILL leaves behind).  Then it stops polling,
drains (``shutdown(shutdown_timeout)``), commits, reports
(:class:`MemberFinished`) and exits 0, or 1 when not everything finished or
the consumer failed.  A multiprocessing child ends with ``os._exit``, so no
``atexit`` handler runs there: the shutdown is done here, explicitly.  What
the factory or the start raises is logged, reported (:class:`MemberError`)
and ends the process with exit code 1.

**In the supervisor** (:class:`MemberProcess`): the started process, its end
of the pipe, what the member reported, and how the process ended.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from typing import Any, TypeAlias

from .._consumer import LitePushConsumer
from .._errors import ConfigError
from .._state.shared import error_line

__all__ = [
    "MemberError",
    "MemberFactory",
    "MemberFinished",
    "MemberProcess",
    "MemberProgress",
    "MemberStarted",
    "MemberState",
    "describe_exit",
    "run_member",
]

logger = logging.getLogger(__name__)

#: Called in each member process with the member's index (0 .. processes-1):
#: an unstarted, subscribed :class:`~lite_push.LitePushConsumer`, or a
#: context manager that yields one (and closes what the consumer needs, a
#: broker, on exit).
MemberFactory: TypeAlias = Callable[[int], "LitePushConsumer | AbstractContextManager[LitePushConsumer]"]

#: How often a member looks whether its consumer failed or its supervisor left.
MEMBER_POLL = 0.2
#: How often (seconds) a running member reports its consumed count, when it
#: changed.
PROGRESS_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class MemberStarted:
    """The member's consumer started; ``metrics_url`` is its ``/metrics``
    (``None`` without metrics)."""

    pid: int
    metrics_url: str | None


@dataclass(frozen=True, slots=True)
class MemberError:
    """The factory, the checks or the start raised ``error`` (one line)."""

    error: str


@dataclass(frozen=True, slots=True)
class MemberProgress:
    """What the member's consumer has consumed so far (sent every
    :data:`PROGRESS_INTERVAL` while it changes)."""

    consumed: int


@dataclass(frozen=True, slots=True)
class MemberFinished:
    """The member's consumer stopped: what it consumed, whether everything
    finished within the shutdown timeout, and its failure, if any."""

    consumed: int
    drained: bool
    failure: str | None
    #: What the stop committed and what comes back (``StopReport.summary``).
    commits: str = ""


Report: TypeAlias = MemberStarted | MemberError | MemberProgress | MemberFinished


@dataclass(frozen=True, slots=True)
class MemberState:
    """A read-only view of one member (:attr:`ProcessSupervisor.members`)."""

    #: 0 .. processes-1: the argument of the factory.
    index: int
    #: The PID of its process now (``None`` while it waits for a restart, or
    #: after the supervisor stopped).
    pid: int | None
    #: Whether its process is running.
    alive: bool
    #: Whether its consumer started (the member said so over its pipe).
    ready: bool
    #: How many times the supervisor started it again after it died.
    restarts: int
    #: Its consumer's ``/metrics`` URL once ready (with metrics on).
    metrics_url: str | None
    #: How its previous process ended (``"killed by SIGKILL"``,
    #: ``"exit code 1: ValueError: ..."``), ``None`` if none ended yet.
    last_exit: str | None
    #: Messages its processes consumed, the ended ones included, as they
    #: last reported (a running one every :data:`PROGRESS_INTERVAL`).
    consumed: int = 0
    #: False once one of its processes ended without reporting its final
    #: count (killed): ``consumed`` then counts that one as of its last
    #: report, and may be short.
    consumed_exact: bool = True
    #: What its last process's stop committed and left to come back (one
    #: line, see ``StopReport.summary``; or that it was stopped before its
    #: consumer started); ``None`` before it stopped, or when it ended
    #: without saying (killed, failed).
    commits: str | None = None


def describe_exit(exitcode: int | None) -> str:
    """``"exit code 1"`` or ``"killed by SIGKILL"`` for a process's exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


# -- in the member process ------------------------------------------------------------


def run_member(
    factory: MemberFactory, index: int, conn: Connection, serve_metrics: bool, shutdown_timeout: float
) -> None:
    """The member process's body (see the module docstring); exits with 0
    (drained, committed) or 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before any thread starts
    code = 1
    try:
        code = _serve(factory, index, conn, serve_metrics, shutdown_timeout)
    except Exception as e:
        logger.error("member %d (pid %d) failed: %s: %s", index, os.getpid(), type(e).__name__, e, exc_info=True)
        _report(conn, MemberError(error_line(e)))
    finally:
        conn.close()
    sys.exit(code)


def _report(conn: Connection, report: Report) -> None:
    try:
        conn.send(report)
    except OSError:  # the supervisor is gone
        logger.debug("could not report %r to the supervisor", report, exc_info=True)


def _check_metrics(consumer: LitePushConsumer, serve_metrics: bool) -> None:
    port = consumer.config.metrics_port
    if serve_metrics and port != 0:
        raise ConfigError(
            "metrics_port",
            f"the supervisor serves the members' metrics, so a member's consumer must serve its own on "
            f"metrics_port=0 (any free port, metrics_addr='127.0.0.1'), got {port!r}",
        )


def _serve(factory: MemberFactory, index: int, conn: Connection, serve_metrics: bool, timeout: float) -> int:
    with ExitStack() as stack:
        made: Any = factory(index)
        if not isinstance(made, LitePushConsumer) and isinstance(made, AbstractContextManager):
            made = stack.enter_context(made)  # (a consumer is a context manager too: one that starts it)
        if not isinstance(made, LitePushConsumer):
            raise ConfigError(
                "factory", f"must return a LitePushConsumer (or a context manager of one), got {type(made).__name__}"
            )
        consumer = made
        try:
            _check_metrics(consumer, serve_metrics)
            consumer.start()
            _report(conn, MemberStarted(os.getpid(), consumer.metrics_url))
            why = _wait_for_stop(consumer, conn)
            what = "everything polled" if consumer.config.drain_on_shutdown else "the listener calls running"
            logger.info("member %d (pid %d): %s; waiting up to %gs for %s", index, os.getpid(), why, timeout, what)
        finally:  # explicitly (no atexit in a multiprocessing child); unstarted, it closes the source
            hurry = threading.Thread(target=_hurry_on_sigterm, args=(consumer,), daemon=True)
            hurry.start()
            drained = consumer.shutdown(timeout)
    st = consumer.stats()
    report = consumer.stop_report
    commits = report.summary() if report is not None else ""
    if report is not None:
        logger.info("member %d (pid %d) stopped: consumed %s; %s", index, os.getpid(), f"{st.consumed:,}", commits)
    _report(conn, MemberFinished(st.consumed, drained, st.failure, commits))
    return 0 if drained and st.failure is None else 1


def _hurry_on_sigterm(consumer: LitePushConsumer) -> None:
    """While the member stops: a second SIGTERM (the supervisor's second
    Ctrl-C) stops it at once (SIGTERM stays blocked, so waiting here is
    safe from any thread)."""
    while consumer.stop_report is None:
        if signal.sigtimedwait({signal.SIGTERM}, MEMBER_POLL) is not None:
            logger.info("member (pid %d): SIGTERM again, stopping at once", os.getpid())
            consumer.stop_now()
            return


def _wait_for_stop(consumer: LitePushConsumer, conn: Connection) -> str:
    """Block until SIGTERM, a consumer failure or the supervisor's end of
    the pipe closing; say which.  Meanwhile report the consumed count every
    :data:`PROGRESS_INTERVAL` when it changed."""
    reported = 0
    next_report = time.monotonic() + PROGRESS_INTERVAL
    while True:
        if signal.sigtimedwait({signal.SIGTERM}, MEMBER_POLL) is not None:
            return "SIGTERM"
        now = time.monotonic()
        if now >= next_report:
            next_report = now + PROGRESS_INTERVAL
            consumed = consumer.stats().consumed
            if consumed != reported:
                reported = consumed
                _report(conn, MemberProgress(consumed))
        if consumer.failure is not None:
            return f"the consumer failed ({type(consumer.failure).__name__})"
        if conn.poll(0):  # the supervisor never writes: this is its end closing
            return "the supervisor is gone"


# -- in the supervisor ----------------------------------------------------------------


class MemberProcess:
    """A started member process and the supervisor's end of its pipe.
    Only the supervisor's monitor thread uses it."""

    def __init__(
        self,
        ctx: SpawnContext,
        factory: MemberFactory,
        index: int,
        serve_metrics: bool,
        shutdown_timeout: float,
    ) -> None:
        here, there = ctx.Pipe()
        self.index = index
        self.process = ctx.Process(
            target=run_member,
            args=(factory, index, there, serve_metrics, shutdown_timeout),
            name=f"lite-push-member-{index}",
        )
        self.process.start()
        there.close()
        self.conn: Connection | None = here
        self.pid: int = self.process.pid or 0
        #: Set by :meth:`read` from what the member reported.
        self.started: MemberStarted | None = None
        self.error: str | None = None
        self.finished: MemberFinished | None = None
        #: What it consumed, as it last reported (progress or final count).
        self.consumed = 0

    @property
    def sentinel(self) -> int:
        """Ready (for ``multiprocessing.connection.wait``) once the process ended."""
        return self.process.sentinel

    def waitables(self) -> list[Any]:
        """The pipe (while open) and the process sentinel (while it runs)."""
        out: list[Any] = [] if self.conn is None else [self.conn]
        if self.process.exitcode is None:
            out.append(self.process.sentinel)
        return out

    def read(self) -> list[Report]:
        """Everything the member reported since the last call (and note it)."""
        reports: list[Report] = []
        while self.conn is not None and self.conn.poll(0):
            try:
                report = self.conn.recv()
            except (EOFError, OSError):
                self.conn.close()
                self.conn = None
                break
            if isinstance(report, MemberStarted):
                self.started = report
            elif isinstance(report, MemberError):
                self.error = report.error
            elif isinstance(report, MemberProgress):
                self.consumed = report.consumed
            elif isinstance(report, MemberFinished):
                self.finished = report
                self.consumed = report.consumed
            reports.append(report)
        return reports

    def exited(self) -> bool:
        """Whether the process ended (reaps it)."""
        return self.process.exitcode is not None

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def exit_text(self) -> str:
        """How the process ended, and why when the member said so."""
        text = describe_exit(self.process.exitcode)
        finished = self.finished
        if self.error:
            return f"{text}: {self.error}"
        if finished is not None and finished.failure is not None:
            return f"{text}: the consumer failed: {finished.failure}"
        if finished is not None and not finished.drained:
            return f"{text}: not everything finished within the shutdown timeout"
        return text

    def terminate(self) -> None:
        """SIGTERM: stop polling, drain, commit, exit."""
        if self.process.exitcode is None:
            self.process.terminate()

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(10.0)

    def close(self) -> None:
        """Read what is left and release the pipe."""
        self.read()
        if self.conn is not None:
            self.conn.close()
            self.conn = None

"""``lite-push consume``: run a listener (``module:function``) as a service.

It loads the listener, builds a :class:`~lite_push.LitePushConsumer` from the
settings, and runs it until SIGINT or SIGTERM; then it stops polling, lets
the listener calls running finish (``--drain``: everything polled; up to
``--shutdown-timeout``), commits what finished and exits 0; 1 when not
everything started finished or a commit was not taken (the last line says
which queues the next start resumes where).  A second signal stops at once:
exit 130.  An ``async def`` listener runs on the asyncio executor, on an
event loop of the consumer's own: the command serves both executors the same
way.  With ``--processes N`` (N > 1) it runs N member processes of the group
instead (:mod:`lite_push.cli.consume_processes`); the consumer is built the
same way (:mod:`lite_push.cli.plan`) in each.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import IO

from .._consumer import LitePushConsumer
from .._core.shutdown import StopReport
from .._core.signals import EXIT_INTERRUPTED, StopOnSignal
from .consume_processes import consume_processes
from .from_notice import note_from
from .plan import FROM, banner, load_listener, opened, plan_of
from .process_gc import prepare_gc
from .progress import Status

__all__ = ["FROM", "cmd_consume", "load_listener", "stopped_line"]

logger = logging.getLogger(__name__)

#: How often the command looks whether the consumer failed (seconds).
FAILURE_POLL = 0.2


def _announce(consumer: LitePushConsumer, out: IO[str]) -> None:
    config = consumer.config
    if config.metrics_port is None:
        return
    url = consumer.metrics_url or f"http://{config.metrics_addr}:{config.metrics_port}/metrics"
    print(f"metrics: {url}", file=out, flush=True)


def _serve(consumer: LitePushConsumer, timeout: float, out: IO[str], status: Status | None = None) -> bool:
    """Run ``consumer`` until SIGINT/SIGTERM (or its failure), then stop it:
    whether a second signal hurried the stop."""

    def again(name: str) -> None:
        print(f"{name} again: stopping at once (not waiting for the calls running)", file=out, flush=True)
        consumer.stop_now()

    stop = StopOnSignal(on_again=again)
    stop.install()
    try:
        prepare_gc()
        # on failure the caller's broker.close() closes the source
        consumer.start()
        try:
            _wait(consumer, stop, timeout, out, status)
        except BrokenPipeError:  # the reader of stdout went away: stop as on SIGTERM; main exits 141
            consumer.shutdown(timeout=timeout)
            raise
        consumer.shutdown(timeout=timeout)
        return stop.again.is_set()
    finally:
        stop.restore()


def _wait(consumer: LitePushConsumer, stop: StopOnSignal, timeout: float, out: IO[str], status: Status | None) -> None:
    """Say the consumer runs; wait for a signal or its failure; say which."""
    _announce(consumer, out)
    how = "drain, commit, exit" if consumer.config.drain_on_shutdown else "finish the calls running, commit, exit"
    print(f"consuming; SIGTERM or Ctrl-C stops ({how}; twice: at once)", file=out, flush=True)
    while not stop.event.wait(FAILURE_POLL):
        if consumer.failure is not None:  # logged with its traceback already
            print(f"consumer failed: {consumer.stats().failure}; stopping", file=out, flush=True)
            return
        if status is not None:
            status.tick(consumer.stats())
    what = "everything polled" if consumer.config.drain_on_shutdown else "the listener calls running"
    print(f"{stop.signal_name}: stopping (waiting up to {timeout:g}s for {what})", file=out, flush=True)


def stopped_line(consumed: int, report: StopReport | None, timeout: float) -> str:
    """The last line of ``consume``: what was consumed, and what the stop
    committed (read back from the source) and left to come back."""
    if report is None:
        return f"stopped: consumed {consumed:,}; the stop did not finish (what is not committed comes back)"
    late = "" if report.finished else f"; not everything started finished within {timeout:g}s"
    return f"stopped: consumed {consumed:,}{late}; {report.summary()}"


def cmd_consume(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan, listener, processes = plan_of(args)
    if processes > 1:
        return consume_processes(plan, listener, processes, args.shutdown_timeout)
    out = sys.stdout
    with opened(plan, listener) as built:
        note_from(plan, built.broker)
        print(banner(plan), flush=True)
        show = args.progress == "on" or (args.progress == "auto" and out.isatty())
        status = Status(out, built.source) if show else None
        hurried = _serve(built.consumer, args.shutdown_timeout, out, status)
        st = built.consumer.stats()
        report = built.consumer.stop_report
    if st.failure is not None:
        print(f"stopped: the consumer failed ({st.failure}); consumed {st.consumed:,}", flush=True)
        return 1
    print(stopped_line(st.consumed, report, args.shutdown_timeout), flush=True)
    if hurried:
        return EXIT_INTERRUPTED
    return 0 if report is not None and report.clean else 1

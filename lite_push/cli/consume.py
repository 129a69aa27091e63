"""``lite-push consume``: run a listener (``module:function``) as a service.

It loads the listener, builds a :class:`~lite_push.LitePushConsumer` from the
settings, and runs it until SIGINT or SIGTERM; then it stops polling, drains
(up to ``--shutdown-timeout``), commits and exits 0 (1 when not everything
finished).  An ``async def`` listener runs on the asyncio executor, on an
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
from .._signals import StopOnSignal
from .consume_processes import consume_processes
from .from_notice import note_from
from .plan import FROM, banner, load_listener, opened, plan_of
from .process_gc import prepare_gc
from .progress import Status

__all__ = ["FROM", "cmd_consume", "load_listener"]

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
    stop = StopOnSignal()
    stop.install()
    try:
        prepare_gc()
        # on failure the caller's broker.close() closes the source
        consumer.start()
        _announce(consumer, out)
        print(
            "consuming; SIGTERM or Ctrl-C stops (drain, commit, exit)",
            file=out,
            flush=True,
        )
        while not stop.event.wait(FAILURE_POLL):
            if consumer.failure is not None:  # logged with its traceback already
                print(f"consumer failed: {consumer.stats().failure}; stopping", file=out, flush=True)
                break
            if status is not None:
                status.tick(consumer.stats())
        else:
            print(
                f"{stop.signal_name}: stopping (draining up to {timeout:g}s)",
                file=out,
                flush=True,
            )
        return consumer.shutdown(timeout=timeout)
    finally:
        stop.restore()


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
        drained = _serve(built.consumer, args.shutdown_timeout, out, status)
        st = built.consumer.stats()
    if st.failure is not None:
        print(f"stopped: the consumer failed ({st.failure}); consumed {st.consumed:,}", flush=True)
        return 1
    if not drained:
        print(
            f"stopped: consumed {st.consumed:,}; not everything finished within {args.shutdown_timeout:g}s "
            "(the rest is delivered again)",
            flush=True,
        )
        return 1
    print(f"stopped: consumed {st.consumed:,}, offsets committed", flush=True)
    return 0

"""``lite-push consume --processes N``: N member processes of one group.

A :class:`~lite_push.ProcessSupervisor` runs N member processes of the
group on the shared source; each builds and runs what the single-process
command does (:func:`member_consumer`: the same listener loading, source
opening, consumer construction and subscription, :mod:`lite_push.cli.plan`),
without the progress line.  The source must be one that processes share:
``redis://`` and ``kafka://`` are, ``embedded:`` is not (its files belong to
the one process that opened them) and is refused.

Before it starts any member the command checks what it can here, so a typo
fails at once with the single-process command's one line and exit status
rather than as a crash loop: the listener imports, the settings make a
ConsumerConfig, the source answers (a Redis ping, Kafka's metadata), the
topic exists and the tag filter parses.

With ``--metrics-port`` the supervisor serves every member's metrics
(labelled ``member="<index>"``) and their health on that one port, and each
member's consumer serves its own on a free loopback port; without it the
members serve none.  The supervisor prints the banner, the metrics URL,
``SIGTERM: stopping N members ...`` on a signal, and at the end the total
the members consumed (a member killed before its final count counted as of
its last report, and the line says so) and what each member's stop
committed (read back from the source) and left to come back; exit status 0
when every member stopped cleanly with its commits taken, 1 otherwise (a
member that did not stop in time or whose commit was refused, a crash
loop), 130 after a second signal (the members stopped at once).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from .._consumer import LitePushConsumer
from .._core.signals import EXIT_INTERRUPTED, StopOnSignal
from ..sources._common import parse_tag_expression
from ..supervisor import ProcessSupervisor
from .errors import CliError
from .from_notice import note_from
from .plan import ConsumePlan, banner, load_listener, opened
from .process_gc import prepare_gc

__all__ = ["check_plan", "consume_processes", "member_consumer", "stopped_line"]


@contextmanager
def member_consumer(plan: ConsumePlan, serve_metrics: bool, index: int) -> Iterator[LitePushConsumer]:
    """The supervisor's factory (run in member process ``index``): the
    plan's consumer, built as the single-process command builds it, with its
    metrics on a free loopback port when the supervisor serves them (else
    none); the broker is closed after the consumer."""
    logging.basicConfig(level=plan.log_level, format=f"%(asctime)s %(levelname)s member {index} %(name)s: %(message)s")
    listener = load_listener(plan.spec)
    if serve_metrics:
        config = replace(plan.config, metrics_port=0, metrics_addr="127.0.0.1")
    else:
        config = replace(plan.config, metrics_port=None)
    with opened(plan, listener, config) as built:
        prepare_gc()
        yield built.consumer


def check_plan(plan: ConsumePlan, listener: Callable[..., Any], processes: int) -> None:
    """What can fail before any member starts: a source processes cannot
    share, a source that does not answer, an unknown topic, a bad tag filter,
    a config the consumer refuses (:class:`CliError` or
    :class:`~lite_push.ConfigError`, as the single-process command raises)."""
    if plan.url.startswith("embedded:"):
        raise CliError(
            f"--processes {processes}: an embedded: source belongs to the one process that opens it; "
            "member processes share redis:// and kafka:// sources"
        )
    try:
        parse_tag_expression(plan.tags)
    except ValueError as e:
        raise CliError(f"tags {plan.tags!r}: {e}") from None
    with opened(plan, listener, subscribe=False) as built:
        try:
            if not plan.topic.startswith("^"):  # a Kafka pattern names no one topic
                built.broker.queues(plan.topic)
            note_from(plan, built.broker)
        finally:
            built.consumer.shutdown(0.0)  # never started: closes its source, joins nothing


def consume_processes(plan: ConsumePlan, listener: Callable[..., Any], processes: int, shutdown_timeout: float) -> int:
    """Run ``processes`` members of the plan until SIGTERM or SIGINT (see the
    module docstring); the exit status."""
    check_plan(plan, listener, processes)
    config = plan.config
    supervisor = ProcessSupervisor(
        partial(member_consumer, plan, config.metrics_port is not None),
        processes,
        metrics_port=config.metrics_port,
        metrics_addr=config.metrics_addr,
        shutdown_timeout=shutdown_timeout,
    )
    out = sys.stdout

    what = "everything polled" if config.drain_on_shutdown else "the listener calls running"

    def on_signal(name: str) -> None:
        print(
            f"{name}: stopping {processes} members (waiting up to {shutdown_timeout:g}s for {what})",
            file=out,
            flush=True,
        )
        supervisor.stop()

    def on_again(name: str) -> None:
        print(f"{name} again: stopping the members at once", file=out, flush=True)
        supervisor.stop_now()

    print(banner(plan, processes), file=out, flush=True)
    signals = StopOnSignal(on_signal, on_again)
    signals.install()
    try:
        supervisor.start()
        if supervisor.metrics_url is not None:
            print(f"metrics: {supervisor.metrics_url}", file=out, flush=True)
        print("consuming; SIGTERM or Ctrl-C stops (twice: at once)", file=out, flush=True)
        code = supervisor.wait()
    finally:
        signals.restore()
    print(stopped_line(supervisor, code), file=out, flush=True)
    if signals.again.is_set():
        return EXIT_INTERRUPTED
    return 1 if code is None else code


def stopped_line(supervisor: ProcessSupervisor, code: int | None) -> str:
    """The last line of ``consume --processes``: how it stopped and what the
    members consumed, saying whose count is as of a last report (a member
    killed before its final count)."""
    short = supervisor.consumed_short
    why = ""
    if short:
        members = ", ".join(map(str, short))
        if len(short) == 1:
            why = f"; the count of member {members}, killed, is as of its last report"
        else:
            why = f"; the counts of members {members}, killed, are as of their last reports"
    consumed = f"consumed {supervisor.consumed:,} ({supervisor.processes} members{why})"
    commits = "; ".join(
        f"member {m.index}: {m.commits or 'did not say what it committed (see the log)'}" for m in supervisor.members
    )
    if supervisor.failure is not None:
        return f"stopped: {supervisor.failure}; {consumed}; {commits}"
    if code != 0:
        return f"stopped: {consumed}; a member did not stop cleanly (see the log); {commits}"
    return f"stopped: {consumed}; {commits}"

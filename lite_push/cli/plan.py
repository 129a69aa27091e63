"""What ``lite-push consume`` runs, and building it: the one construction
path of the single-process command and of every member process of
``--processes N``.

:func:`plan_of` turns the command's settings into a :class:`ConsumePlan`
(picklable: a member process receives it) and loads the listener;
:func:`opened` opens the source the plan names, pings it (Redis), makes the
pull source and the :class:`~lite_push.LitePushConsumer` and subscribes it,
and closes the broker at the end.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._config import ConsumerConfig
from .._consumer import LitePushConsumer
from .._core.listeners import is_async_callable, resolve_executor, signature_problem
from .._errors import LitePushError
from ..sources import Balance, ConsumeFromWhere, PullSource
from .errors import CliError
from .settings import KafkaValue, require, settings_of
from .sources import Broker, open_source, redact, source_errors

__all__ = ["FROM", "ConsumePlan", "Opened", "banner", "load_listener", "opened", "plan_of"]

#: ``--from`` values: where a group with no committed offset starts.
FROM = {"first": "FIRST_OFFSET", "last": "LAST_OFFSET"}

#: The settings ``consume`` reads from its flags.
CONFIG_FLAGS = (
    "source",
    "group",
    "topic",
    "listener",
    "tags",
    "from",
    "mode",
    "lanes",
    "lane_placement",
    "executor",
    "metrics_port",
    "metrics_addr",
    "processes",
    "max_rate",
    "key_min_interval",
    "balance",
    "dead_letter_order",
    "drain_on_shutdown",
    "tracing",
)


def load_listener(spec: str) -> Callable[..., Any]:
    """Import the listener ``module:function`` (``function`` may be a dotted
    path, ``module:obj.method``), with the current directory on
    ``sys.path``.  Raises :class:`CliError` naming what is wrong when the
    spec is malformed, the module does not import, the attribute is
    missing or not callable, or its signature cannot take the one argument
    a listener is called with (the list of messages)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliError(f"listener {spec!r}: expected module:function")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise CliError(f"listener {spec!r}: no module named {e.name!r}") from None
        raise CliError(f"listener {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise CliError(f"listener {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    path = module_name
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"listener {spec!r}: {path!r} has no attribute {part!r}") from None
        path += ("." if path != module_name else ":") + part
    if not callable(obj):
        raise CliError(f"listener {spec!r} is not callable (it is a {type(obj).__name__})")
    problem = signature_problem(obj)
    if problem is not None:
        raise CliError(f"listener {spec!r}: {problem}")
    return obj  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class ConsumePlan:
    """Everything ``consume`` needs to build its consumer, checked: the
    source URL (and its ``[source.kafka]`` settings), the subscription, the
    listener's ``module:function``, the consumer's config, the log level,
    and how the source balances the group (``balance``)."""

    url: str
    topic: str
    tags: str
    start: str
    spec: str
    config: ConsumerConfig
    log_level: str = "INFO"
    kafka: dict[str, KafkaValue] = field(default_factory=dict)
    balance: Balance = Balance.QUEUE
    #: Whether ``--from`` (or LITE_PUSH_FROM, or the file's ``from``) was
    #: given, rather than the default (see :mod:`lite_push.cli.from_notice`).
    from_given: bool = False


def plan_of(args: argparse.Namespace) -> tuple[ConsumePlan, Callable[..., Any], int]:
    """The plan of ``consume``'s flags, environment and ``--config`` file,
    its loaded listener (an ``async def`` one picks the asyncio executor
    unless told otherwise) and the number of processes.  Raises
    :class:`CliError` or :class:`~lite_push.ConfigError` naming what is
    missing or wrong."""
    settings = settings_of(args, CONFIG_FLAGS)
    url = require(settings, "source", "--source")
    require(settings, "group", "--group")
    topic = require(settings, "topic", "--topic")
    spec = require(settings, "listener", "--listener")
    start = (settings.get("from") or "last").lower()
    if start not in FROM:
        raise CliError(f"from: must be first or last, got {settings.get('from')!r}")
    listener = load_listener(spec)
    overrides: dict[str, Any] = {}
    if settings.consumer.get("executor") is None:  # not told: by the listener, as the API does
        overrides["executor"] = "asyncio" if is_async_callable(listener) else "thread"
    config = settings.consumer_config(**overrides)
    resolve_executor(config, listener)  # an executor that does not fit the listener: before any source is asked
    plan = ConsumePlan(
        url=url,
        topic=topic,
        tags=settings.get("tags") or "*",
        start=start,
        spec=spec,
        config=config,
        log_level=args.log_level,
        kafka=dict(settings.kafka),
        balance=settings.balance,
        from_given=settings.get("from") is not None,
    )
    return plan, listener, settings.processes


def banner(plan: ConsumePlan, processes: int = 1) -> str:
    """The line ``consume`` prints once its consumer (or supervisor) is built."""
    c = plan.config
    lanes = f"{c.lanes} lanes" + (" per process" if processes > 1 else "")
    return (
        f"lite-push consume: group {c.group!r} topic {plan.topic!r} tags {plan.tags!r} "
        f"from {redact(plan.url)} ({c.consume_mode.name}, {lanes}, executor {c.executor}, listener {plan.spec}"
        + (f", balance {plan.balance.name.lower()}" if plan.balance is not Balance.QUEUE else "")
        + (f", {processes} processes)" if processes > 1 else ")")
    )


class Opened(NamedTuple):
    """What :func:`opened` built."""

    broker: Broker
    source: PullSource
    consumer: LitePushConsumer


@contextmanager
def opened(
    plan: ConsumePlan,
    listener: Callable[..., Any],
    config: ConsumerConfig | None = None,
    *,
    subscribe: bool = True,
) -> Iterator[Opened]:
    """Open the plan's source (a Redis server that is not there fails here),
    make the pull source and the consumer (with ``config``, the plan's by
    default) and subscribe it (unless ``subscribe`` is false); close the
    broker at the end.  What the source raises, here or in the ``with``
    body, becomes a one-line :class:`CliError` (exit status 1)."""
    config = plan.config if config is None else config
    broker = open_source(plan.url, plan.kafka)
    try:
        with source_errors(plan.url, broker):
            client = getattr(broker, "client", None)
            if client is not None:  # Redis: fail fast when the server is not there
                client.ping()
            # balance= only when it is not the default: the embedded and Kafka
            # sources refuse MESSAGE (ConfigError naming balance), and not
            # every source's pull_consumer takes the argument.
            balance: dict[str, Any] = {} if plan.balance is Balance.QUEUE else {"balance": plan.balance}
            source = broker.pull_consumer(config.group, consume_from=ConsumeFromWhere[FROM[plan.start]], **balance)
            try:
                consumer = LitePushConsumer(config, source=source, listener=listener)
                if subscribe:
                    try:
                        consumer.subscribe(plan.topic, plan.tags)
                    except ValueError as e:
                        if isinstance(e, LitePushError):
                            raise
                        raise CliError(f"tags {plan.tags!r}: {e}") from None
            except BaseException:
                source.close()
                raise
            yield Opened(broker, source, consumer)
    finally:
        broker.close()

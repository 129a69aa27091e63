"""``lite-push consume``: run a listener (``module:function``) as a service.

It loads the listener, builds a :class:`~lite_push.LitePushConsumer` from the
settings, and runs it until SIGINT or SIGTERM; then it stops polling, drains
(up to ``--shutdown-timeout``), commits and exits 0 (1 when not everything
finished).  An ``async def`` listener runs on the asyncio executor, on an
event loop of the consumer's own: the command serves both executors the same
way.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import IO, Any

from .._consumer import LitePushConsumer
from .._consumer_core import is_async_callable
from .._errors import LitePushError
from ..sources import ConsumeFromWhere
from .errors import CliError
from .progress import Status
from .settings import require, settings_of
from .sources import open_source, redact, source_errors

__all__ = ["FROM", "cmd_consume", "load_listener"]

logger = logging.getLogger(__name__)

#: How often the command looks whether the consumer failed (seconds).
FAILURE_POLL = 0.2
#: ``--from`` values: where a group with no committed offset starts.
FROM = {"first": "FIRST_OFFSET", "last": "LAST_OFFSET"}


def load_listener(spec: str) -> Callable[..., Any]:
    """Import the listener ``module:function`` (``function`` may be a dotted
    path, ``module:obj.method``), with the current directory on
    ``sys.path``.  Raises :class:`CliError` naming what is wrong when the
    spec is malformed, the module does not import, or the attribute is
    missing or not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliError(f"listener {spec!r}: expected module:function")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (
            module_name == e.name or module_name.startswith(e.name + ".")
        ):
            raise CliError(f"listener {spec!r}: no module named {e.name!r}") from None
        raise CliError(
            f"listener {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    except Exception as e:
        raise CliError(
            f"listener {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    path = module_name
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"listener {spec!r}: {path!r} has no attribute {part!r}"
            ) from None
        path += ("." if path != module_name else ":") + part
    if not callable(obj):
        raise CliError(
            f"listener {spec!r} is not callable (it is a {type(obj).__name__})"
        )
    return obj  # type: ignore[no-any-return]


class _StopOnSignal:
    """SIGINT/SIGTERM set :attr:`event`.  The handler sets it from a short
    helper thread: the main thread may be inside ``event.wait()`` holding
    the event's lock when the handler runs, and ``Event.set`` in the
    handler itself could then deadlock."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            threading.Thread(
                target=self.event.set, name="lite-push-stop", daemon=True
            ).start()
        else:
            logger.warning("%s: already stopping", signal.Signals(signum).name)


def _announce(consumer: LitePushConsumer, out: IO[str]) -> None:
    config = consumer.config
    if config.metrics_port is None:
        return
    url = consumer.metrics_url or f"http://{config.metrics_addr}:{config.metrics_port}/metrics"
    print(f"metrics: {url}", file=out, flush=True)


def _serve(consumer: LitePushConsumer, timeout: float, out: IO[str], status: Status | None = None) -> bool:
    stop = _StopOnSignal()
    stop.install()
    try:
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
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_of(
        args, ("source", "group", "topic", "listener", "tags", "from", "mode", "lanes", "lane_placement", "executor")
        + ("metrics_port", "metrics_addr")
    )  # fmt: skip
    url = require(settings, "source", "--source")
    require(settings, "group", "--group")
    topic = require(settings, "topic", "--topic")
    spec = require(settings, "listener", "--listener")
    tags = settings.get("tags") or "*"
    start = (settings.get("from") or "last").lower()
    if start not in FROM:
        raise CliError(f"from: must be first or last, got {settings.get('from')!r}")
    listener = load_listener(spec)

    overrides: dict[str, Any] = {}
    if "executor" not in settings.consumer and is_async_callable(listener):
        overrides["executor"] = "asyncio"  # an async def listener, executor not told
    config = settings.consumer_config(**overrides)
    broker = open_source(url, settings.kafka)
    out = sys.stdout
    try:
        with source_errors(url):
            client = getattr(broker, "client", None)
            if client is not None:  # Redis: fail fast when the server is not there
                client.ping()
            source = broker.pull_consumer(
                config.group, consume_from=ConsumeFromWhere[FROM[start]]
            )
            try:
                consumer = LitePushConsumer(config, source=source, listener=listener)
                try:
                    consumer.subscribe(topic, tags)
                except ValueError as e:
                    if isinstance(e, LitePushError):
                        raise
                    raise CliError(f"tags {tags!r}: {e}") from None
            except BaseException:
                source.close()
                raise
            print(
                f"lite-push consume: group {config.group!r} topic {topic!r} tags {tags!r} "
                f"from {redact(url)} ({config.mode.name}, {config.lanes} lanes, executor {config.executor}, "
                f"listener {spec})",
                flush=True,
            )
            show = args.progress == "on" or (args.progress == "auto" and out.isatty())
            drained = _serve(consumer, args.shutdown_timeout, out, Status(out, source) if show else None)
            st = consumer.stats()
    finally:
        broker.close()
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

"""The ``lite-push`` command.

``lite-push demo``      the embedded broker, a producer and a consumer, with
                        live stats and a Prometheus endpoint
``lite-push bench``     ``benchmarks/bench.py`` (source checkout only)
``lite-push gen-load``  ``benchmarks/gen_load.py`` (source checkout only)
``lite-push consume``   run a listener (``module:function``) as a service
``lite-push dlq list``  show a group's dead letters
``lite-push dlq resend`` send dead letters back to their topics

Bad arguments and bad settings print one line, ``lite-push: error: ...``, on
stderr and exit with status 2; a source that fails at run time exits 1.
Settings of ``consume`` and ``dlq`` come from flags, ``LITE_PUSH_*``
environment variables and a TOML file, in that order of precedence (see
:mod:`lite_push._cli_config`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import textwrap
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, NoReturn

import lite_push

from ._cli_config import SERVICE_SETTINGS, Settings, env_name, load_settings
from ._errors import ConfigError, LitePushError
from .demo import _count, _non_negative_number

if TYPE_CHECKING:
    from ._consumer import LitePushConsumer
    from .dlq import DeadLetter
    from .sources.embedded import EmbeddedBroker
    from .sources.redis_streams import RedisBroker

    Broker = EmbeddedBroker | RedisBroker

__all__ = [
    "PROG",
    "CliError",
    "benchmarks_dir",
    "build_parser",
    "load_listener",
    "main",
    "open_source",
]

logger = logging.getLogger(__name__)

PROG = "lite-push"
#: The default port of ``lite-push demo``'s metrics endpoint.
DEMO_METRICS_PORT = 9464
#: Commands that hand their arguments to a benchmark script: name -> module.
PASSTHROUGH = {"bench": "bench", "gen-load": "gen_load"}
_FROM = {"first": "FIRST_OFFSET", "last": "LAST_OFFSET"}


class CliError(Exception):
    """A one-line error for the user; ``code`` is the exit status (2: bad
    arguments or settings, 1: a failure while running)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump): they
    raise :class:`CliError`, which :func:`main` prints and turns into 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog[len(PROG) :].strip()
        raise CliError(f"{command}: {message}" if command else message)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- sources ------------------------------------------------------------------


def _redact(url: str) -> str:
    """``url`` without a password (for printing)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def open_source(url: str) -> Broker:
    """The broker that ``url`` names.

    * ``redis://host:port[/db][?namespace=NS]`` (also ``rediss://``): a
      :class:`~lite_push.sources.redis_streams.RedisBroker` on that server;
      ``namespace`` is the broker's key prefix (default ``lite_push``), the
      other query parameters go to redis-py.
    * ``embedded:/path/to/dir``: the durable
      :class:`~lite_push.sources.EmbeddedBroker` stored in that existing
      directory (one process at a time may open it).

    Raises :class:`CliError` for a URL it cannot use.  Nothing is contacted
    yet: a Redis server that is down shows on first use.
    """
    if url.startswith("embedded:"):
        raw = url[len("embedded:") :].removeprefix("//")
        if not raw:
            raise CliError(f"source {url!r}: expected embedded:/path/to/dir")
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise CliError(f"source {url!r}: {path} is not a directory")
        from .sources.embedded import EmbeddedBroker

        try:
            return EmbeddedBroker(path)
        except LitePushError as e:
            raise CliError(f"source {url!r}: {e}", code=1) from None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise CliError(f"source {_redact(url)!r}: expected redis://host:port[/db]")
        try:
            from .sources.redis_streams import RedisBroker
        except ImportError:
            raise CliError(
                "redis:// sources need the redis extra: pip install 'lite-push[redis]'"
            ) from None
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        namespace = [v for k, v in query if k == "namespace"]
        rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "namespace"])
        plain = urllib.parse.urlunsplit(parts._replace(query=rest))
        try:
            if namespace:
                return RedisBroker(plain, namespace=namespace[-1])
            return RedisBroker(plain)
        except ConfigError:
            raise
        except (ValueError, TypeError) as e:
            raise CliError(f"source {_redact(url)!r}: {e}") from None
    raise CliError(
        f"source {_redact(url)!r}: expected redis://host:port[/db] or embedded:/path/to/dir"
    )


@contextmanager
def _source_errors(url: str) -> Iterator[None]:
    """Turn a source that fails at run time (unreachable Redis, ...) into a
    one-line :class:`CliError` with exit status 1."""
    try:
        yield
    except (CliError, ConfigError):
        raise
    except LitePushError as e:
        raise CliError(str(e), code=1) from None
    except Exception as e:
        try:
            import redis
        except ImportError:  # pragma: no cover - without the extra, no redis source
            raise e from None
        if isinstance(e, redis.RedisError):
            raise CliError(
                f"source {_redact(url)}: {type(e).__name__}: {e}", code=1
            ) from None
        raise


# -- listeners ----------------------------------------------------------------


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
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises, one line
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


# -- benchmarks ---------------------------------------------------------------


def benchmarks_dir() -> Path:
    """Where the benchmark scripts are: ``benchmarks/`` beside the package
    directory (the package is installed editable from the checkout)."""
    return Path(lite_push.__file__).resolve().parent.parent / "benchmarks"


def run_benchmark_script(command: str, argv: Sequence[str]) -> int:
    """Run ``benchmarks/<script>.py``'s ``main(argv)`` for ``command``
    (``bench`` or ``gen-load``); its own argument parsing, ``--help``
    included, applies.  Returns its exit status."""
    module_name = PASSTHROUGH[command]
    directory = benchmarks_dir()
    if not (directory / f"{module_name}.py").is_file():
        raise CliError(
            f"{PROG} {command} needs the source checkout (benchmarks/ not found next to lite_push/)"
        )
    entry = str(directory)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    argv0 = sys.argv[0] if sys.argv else ""
    if sys.argv:
        sys.argv[0] = f"{PROG} {command}"  # their parsers' prog
    else:
        sys.argv.append(f"{PROG} {command}")
    try:
        module = importlib.import_module(module_name)
        try:
            result = module.main(list(argv))
        except SystemExit as e:  # their --help and their argument errors
            return _exit_code(e)
        return int(result or 0)
    finally:
        sys.argv[0] = argv0
        if added and entry in sys.path:
            sys.path.remove(entry)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


# -- demo ---------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_args

    return run_args(args)


# -- settings -----------------------------------------------------------------


def _settings(args: argparse.Namespace, names: Sequence[str]) -> Settings:
    """Load the settings of a command: the flags in ``names`` that were
    given (argparse dest == setting name), the environment, ``--config``."""
    flags: dict[str, object] = {}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            flags[name] = value
    if getattr(args, "no_metrics", False):
        flags["metrics_port"] = None
    return load_settings(flags, config_file=args.config)


def _require(settings: Settings, name: str, flag: str) -> str:
    value = (
        settings.get(name) if name in SERVICE_SETTINGS else settings.consumer.get(name)
    )
    if value is None or (isinstance(value, str) and not value.strip()):
        table, key = SERVICE_SETTINGS.get(name, ("consumer", name))
        raise CliError(
            f"{flag} is required (or {env_name(name)}, or {key} in the config file's [{table}] table)"
        )
    return str(value)


# -- consume ------------------------------------------------------------------


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
    url = getattr(consumer, "metrics_url", None)
    if not isinstance(url, str):  # an exporter that does not report its URL
        url = f"http://{config.metrics_addr}:{config.metrics_port}/metrics"
    print(f"metrics: {url}", file=out, flush=True)


def _serve_threads(consumer: LitePushConsumer, timeout: float, out: IO[str]) -> bool:
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
        stop.event.wait()
        print(
            f"{stop.signal_name}: stopping (draining up to {timeout:g}s)",
            file=out,
            flush=True,
        )
        return consumer.shutdown(timeout=timeout)
    finally:
        stop.restore()


def _serve_asyncio(consumer: LitePushConsumer, timeout: float, out: IO[str]) -> bool:
    from ._async_consumer import AsyncLitePushConsumer
    from ._async_executor import uvloop_available

    assert isinstance(consumer, AsyncLitePushConsumer)

    async def serve() -> bool:
        stopped = asyncio.Event()
        caught: list[str] = []
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            caught.append(sig.name)
            stopped.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        # on failure the caller's broker.close() closes the source
        await consumer.start()
        try:
            _announce(consumer, out)
            print(
                "consuming; SIGTERM or Ctrl-C stops (drain, commit, exit)",
                file=out,
                flush=True,
            )
            await stopped.wait()
            print(
                f"{caught[0]}: stopping (draining up to {timeout:g}s)",
                file=out,
                flush=True,
            )
        finally:
            drained = await consumer.shutdown(timeout)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return drained

    if uvloop_available():
        import uvloop

        return uvloop.run(serve())
    return asyncio.run(serve())


def _cmd_consume(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = _settings(
        args, ("source", "group", "topic", "listener", "tags", "from", "mode", "lanes", "executor")
        + ("metrics_port", "metrics_addr")
    )  # fmt: skip
    url = _require(settings, "source", "--source")
    _require(settings, "group", "--group")
    topic = _require(settings, "topic", "--topic")
    spec = _require(settings, "listener", "--listener")
    tags = settings.get("tags") or "*"
    start = (settings.get("from") or "last").lower()
    if start not in _FROM:
        raise CliError(f"from: must be first or last, got {settings.get('from')!r}")
    listener = load_listener(spec)

    from ._consumer import LitePushConsumer
    from ._consumer_core import is_async_callable
    from .sources import ConsumeFromWhere

    overrides: dict[str, Any] = {}
    if "executor" not in settings.consumer and is_async_callable(listener):
        overrides["executor"] = "asyncio"  # an async def listener, executor not told
    config = settings.consumer_config(**overrides)
    broker = open_source(url)
    out = sys.stdout
    try:
        with _source_errors(url):
            client = getattr(broker, "client", None)
            if client is not None:  # Redis: fail fast when the server is not there
                client.ping()
            source = broker.pull_consumer(
                config.group, consume_from=ConsumeFromWhere[_FROM[start]]
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
                f"from {_redact(url)} ({config.mode.name}, {config.lanes} lanes, executor {config.executor}, "
                f"listener {spec})",
                flush=True,
            )
            drained = _serve_threads(consumer, args.shutdown_timeout, out)
            st = consumer.stats()
    finally:
        broker.close()
    if not drained:
        print(
            f"stopped: consumed {st.consumed:,}; not everything finished within {args.shutdown_timeout:g}s "
            "(the rest is delivered again)",
            flush=True,
        )
        return 1
    print(f"stopped: consumed {st.consumed:,}, offsets committed", flush=True)
    return 0


# -- dlq ----------------------------------------------------------------------


def _dlq_source(args: argparse.Namespace) -> tuple[Broker, str, str]:
    settings = _settings(args, ("source", "group"))
    url = _require(settings, "source", "--source")
    group = _require(settings, "group", "--group").strip()
    if not group:
        raise CliError("group: must be a non-empty string")
    return open_source(url), url, group


def _dl_line(dl: DeadLetter) -> str:
    """One line for ``dlq list``; of a traceback only its last line (the
    exception) is shown."""
    lines = [line for line in dl.exception.splitlines() if line.strip()]
    exc = _one_line(lines[-1]) if lines else ""
    if len(exc) > 200:
        exc = exc[:197] + "..."
    return (
        f"offset={dl.message.queue_offset} origin={dl.origin_topic}/{dl.origin_queue_id}/{dl.origin_offset} "
        f"msg_id={dl.origin_msg_id} reconsume_times={dl.reconsume_times} reason={_one_line(dl.reason)}"
        + (f" exception={exc}" if exc else "")
    )


def _cmd_dlq_list(args: argparse.Namespace) -> int:
    import orjson

    from .dlq import iter_dead_letters

    broker, url, group = _dlq_source(args)
    try:
        with _source_errors(url):
            stop = None if args.limit is None else args.start + args.limit
            out = sys.stdout
            for dl in iter_dead_letters(broker, group, args.start, stop):
                if args.json:
                    out.write(orjson.dumps(dl.to_dict()).decode() + "\n")
                else:
                    out.write(_dl_line(dl) + "\n")
            out.flush()
    finally:
        broker.close()
    return 0


def _cmd_dlq_resend(args: argparse.Namespace) -> int:
    from .dlq import iter_dead_letters, resend
    from .sources import dlq_topic

    broker, url, group = _dlq_source(args)
    try:
        with _source_errors(url):
            chosen: list[DeadLetter] = []
            if args.all:
                chosen = list(iter_dead_letters(broker, group))
            else:
                missing = []
                for offset in dict.fromkeys(args.offset):
                    found = list(iter_dead_letters(broker, group, offset, offset + 1))
                    if found:
                        chosen.append(found[0])
                    else:
                        missing.append(offset)
                if missing:
                    listed = ", ".join(map(str, missing))
                    raise CliError(
                        f"offset: no dead letter at offset {listed} of {dlq_topic(group)}"
                    )
            for dl in chosen:
                r = resend(broker, dl)
                print(
                    f"resent offset={dl.message.queue_offset} origin={dl.origin_topic}/{dl.origin_queue_id}/"
                    f"{dl.origin_offset} -> {r.queue.topic}/{r.queue.queue_id}/{r.offset} msg_id={r.msg_id}",
                    flush=True,
                )
    finally:
        broker.close()
    return 0


# -- the parser ---------------------------------------------------------------

_SETTINGS_EPILOG = """\
settings: a flag wins over its environment variable, which wins over the
--config file, which wins over the default.  Environment: LITE_PUSH_<FIELD>
for every ConsumerConfig field (LITE_PUSH_LANES=64, LITE_PUSH_MODE=CONCURRENTLY,
LITE_PUSH_METRICS_PORT=9464, LITE_PUSH_MAX_RECONSUME_TIMES=3, ...) and
LITE_PUSH_SOURCE, LITE_PUSH_GROUP, LITE_PUSH_TOPIC, LITE_PUSH_TAGS,
LITE_PUSH_LISTENER, LITE_PUSH_FROM.  TOML file:
  [consumer]      ConsumerConfig fields: group, mode, lanes, batch_size, ...
  [source]        url
  [listener]      path = "module:function"
  [subscription]  topic, tags, from
An unknown key, table or LITE_PUSH_* variable is an error.
"""


#: argparse types shared with the demo's options
_nonneg = _count(0)
_seconds = _non_negative_number


def _add_source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        metavar="URL",
        help="redis://host:port[/db][?namespace=NS] or embedded:/path/to/dir",
    )
    p.add_argument("--group", metavar="G", help="consumer group")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML settings file ([consumer], [source], ...)",
    )


def _para(text: str) -> str:
    """``text`` wrapped for a help screen whose epilog is preformatted."""
    return textwrap.fill(text, 79)


def build_parser() -> argparse.ArgumentParser:
    """The ``lite-push`` argument parser (``bench`` and ``gen-load`` are
    listed, but :func:`main` hands their arguments to the scripts)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="lite_push: key-ordered parallel consumption of partitioned logs.",
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {lite_push.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from .demo import add_arguments

    p = sub.add_parser(
        "demo",
        help="produce to the embedded broker and consume it with live stats and metrics",
        description=_para(
            "Produce to an in-memory embedded broker and consume in KEY_ORDERLY mode, printing live "
            "stats once a second (throughput, lag, in flight, paused queues) and serving Prometheus metrics; "
            "then check per-key order (exit 1 if it fails)."
        ),
    )
    add_arguments(p, metrics_port=DEMO_METRICS_PORT)
    p.set_defaults(handler=_cmd_demo)

    for name, module in PASSTHROUGH.items():
        p = sub.add_parser(
            name,
            add_help=False,
            help=f"run benchmarks/{module}.py (source checkout; '{PROG} {name} --help' for its options)",
        )
        p.add_argument("args", nargs=argparse.REMAINDER)

    p = sub.add_parser(
        "consume",
        help="run a listener (module:function) as a service",
        description=_para(
            "Consume TOPIC as group G from a source and call the listener for each batch; "
            "SIGTERM or SIGINT stops polling, drains, commits and exits 0."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument("--topic", metavar="T", help="topic to consume")
    p.add_argument(
        "--listener",
        metavar="MODULE:FUNCTION",
        help="the listener, imported with the current directory on sys.path; an async def one "
        "runs on the asyncio executor unless --executor says otherwise",
    )
    p.add_argument(
        "--tags", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB' (default *)"
    )
    p.add_argument(
        "--mode",
        choices=["KEY_ORDERLY", "CONCURRENTLY", "QUEUE_ORDERLY"],
        help="default KEY_ORDERLY",
    )
    p.add_argument("--lanes", type=int, metavar="N", help="lanes (default 16)")
    p.add_argument(
        "--executor",
        choices=["thread", "asyncio"],
        help="default thread (asyncio for async def)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics (0: any free port)",
    )
    p.add_argument(
        "--metrics-addr",
        metavar="ADDR",
        help="metrics bind address (default 127.0.0.1)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="no metrics, whatever the environment or file say",
    )
    p.add_argument(
        "--from",
        dest="from",
        choices=sorted(_FROM),
        help="where a group with no committed offset starts (default last)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="longest drain at shutdown (30)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default INFO",
    )
    p.set_defaults(handler=_cmd_consume)

    p = sub.add_parser(
        "dlq",
        help="list and re-send dead letters",
        description="Dead letters of a consumer group (topic %DLQ%<group>).",
    )
    dlq = p.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    p = dlq.add_parser(
        "list",
        help="print the dead letters of a group",
        description=_para(
            "Print one line per dead letter of the group (DLQ offset, origin topic/queue/offset, "
            "original message id, reconsume times, reason), or JSON lines with --json.  Reads only: "
            "joins no group and commits nothing."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument(
        "--start",
        type=_nonneg,
        default=0,
        metavar="OFFSET",
        help="first DLQ offset (default 0)",
    )
    p.add_argument(
        "--limit", type=_nonneg, metavar="N", help="read at most N offsets from --start"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=_cmd_dlq_list)
    p = dlq.add_parser(
        "resend",
        help="send dead letters back to their original topics",
        description=_para(
            "Send dead letters back to their original topics as new messages (original body, keys, "
            "tags and properties).  The DLQ is append-only: a dead letter stays there after it is resent."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--offset",
        type=_nonneg,
        nargs="+",
        action="extend",
        metavar="N",
        help="DLQ offsets to resend",
    )
    which.add_argument(
        "--all", action="store_true", help="resend every dead letter of the group"
    )
    p.set_defaults(handler=_cmd_dlq_resend)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lite-push`` with ``argv`` (default ``sys.argv[1:]``); return
    the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] in PASSTHROUGH:
            return run_benchmark_script(args_list[0], args_list[1:])
        args = build_parser().parse_args(args_list)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except CliError as e:
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return e.code
    except ConfigError as e:
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, --version
        return _exit_code(e)
    except KeyboardInterrupt:
        return 130

"""Opening the source a ``--source`` URL names, and turning what a source
raises at run time into one line for the user.  The only module of the CLI
that knows the source classes."""

from __future__ import annotations

import re
import sys
import types
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from .._errors import ConfigError, LitePushError, SourceUnavailableError, UnknownTopicError
from ..sources import is_retry_or_dlq_topic
from .errors import CliError

if TYPE_CHECKING:
    from ..sources.embedded import EmbeddedBroker
    from ..sources.kafka import KafkaBroker
    from ..sources.redis import RedisBroker

__all__ = [
    "KAFKA_BROKER_ARGS",
    "Broker",
    "open_source",
    "redact",
    "redis_query_keys",
    "source_errors",
    "source_place",
    "unknown_topic",
]

#: The brokers a URL can name.
Broker: TypeAlias = "EmbeddedBroker | RedisBroker | KafkaBroker"

#: Query parameters of a ``kafka://`` URL (and keys of the ``[source.kafka]``
#: table) that are :class:`~lite_push.sources.kafka.KafkaBroker` arguments,
#: with their types; every other key is a librdkafka property.
KAFKA_BROKER_ARGS: Mapping[str, type] = types.MappingProxyType(
    {
        "session_timeout": float,
        "metadata_max_bytes": int,
        "tags_header": str,
        "key_encoding": str,
    }
)

#: Query parameters whose values :func:`redact` hides (``password``,
#: ``sasl.password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret``,
#: ``ssl.key.pem``, ...).
_SECRET_KEY = re.compile(r"password|secret|key\.pem|oauthbearer\.config", re.IGNORECASE)

#: One bootstrap server: ``host``, ``host:port`` or ``[v6 address]:port``.
_KAFKA_SERVER = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/@?#]+)(?::[0-9]{1,5})?")

_KAFKA_FORM = "kafka://host:port[,host:port...][?property=value&...]"

#: The most topic names an unknown topic's error lists.
_TOPICS_SHOWN = 10


def redact(url: str) -> str:
    """``url`` without a password (for printing): the password of its user
    part and the values of query parameters that hold secrets."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urllib can take apart: show no query, no user part
        return re.sub(r"//[^/@]*@", "//***@", url.partition("?")[0])
    changed = False
    if parts.query:
        pairs = parts.query.split("&")
        hidden = []
        for pair in pairs:
            key, sep, _ = pair.partition("=")
            secret = sep and _SECRET_KEY.search(urllib.parse.unquote_plus(key))
            hidden.append(f"{key}=***" if secret else pair)
        if hidden != pairs:
            parts, changed = parts._replace(query="&".join(hidden)), True
    if password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        parts, changed = parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"), True
    return urllib.parse.urlunsplit(parts) if changed else url


def open_source(url: str, kafka: Mapping[str, Any] | None = None, *, create: bool = False) -> Broker:
    """The broker that ``url`` names.

    * ``redis://host:port[/db][?namespace=NS]`` (also ``rediss://``): a
      :class:`~lite_push.sources.redis.RedisBroker` on that server;
      ``namespace`` is the broker's key prefix (default ``lite_push``), the
      other query parameters go to redis-py.
    * ``kafka://host:port[,host:port...][?key=value&...]``: a
      :class:`~lite_push.sources.kafka.KafkaBroker` with those bootstrap
      servers; the query keys ``session_timeout`` (seconds),
      ``metadata_max_bytes``, ``tags_header`` and ``key_encoding`` are its
      arguments, every other key is a librdkafka property
      (``?security.protocol=ssl&fetch.max.bytes=1048576``).  ``kafka``
      holds more of the same (the config file's ``[source.kafka]`` table),
      under the query: a key in both takes the URL's value.
    * ``embedded:/path/to/dir``: the durable
      :class:`~lite_push.sources.EmbeddedBroker` stored in that directory
      (one process at a time may open it).  It must exist, unless
      ``create`` (``topic create``): then it is made, with its parents.

    Raises :class:`CliError` for a URL it cannot use (and for ``kafka``
    settings given with a URL that is not ``kafka://``), exit status 2; for
    a Redis server that does not answer (the broker asks it once), exit
    status 1.  A Kafka cluster is not contacted yet: one that is down shows
    on first use (librdkafka checks the Kafka settings here, though).
    """
    if url.startswith("kafka:"):
        return _open_kafka(url, kafka or {})
    if kafka:
        raise CliError(f"source {redact(url)!r}: [source.kafka] settings are for a kafka:// source")
    if url.startswith("embedded:"):
        raw = url[len("embedded:") :].removeprefix("//")
        if not raw:
            raise CliError(f"source {url!r}: expected embedded:/path/to/dir")
        path = Path(raw).expanduser()
        if path.exists() and not path.is_dir():
            raise CliError(f"source {url!r}: {path} is not a directory")
        if create:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CliError(f"source {url!r}: cannot create the directory {path}: {e.strerror}", code=1) from None
        elif not path.exists():
            raise CliError(f"source {url!r}: the directory {path} does not exist (lite-push topic create makes it)")
        from ..sources.embedded import EmbeddedBroker

        try:
            return EmbeddedBroker(path)
        except LitePushError as e:
            raise CliError(f"source {url!r}: {e}", code=1) from None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise CliError(f"source {redact(url)!r}: expected redis://host:port[/db]")
        try:
            from ..sources.redis import RedisBroker
        except ImportError:
            raise CliError("redis:// sources need the redis extra: pip install 'lite-push[redis]'") from None
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise CliError(f"source {redact(url)!r}: the database must be a number (redis://host:port/0), got {db!r}")
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        accepted = redis_query_keys(parts.scheme == "rediss")
        unknown = sorted({k for k, _ in query} - accepted)
        if unknown:
            raise CliError(
                f"source {redact(url)!r}: unknown query parameter {unknown[0]!r}; "
                f"accepted: {', '.join(sorted(accepted))}"
            )
        namespace = [v for k, v in query if k == "namespace"]
        rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "namespace"])
        plain = urllib.parse.urlunsplit(parts._replace(query=rest))
        try:
            if namespace:
                return RedisBroker(plain, namespace=namespace[-1])
            return RedisBroker(plain)
        except ConfigError:
            raise
        except SourceUnavailableError as e:
            raise _unavailable(url, e.reason) from None
        except (ValueError, TypeError) as e:
            raise CliError(f"source {redact(url)!r}: {e}") from None
    raise CliError(
        f"source {redact(url)!r}: expected redis://host:port[/db], "
        "kafka://host:port[,host:port...] or embedded:/path/to/dir"
    )


def redis_query_keys(tls: bool) -> frozenset[str]:
    """The query parameters a ``redis://`` (``tls``: ``rediss://``) source
    URL takes: ``namespace`` (lite_push's) and those redis-py reads from a
    URL (with TLS, its ``ssl_*`` settings too)."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    keys = {"namespace", *URL_QUERY_ARGUMENT_PARSERS}
    if tls:
        keys |= {"ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_password"}
    return frozenset(keys)


def _broker_arg(url: str, key: str, value: object) -> object:
    """Query parameter or ``[source.kafka]`` value ``value`` as KafkaBroker
    argument ``key``'s type (ranges are KafkaBroker's to check)."""
    kind = KAFKA_BROKER_ARGS[key]
    if kind is str:
        if isinstance(value, str):
            return value
    elif not isinstance(value, bool):
        if isinstance(value, str):
            try:
                return int(value.strip(), 10) if kind is int else float(value)
            except ValueError:
                pass
        elif isinstance(value, int) or (kind is float and isinstance(value, float)):
            return kind(value)
    want = {str: "a string", int: "an int", float: "a number of seconds"}[kind]
    raise CliError(f"source {redact(url)!r}: {key}: must be {want}, got {value!r}")


def _open_kafka(url: str, settings: Mapping[str, Any]) -> KafkaBroker:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unbalanced [ in the netloc
        raise CliError(f"source {redact(url)!r}: expected {_KAFKA_FORM}") from None
    servers = [s.strip() for s in parts.netloc.split(",")]
    bad = [s for s in servers if not _KAFKA_SERVER.fullmatch(s)]
    problem = None
    if parts.scheme != "kafka" or not parts.netloc.strip():
        problem = "no host"
    elif "@" in parts.netloc:  # never echo it: it may hold a password
        problem = "no user part here (SASL credentials are the sasl.username and sasl.password properties)"
    elif bad:
        problem = f"{bad[0]!r} is not host:port" if bad[0] else "an empty host:port"
    elif parts.path not in ("", "/") or parts.fragment:
        problem = "a kafka:// URL has no path or fragment"
    if problem is not None:
        raise CliError(f"source {redact(url)!r}: {problem}; expected {_KAFKA_FORM}")
    try:
        from ..sources.kafka import KafkaBroker
    except ImportError as e:
        if e.name is not None and e.name.partition(".")[0] != "confluent_kafka":
            raise
        raise CliError("kafka:// sources need the kafka extra: pip install 'lite-push[kafka]'") from None
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    merged: dict[str, Any] = {**settings, **dict(query)}  # the URL wins
    kwargs: dict[str, Any] = {k: _broker_arg(url, k, v) for k, v in merged.items() if k in KAFKA_BROKER_ARGS}
    config = {k: v for k, v in merged.items() if k not in KAFKA_BROKER_ARGS}
    try:
        return KafkaBroker(",".join(servers), config=config, **kwargs)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError
        raise CliError(f"source {redact(url)!r}: {e}") from None


def _client_failure(e: Exception) -> str | None:
    """What a Redis or Kafka client error says, in one line; ``None`` for
    any other exception.  A client library that was never imported raised
    nothing, so neither is imported here."""
    redis = sys.modules.get("redis")
    if redis is not None and isinstance(e, redis.RedisError):
        return f"{type(e).__name__}: {e}"
    kafka = sys.modules.get("confluent_kafka")
    if kafka is not None and isinstance(e, kafka.KafkaException):
        err = e.args[0] if e.args else None
        if isinstance(err, kafka.KafkaError):
            return f"{type(e).__name__}: {err.name()}: {err.str()}"
        return f"{type(e).__name__}: {e}"
    return None


def _tls_hint(url: str) -> str | None:
    """For a Redis connection that failed: when the server speaks TLS and
    the URL is ``redis://`` (or the other way round), a sentence saying
    which scheme to use (the server is asked: :func:`tls_mismatch`)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port or 6379
    except ValueError:
        return None
    if parts.scheme not in ("redis", "rediss") or not host:
        return None
    from ..sources.redis.tls import tls_mismatch

    return tls_mismatch(host, port, parts.scheme == "rediss")


def _unavailable(url: str, failure: str) -> CliError:
    """The one-line failure (exit status 1) for the server of ``url`` that
    could not be reached, ``failure`` saying why; a Redis server that
    speaks TLS to a ``redis://`` URL, or plain Redis to a ``rediss://``
    one, is named as such (``TLS: ... use rediss://``)."""
    hint = None if "TLS" in failure else _tls_hint(url)
    if hint is not None:
        failure = f"TLS: {hint} ({failure})"
    return CliError(f"source {redact(url)}: {failure}", code=1)


def source_place(url: str) -> str:
    """Where ``url`` points, for a message: the URL without its password
    and, for Redis, without its ``namespace`` parameter, which is said
    after it (``redis://host:6379/0 in namespace 'orders'``; the broker's
    default when the URL gives none)."""
    if not url.startswith(("redis:", "rediss:")):
        return redact(url)
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return redact(url)
    from ..sources.redis.broker import DEFAULT_NAMESPACE

    namespace = [v for k, v in query if k == "namespace"]
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "namespace"])
    plain = urllib.parse.urlunsplit(parts._replace(query=rest))
    return f"{redact(plain)} in namespace {(namespace[-1] if namespace else DEFAULT_NAMESPACE)!r}"


def unknown_topic(topic: str, url: str, broker: Broker | None = None, hint: str | None = None) -> CliError:
    """The one-line failure (exit status 1) for a topic the source of
    ``url`` does not have: it names the source (for Redis, its namespace)
    and, given its ``broker``, the topics it has (a group's retry and
    dead-letter topics left out); ``hint`` says what to do."""
    said: list[str] = []
    if broker is not None:
        try:
            names = [t for t in broker.topics() if not is_retry_or_dlq_topic(t)]
        except Exception:  # the error is about the topic: a source that fails now just lists nothing
            names = None
        if names is not None:
            shown = ", ".join(names[:_TOPICS_SHOWN])
            more = f" and {len(names) - _TOPICS_SHOWN} more" if len(names) > _TOPICS_SHOWN else ""
            said.append(f"topics there: {shown}{more}" if names else "no topics there")
    if hint:
        said.append(hint)
    tail = f" ({'; '.join(said)})" if said else ""
    return CliError(f"topic {topic!r} does not exist on {source_place(url)}{tail}", code=1)


@contextmanager
def source_errors(url: str, broker: Broker | None = None) -> Iterator[None]:
    """Turn a source that fails at run time (unreachable Redis or Kafka,
    ...) into a one-line :class:`CliError` with exit status 1.  A Redis
    server that speaks TLS to a ``redis://`` URL, or plain Redis to a
    ``rediss://`` one, is named as such (``TLS: ... use rediss://``).  A
    topic the source does not have is :func:`unknown_topic` (listing the
    topics of ``broker``, the source opened from ``url``, when given)."""
    try:
        yield
    except (CliError, ConfigError):
        raise
    except UnknownTopicError as e:
        raise unknown_topic(e.topic, url, broker) from None
    except LitePushError as e:
        raise CliError(str(e), code=1) from None
    except Exception as e:
        failure = _client_failure(e)
        if failure is None:
            raise
        redis = sys.modules.get("redis")
        if redis is not None and isinstance(e, (redis.ConnectionError, redis.TimeoutError)):
            raise _unavailable(url, failure) from None
        raise CliError(f"source {redact(url)}: {failure}", code=1) from None

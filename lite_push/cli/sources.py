"""Opening the source a ``--source`` URL names, and turning what a source
raises at run time into one line for the user.  The only module of the CLI
that knows the source classes."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from .._errors import ConfigError, LitePushError
from .errors import CliError

if TYPE_CHECKING:
    from ..sources.embedded import EmbeddedBroker
    from ..sources.redis import RedisBroker

__all__ = ["Broker", "open_source", "redact", "source_errors"]

#: The brokers a URL can name.
Broker: TypeAlias = "EmbeddedBroker | RedisBroker"


def redact(url: str) -> str:
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
      :class:`~lite_push.sources.redis.RedisBroker` on that server;
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
            raise CliError(f"source {redact(url)!r}: {e}") from None
    raise CliError(
        f"source {redact(url)!r}: expected redis://host:port[/db] or embedded:/path/to/dir"
    )


@contextmanager
def source_errors(url: str) -> Iterator[None]:
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
                f"source {redact(url)}: {type(e).__name__}: {e}", code=1
            ) from None
        raise

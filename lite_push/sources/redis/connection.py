"""The Redis Streams source's connection: the client, the reader client,
the registered Lua scripts (:mod:`.scripts`, :mod:`.grain_scripts`), pipelines, storing messages (the SEND script),
the names of every key, and the loader of the Redis Function library
(:mod:`.functions`).

Reading: polls go through a second client on the broker's connection pool
whose XRANGE replies are left as hiredis' lists (redis-py would build a dict
per entry).  A ``redis.RedisCluster`` client cannot pipeline scripts, so on
a cluster the pipelined steps run one by one (:class:`Sequential`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._types import MessageQueue
from . import grain_scripts, scripts
from .functions import FunctionLoader

__all__ = [
    "CONN_ERRORS",
    "SEND_CHUNK",
    "Connection",
    "Outage",
    "Sequential",
    "chunk_offset",
    "qfield",
    "server_address",
]

logger = logging.getLogger(__name__)

#: What a poll treats as "Redis is unreachable for now" (BusyLoadingError is
#: a ConnectionError; ClusterDownError/TryAgainError are cluster fail-overs).
CONN_ERRORS = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, OSError)


#: Messages of one queue stored per SEND call: a batch is atomic per queue up
#: to this size (a bigger one is split, so one call does not block the
#: server for long, and another sender's messages may then interleave).
SEND_CHUNK = 65536


def chunk_offset(firsts: list[int], i: int) -> int:
    """The offset of the ``i``-th message a :meth:`Connection.append` stored
    in a queue, given that queue's ``firsts``."""
    return firsts[i // SEND_CHUNK] + i % SEND_CHUNK


def server_address(client: Any) -> str:
    """Where ``client`` (a ``redis.Redis`` or ``redis.RedisCluster``) talks
    to, for messages: ``redis://host:port/db`` (``rediss://`` with TLS,
    ``unix:///path?db=N`` over a socket, the first node of a cluster);
    never a user name or password."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # a cluster client: the node it started from
        node = getattr(client, "get_default_node", lambda: None)()
        return repr(client) if node is None else f"redis://{_host(node.host)}:{node.port} (a cluster)"
    kw = pool.connection_kwargs
    db = kw.get("db", 0)
    if kw.get("path"):
        return f"unix://{kw['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{_host(kw.get('host', 'localhost'))}:{kw.get('port', 6379)}/{db}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def qfield(q: MessageQueue) -> str:
    """A queue's field in the group hashes (offsets, initial): ``topic#id``."""
    return f"{q.topic}#{q.queue_id}"


class Outage:
    """A member's view of Redis being unreachable: says once when it is
    lost and when it is back, and backs off exponentially (0.1 s to 2 s)
    between attempts."""

    __slots__ = ("_who", "_since", "_backoff")

    def __init__(self, who: object) -> None:
        self._who = who
        self._since: float | None = None
        self._backoff = 0.1

    def lost(self, error: BaseException, remaining: float) -> float:
        """An attempt failed with ``error``: how long to wait (at most
        ``remaining``) before the next."""
        if self._since is None:
            self._since = time.monotonic()
            logger.warning("%r: Redis connection lost (%s); retrying with back-off", self._who, error)
        wait = min(self._backoff, max(0.0, remaining))
        self._backoff = min(self._backoff * 2, 2.0)
        return wait

    def ok(self) -> None:
        """An attempt succeeded."""
        if self._since is not None:
            logger.warning("%r: Redis connection back after %.1f s", self._who, time.monotonic() - self._since)
            self._since = None
            self._backoff = 0.1


def _raw_entries(response: Any, **options: Any) -> Any:
    return response


class Sequential:
    """Stands in for a pipeline on a Redis Cluster client: runs each command
    at once and collects the results for :meth:`execute`."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.results: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> None:
            self.results.append(method(*args, **kwargs))

        return call

    def execute(self) -> list[Any]:
        out, self.results = self.results, []
        return out


class Connection:
    """One broker's link to Redis.  Thread-safe as redis-py's clients are."""

    def __init__(self, client: Any, namespace: str) -> None:
        # Typed Any: redis-py types every command as "value or awaitable"
        # (one stub for its sync and asyncio clients); this one is sync.
        self.client: Any = client
        self.namespace = namespace
        c = client
        self.send = c.register_script(scripts.SEND)
        self.move_due = c.register_script(scripts.MOVE_DUE)
        self.queue_end = c.register_script(scripts.QUEUE_END)
        self.heartbeat = c.register_script(scripts.HEARTBEAT)
        self.acquire = c.register_script(scripts.ACQUIRE)
        self.release = c.register_script(scripts.RELEASE)
        self.leave = c.register_script(scripts.LEAVE)
        self.commit = c.register_script(scripts.COMMIT)
        self.lock = c.register_script(scripts.LOCK)
        self.unlock = c.register_script(scripts.UNLOCK)
        self.schedule = c.register_script(scripts.SCHEDULE)
        self.claim_balance = c.register_script(scripts.CLAIM_BALANCE)
        self.raise_positions = c.register_script(scripts.RAISE_POSITIONS)
        # message-grain balancing (grain_scripts): one queue's slot each
        self.grain_dispatch = c.register_script(grain_scripts.DISPATCH)
        self.grain_ack = c.register_script(grain_scripts.ACK)
        self.grain_renew = c.register_script(grain_scripts.RENEW)
        self.grain_quit = c.register_script(grain_scripts.QUIT)
        self.grain_position = c.register_script(grain_scripts.POSITION)
        self.grain_resync = c.register_script(grain_scripts.RESYNC)
        self.grain_in_flight = c.register_script(grain_scripts.IN_FLIGHT)
        #: The scripts queued as bare EVALSHAs (``run(..., loaded=True)``):
        #: what :meth:`load_scripts` loads.
        self._bare: set[Any] = set()
        #: The ``lite_push`` Redis Function library (``FCALL lite_push_send``
        #: for producers in any language), loaded on first use of a topic.
        self.functions = FunctionLoader(c)
        # Redis Cluster clients cannot pipeline scripts: they run one by one
        self._cluster = isinstance(c, redis.RedisCluster)
        # Polls read through a second client on the same connection pool
        # whose XRANGE replies stay hiredis' nested lists: redis-py would make
        # a dict of every entry's fields, which costs more than the rest of
        # decoding (a caller's own client is left as it is).
        self._reader: Any = c
        if not self._cluster:
            self._reader = redis.Redis(connection_pool=c.connection_pool)
            self._reader.set_response_callback("XRANGE", _raw_entries)

    @property
    def pipelines(self) -> bool:
        """Whether :meth:`pipeline` gives redis-py's pipeline (a single
        server), not the sequential stand-in of a cluster."""
        return not self._cluster

    def pipeline(self, reader: bool = False) -> Any:
        """A non-transactional pipeline (a sequential stand-in on a cluster);
        ``reader``: on the reader client, whose XRANGE replies are not
        parsed into dicts."""
        if self._cluster:
            return Sequential(self.client)
        return (self._reader if reader else self.client).pipeline(transaction=False)

    def run(self, script: Any, keys: list[str], args: list[Any], pipe: Any = None, *, loaded: bool = False) -> Any:
        """Run ``script`` now (``pipe`` None) or queue it on ``pipe``.

        ``loaded``: queue a bare EVALSHA, so that the pipeline's ``execute``
        skips redis-py's SCRIPT EXISTS round trip (one per execute with a
        script on it); the caller then handles ``NoScriptError`` (a server
        that restarted or flushed its scripts) with :meth:`load_scripts`
        and runs its pipeline again, which is why only pipelines that may
        run twice pass it (the poll's: a script that met NOSCRIPT did not run)."""
        if pipe is None:
            return script(keys=keys, args=args, client=self.client)
        if isinstance(pipe, Sequential):
            pipe.results.append(script(keys=keys, args=args, client=self.client))
            return None
        if loaded:
            self._bare.add(script)
            return pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return script(keys=keys, args=args, client=pipe)

    def load_scripts(self) -> None:
        """Load the scripts into the server's cache (one pipelined round
        trip): after ``NoScriptError`` from a pipeline built with
        ``run(..., loaded=True)``.  Every script this connection registered
        is loaded, not only those queued so far: the server lost them all,
        and the pipeline built again may queue others (a member's first
        DISPATCH, its RESYNC).  (Scripts run otherwise load themselves:
        redis-py's ``Script`` retries after NOSCRIPT.)"""
        registered = {v for v in vars(self).values() if isinstance(v, Script)}
        pipe = self.client.pipeline(transaction=False)
        for script in sorted(registered | self._bare, key=lambda s: s.sha):
            pipe.script_load(script.script)
        pipe.execute()

    def append(self, topic: str, args: Mapping[int, list[bytes]]) -> dict[int, list[int]]:
        """Store messages in ``topic``: ``args`` holds per queue each
        message's body and encoded metadata, in turn.  One SEND per queue
        (per ``SEND_CHUNK`` messages of a queue), pipelined; returns per
        queue the first offset of each chunk (see :func:`chunk_offset`)."""
        pipe = self.pipeline()
        calls: list[int] = []
        for q in sorted(args):
            a = args[q]
            for start in range(0, len(a), 2 * SEND_CHUNK):
                part = a[start : start + 2 * SEND_CHUNK]
                self.run(
                    self.send,
                    [self.queue_key(topic, q, "seq"), self.queue_key(topic, q, "log")],
                    [len(part) // 2, self.notify_channel(topic), *part],
                    pipe,
                )
                calls.append(q)
        res = pipe.execute()
        first: dict[int, list[int]] = {}
        for q, r in zip(calls, res, strict=True):
            first.setdefault(q, []).append(int(r[0]))
        return first

    # -- key names --------------------------------------------------------------

    def queue_key(self, topic: str, qid: int, what: str) -> str:
        """The key of one queue's ``what`` (``seq``, ``log``, ...): a hash
        tag per queue, so a queue's keys share a cluster slot."""
        return f"{self.namespace}:{{{topic}#{qid}}}:{what}"

    def group_key(self, group: str, what: str) -> str:
        """The key of one group's ``what`` (``offsets``,
        ``owner:<topic>#<queue>``, ...): a hash tag per group."""
        return f"{self.namespace}:{{g:{group}}}:{what}"

    def notify_channel(self, topic: str) -> str:
        """The pub/sub channel announcing new messages of ``topic``."""
        return f"{self.namespace}:notify:{topic}"

    def topics_key(self) -> str:
        """The hash of topic -> queue count."""
        return f"{self.namespace}:topics"

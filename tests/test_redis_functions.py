"""Issue 30, point 4: producing to a Redis topic from any language through
the ``lite_push`` Redis Function library (``FCALL lite_push_send``).

The ``redis-cli`` commands of docs/sources.md run as a shell user would type them
(against this test's server), and what they stored is consumed by a real
lite_push consumer with its body, key, tags and properties; keys of every
kind go to the queue ``RedisBroker.send`` picks for them, and offsets
interleave with lite_push's own sends; the library is loaded once, never
downgraded, and a server that refuses it is told once.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import wait_until

from lite_push import ConsumerConfig, LitePushConsumer, MessageExt
from lite_push._kernels.router import lane_of
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis.functions import LIBRARY, LIBRARY_VERSION
from lite_push.sources.redis_server import RedisServer

DOC = Path(__file__).resolve().parent.parent / "docs" / "sources.md"
SECTION = "## Producing to Redis from any language"
REDIS_CLI = shutil.which("redis-cli")

pytestmark = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")

#: Keys of every kind: ASCII, Latin-1, CJK, characters above U+FFFF (two
#: UTF-16 units), a NUL, quotes and backslashes (escaped in the JSON).
KEYS = [
    "account-7",
    "é",
    "日本語",
    "😀",
    "🎉x🎉",
    "a\x00b",
    'q"uote',
    "back\\slash",
    "Ω-42",
    "ключ",
    "k" * 300,
    *(f"key-{i}" for i in range(120)),
]


def doc_sh_blocks() -> list[str]:
    """The ```sh blocks of docs/sources.md's section on producing to Redis
    (up to the next section of its level)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end
    return re.findall(r"^```sh\n(.*?)^```$", text[start:end], re.MULTILINE | re.DOTALL)


def run_cli(line: str, port: int) -> str:
    """One documented ``redis-cli`` line against ``127.0.0.1:port``: its output."""
    argv = shlex.split(line)
    assert argv[0] == "redis-cli", line
    done = subprocess.run(
        [REDIS_CLI or "redis-cli", "-h", "127.0.0.1", "-p", str(port), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Collect:
    """A listener keeping every message it was called with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[MessageExt] = []

    def __call__(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            self.messages.extend(msgs)

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def by_key(self) -> dict[str | None, list[bytes]]:
        with self.lock:
            out: dict[str | None, list[bytes]] = {}
            for m in sorted(self.messages, key=lambda m: (m.queue_id, m.queue_offset)):
                out.setdefault(m.keys, []).append(m.body)
            return out


def consume(broker: RedisBroker, topic: str, n: int) -> Collect:
    """Run a lite_push consumer of ``topic`` from its first offset until it
    has ``n`` messages; return what it got."""
    got = Collect()
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumer = LitePushConsumer(
        ConsumerConfig(group=group, lanes=8, poll_timeout=0.02, commit_interval=0.05),
        source=broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=got,
    )
    consumer.subscribe(topic)
    with consumer:
        assert wait_until(lambda: got.count() >= n, timeout=30), got.count()
    assert got.count() == n
    return got


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisBroker]:
    b = RedisBroker(redis_server.url, namespace=f"fn-{uuid.uuid4().hex[:10]}")
    yield b
    b.close()


@pytest.fixture
def fresh_server() -> Iterator[RedisServer]:
    """A server of its own, for tests that change its function library."""
    with RedisServer(appendonly=False) as server:
        yield server


def test_the_documented_redis_cli_commands_send_what_a_consumer_reads(redis_server: RedisServer) -> None:
    block = doc_sh_blocks()[0]
    lines = [line for line in block.splitlines() if line.startswith("redis-cli")]
    assert len(lines) == 4
    broker = RedisBroker(redis_server.url)  # the documented namespace, lite_push
    try:
        broker.create_topic("ORDER", 4)  # loads the library
        out = [run_cli(line, redis_server.port).split() for line in lines]
        assert out[0] == ["3", "0"] and out[1] == ["3", "1"]  # account-7's queue, consecutive offsets
        assert out[2][1] == "0" and out[3] == ["3"]  # keyless: round robin; lite_push_queue agrees
        assert lane_of("account-7", 4) == 3
        got = consume(broker, "ORDER", 3)
        by_offset = {(m.queue_id, m.queue_offset): m for m in got.messages}
        first, second = by_offset[(3, 0)], by_offset[(3, 1)]
        assert (first.body, first.keys, first.tags, first.properties) == (b'{"amount":5}', "account-7", "paid", {})
        assert (second.body, second.keys, second.tags) == (b'{"amount":-2}', "account-7", "refund")
        assert second.properties == {"channel": "web"}
        keyless = by_offset[(int(out[2][0]), 0)]
        assert (keyless.body, keyless.keys, keyless.tags) == (b"no key: round robin", None, None)
        assert first.store_timestamp > 0 and first.born_timestamp == first.store_timestamp  # the server's TIME
    finally:
        broker.close()


def test_every_key_goes_to_the_queue_lite_push_picks_and_offsets_interleave(broker: RedisBroker) -> None:
    """For each key: FCALL, then RedisBroker.send of the same key: the same
    queue, consecutive offsets; the consumer reads both in that order."""
    broker.create_topic("T", 7)
    client = broker.client
    ns = broker.namespace
    for i, key in enumerate(KEYS):
        q, off = client.fcall("lite_push_send", 0, ns, "T", key, f"fcall-{i}".encode(), "t", "n", str(i))
        sent = broker.send("T", f"send-{i}".encode(), keys=key, tags="t")
        assert (q, off + 1) == (sent.queue.queue_id, sent.offset), key
        assert client.fcall_ro("lite_push_queue", 0, key, 7) == q == lane_of(key, 7)
    got = consume(broker, "T", 2 * len(KEYS))
    assert got.by_key() == {k: [f"fcall-{i}".encode(), f"send-{i}".encode()] for i, k in enumerate(KEYS)}
    fcalled = [m for m in got.messages if m.body.startswith(b"fcall-")]
    assert all(m.tags == "t" and m.properties == {"n": m.body[6:].decode()} for m in fcalled)


def test_keyless_messages_go_round_robin(broker: RedisBroker) -> None:
    broker.create_topic("T", 3)
    queues = [broker.client.fcall("lite_push_send", 0, broker.namespace, "T", "", b"x")[0] for _ in range(9)]
    assert sorted(queues) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a_send_after_a_foreign_entry_goes_above_it(broker: RedisBroker) -> None:
    broker.create_topic("T", 1)
    broker.send("T", b"a", keys="k")
    foreign = broker.client.xadd(broker.queue_key("T", 0, "log"), {"field": "value"})
    q, off = broker.client.fcall("lite_push_send", 0, broker.namespace, "T", "k", b"b")
    assert off == int(foreign.split(b"-")[0])  # the foreign entry's offset + 1
    assert broker.send("T", b"c", keys="k").offset == off + 1
    assert [m.body for m in broker.messages(broker.queues("T")[0])] == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("nope", "k", b"b"), "no topic nope"),
        (("T", b"\xff\xfe", b"b"), "the key is not UTF-8"),
        (("T", "k", b"b", b"\xc0\xaf"), "the tags is not UTF-8"),
        (("T", "k"), "expected FCALL lite_push_send 0 <namespace> <topic> <key> <body>"),
        (("T", "k", b"b", "tag", "name"), "expected FCALL lite_push_send 0"),
        (("T", "k", b"b", "", "RECONSUME_TIME", "x"), "RECONSUME_TIME must be a decimal integer"),
    ],
)
def test_bad_calls_are_error_replies_naming_what_is_wrong(broker: RedisBroker, args: tuple, error: str) -> None:
    broker.create_topic("T", 2)
    with pytest.raises(redis.ResponseError, match=re.escape(error)):
        broker.client.fcall("lite_push_send", 0, broker.namespace, *args)
    assert broker.max_offset(broker.queues("T")[0]) == broker.max_offset(broker.queues("T")[1]) == 0  # nothing stored


def test_the_queue_form_checks_the_keys_it_is_given(broker: RedisBroker) -> None:
    broker.create_topic("T", 2)
    ns = broker.namespace
    seq, log = broker.queue_key("T", 1, "seq"), broker.queue_key("T", 1, "log")
    assert broker.client.fcall("lite_push_send_queue", 2, seq, log, ns, "T", "k", b"x") == [1, 0]
    with pytest.raises(redis.ResponseError, match=re.escape(f"the keys must be {ns}:{{T#<queue>}}:seq")):
        broker.client.fcall("lite_push_send_queue", 2, seq, broker.queue_key("T", 0, "log"), ns, "T", "k", b"x")
    with pytest.raises(redis.ResponseError, match="takes no keys"):
        broker.client.fcall("lite_push_send", 2, seq, log, ns, "T", "k", b"x")
    with pytest.raises(redis.ResponseError, match="queue count >= 1"):
        broker.client.fcall_ro("lite_push_queue", 0, "k", 0)


def test_the_library_text_is_pinned_to_its_version() -> None:
    """Change the library, bump LIBRARY_VERSION (brokers load only a newer
    one), then update the hash here."""
    assert LIBRARY_VERSION == 1
    pinned = "d650c2da94fc02c651c3e455fbe707681721d13b295bbc114ba351d69f4c08ed"
    assert hashlib.sha256(LIBRARY.encode()).hexdigest() == pinned


def _library_version(client: redis.Redis) -> int:
    return int(client.fcall_ro("lite_push_version", 0))


def test_a_newer_library_is_left_alone_and_an_older_one_replaced(fresh_server: RedisServer) -> None:
    client = redis.Redis.from_url(fresh_server.url)
    newer = (
        "#!lua name=lite_push\nredis.register_function{function_name='lite_push_version', "
        "callback=function() return 99 end, flags={'no-writes'}}"
    )
    client.function_load(newer, replace=True)
    with RedisBroker(fresh_server.url, namespace="a") as b:
        b.create_topic("T", 1)
    assert _library_version(client) == 99  # not downgraded
    client.function_load(newer.replace("99", "0"), replace=True)
    with RedisBroker(fresh_server.url, namespace="b") as b:
        b.create_topic("T", 1)
        assert _library_version(client) == LIBRARY_VERSION
        assert b.client.fcall("lite_push_send", 0, "b", "T", "k", b"x") == [0, 0]
    client.close()


def test_the_library_is_loaded_once_per_broker(fresh_server: RedisServer) -> None:
    client = redis.Redis.from_url(fresh_server.url)
    with RedisBroker(fresh_server.url, namespace="a") as b:
        b.create_topic("T", 2)
        assert b.conn.functions.done
        client.function_delete("lite_push")
        b.create_topic("U", 2)  # another topic: the broker does not ask again
        b.send("U", b"x", keys="k")
    assert client.function_list() == []
    with RedisBroker(fresh_server.url, namespace="a") as b:
        b.queues("T")  # a new broker's first topic read loads it
    assert _library_version(client) == LIBRARY_VERSION
    client.close()


def test_a_server_that_refuses_the_library_is_told_once_and_sending_works(
    fresh_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(fresh_server.url)
    admin.acl_setuser("nofn", enabled=True, nopass=True, keys=["*"], channels=["*"], commands=["+@all", "-function"])
    url = f"redis://nofn@127.0.0.1:{fresh_server.port}/0"
    with caplog.at_level(logging.WARNING, logger="lite_push.sources.redis.functions"):
        with RedisBroker(url, namespace="a") as b:
            b.create_topic("T", 1)
            b.create_topic("U", 1)
            assert b.send("T", b"x", keys="k").offset == 0
    warned = [r for r in caplog.records if "could not be loaded" in r.getMessage()]
    assert len(warned) == 1 and "FCALL lite_push_send is not available" in warned[0].getMessage()
    admin.close()


def test_on_a_redis_cluster_the_documented_queue_form_works(redis_cluster) -> None:  # type: ignore[no-untyped-def]
    block = doc_sh_blocks()[1]
    lines = [line for line in block.splitlines() if line.startswith("redis-cli")]
    assert len(lines) == 3
    client = redis.RedisCluster.from_url(redis_cluster.url)
    broker = RedisBroker(client)  # the documented namespace, lite_push
    try:
        broker.create_topic("ORDER", 4)  # loads the library on every primary
        port = redis_cluster.ports[-1]  # any node: redis-cli -c follows redirections
        assert [run_cli(line, port).split() for line in lines] == [["4"], ["3"], ["3", "0"]]
        refused = run_cli("redis-cli -c FCALL lite_push_send 0 lite_push ORDER account-7 x", port)
        assert "no-cluster" in refused or "cluster" in refused.lower(), refused
        got = consume(broker, "ORDER", 1)
        m = got.messages[0]
        assert (m.queue_id, m.queue_offset, m.body, m.keys, m.tags) == (3, 0, b'{"amount":5}', "account-7", "paid")
    finally:
        broker.close()
        client.close()

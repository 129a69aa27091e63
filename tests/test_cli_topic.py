"""``lite-push topic create | list | describe`` as a subprocess (``python -m
lite_push``) on the three sources: a durable embedded broker in a temporary
directory, a redis-server this module starts, and librdkafka's mock cluster
(which has no admin API: ``topic create`` of a new topic refuses with one
line naming ``kafka-topics.sh``; tests make topics with the cluster's
``create_topic``).  Bad input is one line and exit status 2; a topic the
source does not have is exit status 1, as for ``consume``.

:class:`Source` and :func:`lite_push` serve ``test_cli_produce.py`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from lite_push import ConfigError, LitePushError
from lite_push.cli.settings import NON_CONFIG_ENV
from lite_push.sources import EmbeddedBroker, dlq_topic
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["embedded", "redis", "kafka"]

Broker = EmbeddedBroker | RedisBroker | KafkaBroker


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``lite-push`` subprocess: this checkout's
    package, no ``LITE_PUSH_*`` setting of the caller's, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k in NON_CONFIG_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def lite_push(
    *argv: str, stdin: bytes = b"", env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m lite_push ARGV`` to its end, ``stdin`` as its input."""
    return subprocess.run(
        [sys.executable, "-m", "lite_push", *argv],
        input=stdin,
        capture_output=True,
        env=cli_env(env),
        cwd=cwd,
        timeout=120,
        check=False,
    )


def one_line_error(r: subprocess.CompletedProcess[bytes], code: int, *fragments: str) -> str:
    """Assert ``r`` failed with ``code``, nothing on stdout and one
    ``lite-push: error:`` line holding every fragment on stderr; return it."""
    err = r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    assert r.stdout == b"", r.stdout
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lite-push: error: "), err
    for f in fragments:
        assert f in lines[0], err
    return lines[0]


def ok(r: subprocess.CompletedProcess[bytes]) -> list[str]:
    """Assert ``r`` succeeded with nothing on stderr; its stdout lines."""
    assert r.returncode == 0 and r.stderr == b"", (r.returncode, r.stderr.decode())
    return r.stdout.decode().splitlines()


class Source:
    """One source the commands run on: its ``url``, and brokers of it for the
    test's own set-up and checks (closed before the command runs: one
    process at a time opens an embedded directory)."""

    def __init__(
        self,
        kind: str,
        url: str,
        tmp_path: Path,
        *,
        redis: RedisServer | None = None,
        cluster: MockKafkaCluster | None = None,
    ) -> None:
        self.kind = kind
        self.url = url
        self.tmp_path = tmp_path
        self._redis = redis
        self._cluster = cluster

    @property
    def place(self) -> str:
        """How an error names the source: its URL, a Redis one without its
        namespace, which is said after it."""
        if self._redis is None:
            return self.url
        plain, _, ns = self.url.partition("?namespace=")
        return f"{plain} in namespace {ns!r}"

    @contextmanager
    def broker(self) -> Iterator[Broker]:
        b: Broker
        if self._cluster is not None:
            b = KafkaBroker(self._cluster.bootstrap, topic_creator=self._cluster.create_topic)
        elif self._redis is not None:
            b = RedisBroker(self._redis.url, namespace=self.url.rsplit("namespace=", 1)[1])
        else:
            b = EmbeddedBroker(self.url.removeprefix("embedded:"))
        try:
            yield b
        finally:
            b.close()

    def create(self, topic: str, queues: int) -> None:
        """Make ``topic`` the way the test's source allows (Kafka's mock:
        its ``create_topic``)."""
        with self.broker() as b:
            b.create_topic(topic, queues)


@contextmanager
def open_source(kind: str, tmp_path: Path, redis_server: RedisServer | None) -> Iterator[Source]:
    if kind == "embedded":
        data = tmp_path / "data"
        data.mkdir()
        yield Source(kind, f"embedded:{data}", tmp_path)
    elif kind == "redis":
        assert redis_server is not None
        yield Source(kind, f"{redis_server.url}?namespace=t-{uuid.uuid4().hex[:10]}", tmp_path, redis=redis_server)
    else:
        with MockKafkaCluster() as cluster:
            yield Source(kind, f"kafka://{cluster.bootstrap}", tmp_path, cluster=cluster)


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    with open_source(request.param, tmp_path, server) as s:
        yield s


# -- create, list, describe ---------------------------------------------------------


def test_create_list_describe(source: Source) -> None:
    url = source.url
    if source.kind == "kafka":
        # the mock cluster has no CreateTopics: one line naming Kafka's own tool
        line = one_line_error(lite_push("topic", "create", "--source", url, "--topic", "orders", "--queues", "3"), 1)
        assert (
            f"kafka-topics.sh --bootstrap-server {url.removeprefix('kafka://')} --create --topic orders "
            "--partitions 3" in line
        )
        source.create("orders", 3)
        source.create("__consumer_offsets", 1)  # Kafka's own: not listed
        assert ok(lite_push("topic", "create", "--source", url, "--topic", "orders", "--queues", "3")) == [
            "topic orders exists with 3 queues"
        ]
    else:
        r = lite_push("topic", "list", "--source", url)
        assert r.returncode == 0 and r.stdout == b"" and b"no topics on" in r.stderr
        assert ok(lite_push("topic", "create", "--source", url, "--topic", "orders", "--queues", "3")) == [
            "created topic orders with 3 queues"
        ]
        assert ok(lite_push("topic", "create", "--source", url, "--topic", "orders", "--queues", "3")) == [
            "topic orders exists with 3 queues"
        ]
    one_line_error(
        lite_push("topic", "create", "--source", url, "--topic", "orders", "--queues", "5"),
        2,
        "queues: topic 'orders' exists with 3 queues, not 5",
    )
    source.create("alpha", 1)
    with source.broker() as b:
        b.send_batch("orders", [{"body": b"x", "queue_id": q} for q in (0, 0, 2, 0)])
        b.create_topic(dlq_topic("g"), 1)
        b.send(dlq_topic("g"), b"dead")

    assert ok(lite_push("topic", "list", "--source", url)) == [
        "topic=alpha queues=1 messages=0",
        "topic=orders queues=3 messages=4",
        "topic=%DLQ%g queues=1 messages=1 kind=dlq group=g",  # a group's topics after the others
    ]
    docs = [orjson.loads(line) for line in ok(lite_push("topic", "list", "--source", url, "--json"))]
    assert docs[1] == {"topic": "orders", "queues": 3, "messages": 4, "kind": "topic", "group": None}
    assert docs[2] == {"topic": "%DLQ%g", "queues": 1, "messages": 1, "kind": "dlq", "group": "g"}

    assert ok(lite_push("topic", "describe", "--source", url, "--topic", "orders")) == [
        "queue=0 first=0 end=3 messages=3",
        "queue=1 first=0 end=0 messages=0",
        "queue=2 first=0 end=1 messages=1",
        "topic=orders queues=3 messages=4",
    ]
    (doc,) = map(orjson.loads, ok(lite_push("topic", "describe", "--source", url, "--topic", "orders", "--json")))
    assert doc == {
        "topic": "orders",
        "queues": [
            {"queue": 0, "first": 0, "end": 3, "messages": 3},
            {"queue": 1, "first": 0, "end": 0, "messages": 0},
            {"queue": 2, "first": 0, "end": 1, "messages": 1},
        ],
        "messages": 4,
    }
    one_line_error(
        lite_push("topic", "describe", "--source", url, "--topic", "nope"),
        1,  # as consume of an unknown topic: the source's state, not the arguments
        f"topic 'nope' does not exist on {source.place} (topics there: alpha, orders)",
    )


def test_source_and_topic_from_the_environment_and_the_config_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "app.toml"
    config.write_text('[subscription]\ntopic = "ORDERS"\n')
    env = {"LITE_PUSH_SOURCE": f"embedded:{data}"}
    r = lite_push("topic", "create", "--config", str(config), "--queues", "2", env=env)
    assert ok(r) == ["created topic ORDERS with 2 queues"]
    lines = ok(lite_push("topic", "describe", "--config", str(config), env=env))
    assert lines[-1] == "topic=ORDERS queues=2 messages=0"
    with EmbeddedBroker(data) as b:
        assert b.topics() == ["ORDERS"]


def test_a_directory_another_process_holds_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with EmbeddedBroker(data):
        r = lite_push("topic", "list", "--source", f"embedded:{data}")
    one_line_error(r, 1, f"is in use by process {os.getpid()}")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["topic"], "ACTION"),
        (["topic", "create", "--topic", "T", "--queues", "2"], "--source is required"),
        (["topic", "create", "--source", "{dir}", "--queues", "2"], "--topic is required"),
        (["topic", "create", "--source", "{dir}", "--topic", "", "--queues", "2"], "--topic is required"),
        (["topic", "create", "--source", "{dir}", "--topic", "T"], "the following arguments are required: --queues"),
        (["topic", "create", "--source", "{dir}", "--topic", "T", "--queues", "0"], "--queues: must be >= 1, got 0"),
        (["topic", "create", "--source", "{dir}", "--topic", "T", "--queues", "x"], "--queues: invalid int value"),
        (["topic", "create", "--source", "{dir}", "--topic", "a/b", "--queues", "2"], "topic 'a/b' must not contain"),
        (
            ["topic", "create", "--source", "{dir}", "--topic", "%DLQ%g", "--queues", "2"],
            "queues: retry and dead-letter topics have 1 queue, not 2",
        ),
        (["topic", "create", "--source", "nosuch://h:1", "--topic", "T", "--queues", "2"], "expected redis://"),
        (
            ["topic", "describe", "--source", "embedded:/no/such/dir", "--topic", "T"],
            "the directory /no/such/dir does not exist",
        ),
        (["topic", "describe", "--source", "{dir}", "--topic", "T", "--bogus"], "unrecognized arguments: --bogus"),
        (["topic", "list", "--source", "kafka://h:9092", "--topic", "T"], "unrecognized arguments: --topic"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], fragment: str) -> None:
    argv = [a.replace("{dir}", f"embedded:{tmp_path}") for a in argv]
    one_line_error(lite_push(*argv), 2, fragment)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no topic was made


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        (["topic"], ["create", "list", "describe"]),
        (["topic", "create"], ["--source", "--topic", "--queues", "--config", "kafka-topics.sh", "LITE_PUSH_SOURCE"]),
        (["topic", "list"], ["--source", "--json", "%DLQ%<group>", "kind=dlq"]),
        (["topic", "describe"], ["--source", "--topic", "--json", "end offset"]),
        (["produce"], ["--source", "--topic", "--key-separator", "--tags", "--progress", "KEY SEP BODY"]),
    ],
)
def test_help(argv: list[str], mentions: list[str]) -> None:
    out = " ".join(ok(lite_push(*argv, "--help")))
    assert out.startswith("usage: lite-push")
    for m in mentions:
        assert m in out, m


def test_kafka_broker_topics_and_create_topic() -> None:
    """What the commands rely on, in the library: ``topics()`` in lite_push
    names without Kafka's own; ``create_topic`` idempotent for the same count
    and a ``ConfigError`` naming ``partitions`` for another; a cluster with no
    CreateTopics named with the tool to use instead."""
    with MockKafkaCluster() as cluster:
        cluster.create_topic("__consumer_offsets", 1)
        b = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        plain = KafkaBroker(cluster.bootstrap)  # the admin API, which the mock refuses
        try:
            assert len(b.create_topic("T", 3)) == len(b.create_topic("T", 3)) == 3
            with pytest.raises(ConfigError, match="partitions: topic 'T' exists with 3 partitions, not 2"):
                b.create_topic("T", 2)
            b.create_topic(dlq_topic("g"), 1)
            assert b.topics() == ["%DLQ%g", "T"]
            assert len(plain.create_topic("T", 3)) == 3  # exists: nothing to ask
            with pytest.raises(LitePushError, match="kafka-topics.sh .* --create --topic U --partitions 2"):
                plain.create_topic("U", 2)
        finally:
            b.close()
            plain.close()

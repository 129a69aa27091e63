"""``lite-push`` on a ``kafka://`` source: ``consume`` as a real subprocess
(stopped with SIGTERM) against librdkafka's mock cluster, which each test
starts on 127.0.0.1 and stops by its PID; the ``[source.kafka]`` table of the
config file; ``dlq list`` / ``dlq resend``; and the one-line errors of a
``kafka://`` URL the command cannot use (no cluster needed)."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from test_cli import Service, _check_consumed, _lines, assert_one_line_error, run_cli

from lite_push import ConfigError
from lite_push.cli.settings import load_settings
from lite_push.cli.sources import open_source
from lite_push.sources import dlq_topic
from lite_push.sources.contract import (
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_REASON,
    ORIGIN_MESSAGE_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    RECONSUME_TIME,
)
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

#: The group session of the consume runs, given in the URL's query (more
#: than the default revoke_timeout + fence_margin, 10.5 s, as it must be).
SESSION = 20


def _produce(broker: KafkaBroker, topic: str, n: int, keys: int) -> tuple[dict[str, list[int]], set[tuple[int, int]]]:
    """Send n keyed messages in one batch; return each key's bodies in send
    order and the (partition, offset) of every message."""
    items = [{"body": str(i).encode(), "keys": f"k{i % keys}"} for i in range(n)]
    results = broker.send_batch(topic, items)
    sent: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        sent[f"k{i % keys}"].append(i)
    return dict(sent), {(r.queue.queue_id, r.offset) for r in results}


# -- consume (subprocess) ---------------------------------------------------------


@pytest.mark.parametrize("variant", ["thread", "asyncio", "toml"])
def test_consume_on_kafka_drains_and_commits_on_sigterm(tmp_path: Path, variant: str) -> None:
    n, topic, group = 2000, "T", "g"
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        try:
            broker.create_topic(topic, 4)
            sent, stored = _produce(broker, topic, n, keys=37)
            assert len({q for q, _ in stored}) == 4  # the keys spread over every partition
            url = f"kafka://{cluster.bootstrap}?session_timeout={SESSION}"
            argv = ["--group", group, "--topic", topic, "--from", "first", "--no-metrics", "--lanes", "8"]
            if variant == "toml":
                # the file's [source.kafka] goes under the URL's query: the URL's
                # fetch.wait.max.ms wins, the file adds client.id
                config = tmp_path / "lite-push.toml"
                config.write_text(
                    textwrap.dedent(
                        f"""
                        [source]
                        url = "{url}&fetch.wait.max.ms=20"

                        [source.kafka]
                        "fetch.wait.max.ms" = 50
                        "client.id" = "cli-kafka-test"

                        [listener]
                        path = "cli_test_listener:handle"
                        """
                    )
                )
                argv += ["--config", str(config)]
            else:
                listener = "cli_test_listener:" + ("ahandle" if variant == "asyncio" else "handle")
                argv += ["--source", url, "--listener", listener]
            service = Service(tmp_path, argv)
            try:
                service.wait_consumed(n, timeout=45.0)
                code = service.stop(timeout=30.0)
            finally:
                service.kill()
            assert code == 0, service.output()
            lines = _lines(service.consumed)
            # every message exactly once (one member, nothing failed, shutdown drained)
            _check_consumed(lines, sent)
            handled = [(int(qid), int(off)) for _key, qid, off, _body in map(str.split, lines)]
            assert len(handled) == len(set(handled)) == n
            assert set(handled) == stored
            out = service.stdout.read_text()
            executor = "asyncio" if variant == "asyncio" else "thread"
            assert f"executor {executor}" in out and f"stopped: consumed {n:,}; offsets committed for " in out, out
            assert f"from kafka://{cluster.bootstrap}" in out
            for q in broker.queues(topic):
                committed = broker.committed(group, q)
                assert committed is not None and committed.offset == broker.watermarks(q)[1], q
        finally:
            broker.close()


# -- dlq --------------------------------------------------------------------------


def test_dlq_list_and_resend_on_kafka(capsys: pytest.CaptureFixture[str]) -> None:
    """Dead letters of group g (stored the way a source stores them) are
    listed and sent back to their topic through a kafka:// URL."""
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        try:
            broker.create_topic("T", 2)
            broker.ensure_topic(dlq_topic("g"), 1)
            for i in range(3):
                origin = {
                    DLQ_GROUP: "g",
                    DLQ_REASON: "max reconsume times exceeded",
                    DLQ_EXCEPTION: f"Traceback (most recent call last):\nValueError: bad {i}",
                    ORIGIN_TOPIC: "T",
                    ORIGIN_QUEUE_ID: "1",
                    ORIGIN_OFFSET: str(10 + i),
                    ORIGIN_MESSAGE_ID: f"T-1-{10 + i}",
                    RECONSUME_TIME: "2",
                }
                broker.send(
                    dlq_topic("g"), f"body {i}".encode(), keys=f"k{i}", tags="TagA", properties={"user": "u", **origin}
                )
            source = ("--source", f"kafka://{cluster.bootstrap}", "--group", "g")

            code, out, err = run_cli(capsys, "dlq", "list", *source, "--json")
            assert code == 0, err
            rows = [orjson.loads(line) for line in out.splitlines()]
            assert [r["dlq_offset"] for r in rows] == [0, 1, 2]
            assert [r["origin_offset"] for r in rows] == [10, 11, 12]
            assert rows[1]["body"] == "body 1" and rows[1]["keys"] == "k1" and rows[1]["tags"] == "TagA"
            assert rows[1]["properties"] == {"user": "u"} and rows[1]["reconsume_times"] == 2
            code, out, _ = run_cli(capsys, "dlq", "list", *source, "--start", "2")
            assert code == 0 and out.count("\n") == 1
            assert (
                "offset=2 origin=T/1/12 msg_id=T-1-12 reconsume_times=2" in out and "exception=ValueError: bad 2" in out
            )

            code, out, err = run_cli(capsys, "dlq", "resend", *source, "--offset", "1")
            assert code == 0, err
            assert out.startswith("resent offset=1 origin=T/1/11 -> T/"), out
            resent = [m for q in broker.queues("T") for m in broker.messages(q)]
            assert [(m.body, m.keys, m.tags, m.properties.get("user")) for m in resent] == [
                (b"body 1", "k1", "TagA", "u")
            ]
            assert ORIGIN_TOPIC not in resent[0].properties  # sent again from scratch

            code, _, err = run_cli(capsys, "dlq", "resend", *source, "--offset", "7")
            assert code == 2
            assert_one_line_error(err, "no dead letter at offset 7")
        finally:
            broker.close()


# -- the [source.kafka] table and the URL's query ---------------------------------


def test_the_url_query_wins_over_the_source_kafka_table(tmp_path: Path) -> None:
    path = tmp_path / "lite-push.toml"
    path.write_text(
        textwrap.dedent(
            """
            [source]
            url = "kafka://127.0.0.1:1"

            [source.kafka]
            "fetch.wait.max.ms" = 50
            "client.id" = "from-file"
            "enable.partition.eof" = true
            session_timeout = 9
            tags_header = "file-tags"
            """
        )
    )
    s = load_settings(config_file=path, environ={})
    assert s.get("source") == "kafka://127.0.0.1:1"
    assert s.kafka == {
        "fetch.wait.max.ms": 50,
        "client.id": "from-file",
        "enable.partition.eof": True,
        "session_timeout": 9,
        "tags_header": "file-tags",
    }
    broker = open_source(
        "kafka://127.0.0.1:1,127.0.0.1:2?fetch.wait.max.ms=20&session_timeout=7.5&key_encoding=hex", s.kafka
    )
    try:
        assert isinstance(broker, KafkaBroker)
        assert broker.bootstrap_servers == "127.0.0.1:1,127.0.0.1:2"
        assert broker.session_timeout == 7.5 and broker.tags_header == "file-tags" and broker.key_encoding == "hex"
        settings = broker.client_settings()
        assert settings["fetch.wait.max.ms"] == "20"  # the URL wins
        assert settings["client.id"] == "from-file" and settings["enable.partition.eof"] == "true"
        assert "session_timeout" not in settings and "tags_header" not in settings  # broker arguments, not properties
    finally:
        broker.close()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[source.kafka]\nbatch = [1, 2]\n", "source.kafka.batch"),
        ("[source.kafka.more]\nx = 1\n", "source.kafka.more"),
        ("[source]\nkafka = 'fetch.max.bytes=1'\n", "source.kafka"),
        ("[source.redis]\nx = 1\n", "source.redis"),
        ("[source]\nhost = 'x'\n", "source.host"),
    ],
)
def test_a_bad_source_table_names_the_key(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "lite-push.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=path, environ={})
    assert info.value.field == field


# -- errors (no cluster) ------------------------------------------------------------


@pytest.fixture
def ok_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "cli_kafka_ok_listener.py").write_text("def handle(msgs):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_kafka_ok_listener:handle"


@pytest.mark.parametrize("command", ["consume", "dlq"])
@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("kafka://", ["'kafka://': no host; expected kafka://host:port"]),
        ("kafka://?security.protocol=plaintext", ["no host"]),
        ("kafka://127.0.0.1:x", ["'127.0.0.1:x' is not host:port"]),
        ("kafka://127.0.0.1:9092?no.such.property=1", ["No such configuration property", "no.such.property"]),
        ("kafka://127.0.0.1:9092?group.id=x", ["group.id", "is set by lite_push"]),
        ("kafka://127.0.0.1:9092?fetch.max.bytes=lots", ["Invalid value", "fetch.max.bytes"]),
        ("kafka://127.0.0.1:9092?session_timeout=soon", ["session_timeout: must be a number of seconds"]),
        ("kafka://127.0.0.1:9092?session_timeout=0", ["session_timeout: must be seconds in [1, 3600]"]),
        ("kafka://u:secret@127.0.0.1:9092", ["kafka://u:***@127.0.0.1:9092", "sasl.username"]),
        ("kafka://127.0.0.1:9092?sasl.password=secret&group.id=x", ["sasl.password=***", "group.id"]),
    ],
)
def test_a_kafka_url_the_command_cannot_use_is_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str], ok_listener: str, command: str, url: str, fragments: list[str]
) -> None:
    if command == "consume":
        argv = ["consume", "--source", url, "--group", "g", "--topic", "T", "--listener", ok_listener]
    else:
        argv = ["dlq", "list", "--source", url, "--group", "g"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)
    assert "secret" not in err


def test_source_kafka_settings_with_another_source_are_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "lite-push.toml"
    path.write_text("[source]\nurl = 'embedded:/no/such/dir'\n[source.kafka]\n'client.id' = 'x'\n")
    code, out, err = run_cli(capsys, "dlq", "list", "--config", str(path), "--group", "g")
    assert code == 2 and out == ""
    assert_one_line_error(err, "[source.kafka] settings are for a kafka:// source")

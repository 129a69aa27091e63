"""``lite-push group describe`` and ``lite-push group reset-offsets``, and
``consume --from``'s notice on a group that has committed offsets, each run
as a subprocess (``python -m lite_push``) against a durable embedded broker
in a temporary directory, a redis-server the module starts on a loopback
port, and librdkafka's mock cluster.

On each source a group consumes a topic (a consumer in the test process, or
a ``consume`` subprocess), then more messages arrive: ``describe`` must show
the committed and end offsets the broker itself reports, and their
difference as the lag.  While a member lives, ``describe`` names it and
``reset-offsets --execute`` refuses naming it (embedded: the member's
process holds the directory, and the error names its PID).  Once it
stopped, a dry run changes nothing, ``--execute`` moves the committed
offsets, and the next member reads from there.  Messages are given distinct
store times by waiting for the clock to pass the last one (a millisecond),
never by sleeping for a set time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import wait_until
from test_cli import Service, _lines

from lite_push import Balance, ConsumerConfig, LitePushConsumer, MessageExt, MessageQueue
from lite_push.cli.settings import NON_CONFIG_ENV
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
FIRST = ConsumeFromWhere.FIRST_OFFSET

LISTENER = """
import os

def handle(msgs):
    with open(os.environ["GROUP_TEST_OUT"], "a") as f:
        f.write("".join(f"{m.queue_id} {m.queue_offset}\\n" for m in msgs))
"""


def _env(extra: dict[str, str] | None = None, path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k in NON_CONFIG_ENV}
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (path, REPO) if p is not None)
    return env


def lite_push(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m lite_push ARGV``, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "lite_push", *argv], capture_output=True, text=True, env=_env(), timeout=90
    )


def errors(p: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``lite-push: error:`` lines of ``p``'s stderr (a Kafka client may
    log lines of its own there)."""
    return [line for line in p.stderr.splitlines() if line.startswith("lite-push: error: ")]


def assert_error(p: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """``p`` exited ``code`` with one error line holding every fragment."""
    lines = errors(p)
    assert p.returncode == code and len(lines) == 1, (p.returncode, p.stdout, p.stderr)
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def describe(source: str, group: str, *extra: str) -> dict[str, Any]:
    p = lite_push("group", "describe", "--source", source, "--group", group, "--json", *extra)
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = orjson.loads(p.stdout)
    return doc


def reset(source: str, group: str, topic: str, to: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["--source", source, "--group", group, "--topic", topic, "--to", to, *extra]
    return lite_push("group", "reset-offsets", *argv)


def by_queue(doc: dict[str, Any], topic: str = "T") -> dict[int, dict[str, Any]]:
    return {r["queue"]: r for r in doc["queues"] if r["topic"] == topic}


def consume(broker: Any, group: str, n: int, *, balance: Balance = Balance.QUEUE) -> list[tuple[int, int]]:
    """Consume topic T as ``group`` in this process until ``n`` messages
    were seen; shut down (which commits); return (queue, offset) seen."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> None:
        with lock:
            seen.extend((m.queue_id, m.queue_offset) for m in msgs)

    extra = {"balance": balance} if balance is not Balance.QUEUE else {}
    source = broker.pull_consumer(group, consume_from=FIRST, **extra)
    config = ConsumerConfig(group=group, poll_timeout=0.02, commit_interval=0.05, revoke_timeout=2.0)
    consumer = LitePushConsumer(config, source=source, listener=listener)
    consumer.subscribe("T")
    with consumer:
        assert wait_until(lambda: len(seen) >= n, 60), f"saw {len(seen)} of {n}"
    return seen


def send(broker: Any, n: int, start: int = 0) -> None:
    broker.send_batch("T", [(str(start + i).encode(), f"k{(start + i) % 7}") for i in range(n)])


def after(broker: Any, queues: list[MessageQueue]) -> int:
    """A time (epoch ms) after every stored message's store time, waited
    for: what is sent next is stored at or after it."""
    last = max(m.store_timestamp for q in queues for m in broker.messages(q))
    while time.time() * 1000 < last + 2:
        time.sleep(0.001)
    return last + 1


def plan_rows(stdout: str) -> dict[int, list[int | None]]:
    """``reset-offsets``' table: queue -> [committed, new, end] (None for "-")."""
    lines = stdout.splitlines()
    start = lines.index(next(line for line in lines if line.split() == ["QUEUE", "COMMITTED", "NEW", "END"]))
    rows = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if len(cells) != 4 or not cells[0].isdigit():
            break
        rows[int(cells[0])] = [None if c == "-" else int(c) for c in cells[1:]]
    return rows


def consume_process(tmp_path: Path, source: str, group: str) -> Service:
    """``consume --from first`` of topic T as ``group``, a subprocess."""
    argv = ["--source", source, "--group", group, "--topic", "T", "--from", "first", "--no-metrics"]
    return Service(tmp_path, [*argv, "--listener", "cli_test_listener:handle"], _env())


def consumed_offsets(service: Service) -> list[list[str]]:
    """``[queue, offset]`` of each message the service's listener wrote."""
    return [line.split()[1:3] for line in _lines(service.consumed)]


NOTICE = "applies to new groups only"


# -- embedded (durable) ------------------------------------------------------------


def test_group_commands_on_a_durable_embedded_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    source = f"embedded:{data}"
    with EmbeddedBroker(data) as broker:
        queues = broker.create_topic("T", 2)
        send(broker, 40)
        assert len(consume(broker, "g", 40)) >= 40
        ends_a = {q.queue_id: broker.max_offset(q) for q in queues}
        stamp = after(broker, queues)
        send(broker, 20, 40)
        ends = {q.queue_id: broker.max_offset(q) for q in queues}
    assert all(ends[i] > ends_a[i] for i in ends)  # both queues got some of the later 20

    doc = describe(source, "g")
    with EmbeddedBroker(data) as broker:
        for q in queues:
            row = by_queue(doc)[q.queue_id]
            committed = broker.committed("g", q)
            assert committed is not None and row["committed"] == committed.offset == ends_a[q.queue_id]
            assert row["end"] == broker.max_offset(q) == ends[q.queue_id]
            assert row["lag"] == ends[q.queue_id] - ends_a[q.queue_id]
    assert doc["members"] == []

    # a live member: a consume process holds the directory; --from first on a
    # group with committed offsets says it does not apply
    service = consume_process(tmp_path, source, "g")
    try:
        service.wait_consumed(20)  # the 20 sent after the commit
        for p in (
            lite_push("group", "describe", "--source", source, "--group", "g"),
            reset(source, "g", "T", "first", "--execute"),
        ):
            assert_error(p, 1, f"in use by process {service.proc.pid}", "stop that process first", "not even read-only")
        assert service.stop() == 0, service.output()
    finally:
        service.kill()
    notice = [line for line in service.stderr.read_text().splitlines() if NOTICE in line]
    assert len(notice) == 1 and "WARNING" in notice[0] and "lite-push group reset-offsets" in notice[0], notice
    assert sorted(consumed_offsets(service)) == sorted(
        [str(q), str(o)] for q in ends for o in range(ends_a[q], ends[q])
    )  # it resumed from the committed offsets, not from the first

    # stopped: a dry run changes nothing, --execute moves the offsets
    plan = reset(source, "g", "T", "first")
    assert plan.returncode == 0 and "dry run" in plan.stdout, plan.stderr
    assert plan_rows(plan.stdout) == {i: [ends[i], 0, ends[i]] for i in ends}, plan.stdout
    assert {r["committed"] for r in describe(source, "g")["queues"]} == set(ends.values())
    done = reset(source, "g", "T", "first", "--execute")
    assert done.returncode == 0 and "reset: 2 queue(s)" in done.stdout, done.stderr
    with EmbeddedBroker(data) as broker:
        assert all(broker.committed("g", q).offset == 0 for q in queues)  # type: ignore[union-attr]
        again = consume(broker, "g", 60)  # a new member reads everything again
        assert set(again) >= {(q, o) for q in ends for o in range(ends[q])}

    # --to TIME: the first message stored at or after it (the later 20)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp // 1000)) + f".{stamp % 1000:03d}Z"
    done = reset(source, "g", "T", iso, "--execute")
    assert done.returncode == 0, done.stderr
    assert {i: r["committed"] for i, r in by_queue(describe(source, "g")).items()} == ends_a
    # one queue only
    done = reset(source, "g", "T", "last", "--queue", "1", "--execute")
    assert done.returncode == 0, done.stderr
    assert {i: r["committed"] for i, r in by_queue(describe(source, "g")).items()} == {0: ends_a[0], 1: ends[1]}


# -- Redis -------------------------------------------------------------------------


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[tuple[RedisBroker, str]]:
    namespace = f"grp-{uuid.uuid4().hex[:12]}"
    broker = RedisBroker(redis_server.url, namespace=namespace)
    try:
        yield broker, f"{redis_server.url}?namespace={namespace}"
    finally:
        broker.close()


def test_group_commands_on_redis(redis: tuple[RedisBroker, str], tmp_path: Path) -> None:
    broker, source = redis
    queues = broker.create_topic("T", 2)
    send(broker, 40)
    consume(broker, "g", 40)
    ends_a = {q.queue_id: broker.max_offset(q) for q in queues}
    stamp = after(broker, queues)
    send(broker, 20, 40)
    ends = {q.queue_id: broker.max_offset(q) for q in queues}

    doc = describe(source, "g")
    assert doc["members"] == [] and doc["missing_topics"] == []
    for q in queues:
        row = by_queue(doc)[q.queue_id]
        committed = broker.committed("g", q)
        assert committed is not None and row["committed"] == committed.offset == ends_a[q.queue_id]
        assert row["end"] == ends[q.queue_id] and row["lag"] == ends[q.queue_id] - ends_a[q.queue_id]
        assert row["in_flight"] is None  # balanced by queue: only the member knows

    # a live member of a new group: a consume process (--from first on a new
    # group: no notice)
    service = consume_process(tmp_path, source, "g2")
    try:
        service.wait_consumed(60)
        live = describe(source, "g2")
        (member,) = live["members"]
        assert f"@{service.proc.pid}@" in member["client_id"] and member["topics"] == ["T"]
        assert 0 <= member["last_heartbeat"] < 30
        assert {tuple(r["owners"]) for r in live["queues"]} == {(member["client_id"],)}
        text = lite_push("group", "describe", "--source", source, "--group", "g2").stdout
        assert "members: 1" in text and member["client_id"] in text and "LAST-HEARTBEAT" in text
        refused = reset(source, "g2", "T", "first", "--execute")
        assert_error(refused, 1, "group 'g2' has 1 live member(s)", member["client_id"], "stop them first")
        assert refused.stdout == ""
        plan = reset(source, "g2", "T", "first")
        assert plan.returncode == 0 and "--execute refuses until they stop" in plan.stdout, plan.stderr
        assert service.stop() == 0, service.output()
    finally:
        service.kill()
    assert NOTICE not in service.stderr.read_text()
    assert describe(source, "g2")["members"] == []  # it left the group at shutdown

    # stopped: dry run, then --execute; the next member reads it all again
    assert reset(source, "g2", "T", "first").returncode == 0
    assert [broker.committed("g2", q).offset for q in queues] == [ends[0], ends[1]]  # type: ignore[union-attr]
    assert reset(source, "g2", "T", "first", "--execute").returncode == 0
    assert [broker.committed("g2", q).offset for q in queues] == [0, 0]  # type: ignore[union-attr]
    assert set(consume(broker, "g2", 60)) >= {(q, o) for q in ends for o in range(ends[q])}

    # --to epoch ms: the first message stored at or after it
    plan = reset(source, "g", "T", str(stamp))
    assert plan.returncode == 0, plan.stderr
    assert plan_rows(plan.stdout) == {i: [ends_a[i], ends_a[i], ends[i]] for i in ends}, plan.stdout
    assert [broker.committed("g", q).offset for q in queues] == [ends_a[0], ends_a[1]]  # type: ignore[union-attr]
    broker.group_admin("g").reset({q: 0 for q in queues})
    assert reset(source, "g", "T", str(stamp), "--execute").returncode == 0
    assert [broker.committed("g", q).offset for q in queues] == [ends_a[0], ends_a[1]]  # type: ignore[union-attr]


def test_a_redis_group_balanced_by_message_shows_its_in_flight_messages(redis: tuple[RedisBroker, str]) -> None:
    broker, source = redis
    queues = broker.create_topic("T", 2)
    send(broker, 20)
    release = threading.Event()
    started = threading.Event()

    def listener(msgs: list[MessageExt]) -> None:
        started.set()
        release.wait(30)

    source_ = broker.pull_consumer("m", consume_from=FIRST, balance=Balance.MESSAGE)
    config = ConsumerConfig(group="m", poll_timeout=0.02, commit_interval=0.05, revoke_timeout=2.0)
    consumer = LitePushConsumer(config, source=source_, listener=listener)
    consumer.subscribe("T")
    with consumer:
        try:
            assert started.wait(30)
            doc = describe(source, "m")
            (member,) = doc["members"]
            rows = by_queue(doc)
            assert sum(r["in_flight"] for r in rows.values()) >= 1  # delivered, not acknowledged
            assert any(r["owners"] == [member["client_id"]] for r in rows.values())
        finally:
            release.set()
        assert wait_until(lambda: consumer.stats().consumed >= 20, 30)
    # stopped: every message acknowledged; a reset moves the group's position
    assert all(broker.committed("m", q).offset == broker.max_offset(q) for q in queues)  # type: ignore[union-attr]
    assert reset(source, "m", "T", "first", "--execute").returncode == 0
    assert all(broker.committed("m", q).offset == 0 for q in queues)  # type: ignore[union-attr]
    assert {r["in_flight"] for r in describe(source, "m")["queues"]} == {0}
    assert len(set(consume(broker, "m", 20, balance=Balance.MESSAGE))) == 20


# -- Kafka (librdkafka's mock cluster) ---------------------------------------------


def test_group_commands_on_the_kafka_mock_cluster() -> None:
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        source = f"kafka://{cluster.bootstrap}"
        try:
            queues = broker.create_topic("T", 2)
            send(broker, 40)
            consume(broker, "g", 40)
            ends_a = {q.queue_id: broker.watermarks(q)[1] for q in queues}
            stamp = after(broker, queues)
            send(broker, 20, 40)
            ends = {q.queue_id: broker.watermarks(q)[1] for q in queues}

            doc = describe(source, "g", "--topic", "T")
            assert doc["members"] is None and "kafka-consumer-groups.sh" in doc["members_unknown"]
            for q in queues:
                row = by_queue(doc)[q.queue_id]
                committed = broker.committed("g", q)
                assert committed is not None and row["committed"] == committed.offset == ends_a[q.queue_id]
                assert row["end"] == ends[q.queue_id] and row["lag"] == ends[q.queue_id] - ends_a[q.queue_id]
                assert row["owners"] is None and row["in_flight"] is None
            text = lite_push("group", "describe", "--source", source, "--group", "g", "--topic", "T").stdout
            assert "members: unknown" in text and "--describe --members" in text

            # the mock cannot list a group's topics, nor reset a group that had members
            assert_error(lite_push("group", "describe", "--source", source, "--group", "g"), 2, "--topic")
            plan = reset(source, "g", "T", "first")
            assert plan.returncode == 0 and "dry run" in plan.stdout, plan.stderr
            refused = reset(source, "g", "T", "first", "--execute")
            assert_error(refused, 1, "UNKNOWN_MEMBER_ID", "kafka-consumer-groups.sh", "--reset-offsets", "--topic T")
            assert [broker.committed("g", q).offset for q in queues] == [ends_a[0], ends_a[1]]  # type: ignore[union-attr]
            assert_error(reset(source, "g", "T", str(stamp)), 1, "cannot search by time", "--to-datetime")

            # a group that never had members is reset by the admin API itself
            assert reset(source, "fresh", "T", "first", "--execute").returncode == 0
            assert [broker.committed("fresh", q).offset for q in queues] == [0, 0]  # type: ignore[union-attr]
            seen = consume(broker, "fresh", 60)
            assert set(seen) >= {(q, o) for q in ends for o in range(ends[q])}
        finally:
            broker.close()


# -- bad input ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = tmp_path_factory.mktemp("group-bad-input")
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 2)
        send(broker, 4)
        source = broker.pull_consumer("g")
        source.subscribe("T")
        source.poll(0.1)
        source.commit({q: 1 for q in broker.queues("T")})
        source.close()
    return f"embedded:{data}"


#: What a topic the directory does not have says.
NOPE = ["topic 'NOPE' does not exist on embedded:", "(topics there: T)"]


@pytest.mark.parametrize(
    ("argv", "code", "fragments"),
    [
        (["describe", "--group", "nope"], 2, ["group 'nope' has no committed offsets on this source and no members"]),
        (["describe", "--group", "nope", "--topic", "T"], 2, ["on topic 'T' and no members"]),
        (["describe", "--group", "g", "--topic", "NOPE"], 1, NOPE),
        (["describe"], 2, ["--group is required"]),
        (["reset-offsets", "--group", "g", "--to", "first"], 2, ["--topic is required"]),
        (["reset-offsets", "--group", "g", "--topic", "T"], 2, ["--to"]),
        (["reset-offsets", "--group", "g", "--topic", "T", "--to", "soon"], 2, ["--to: expected first, last"]),
        (["reset-offsets", "--group", "g", "--topic", "T", "--to", "2026-11-26T10:00:00"], 2, ["no time zone"]),
        (["reset-offsets", "--group", "g", "--topic", "T", "--to", "1700000000"], 2, ["seconds?"]),
        (
            ["reset-offsets", "--group", "g", "--topic", "T", "--to", "first", "--queue", "5"],
            2,
            ["--queue: topic 'T' has queues 0 to 1; no queue 5"],
        ),
        (["reset-offsets", "--group", "g", "--topic", "T", "--to", "first", "--queue", "x"], 2, ["--queue"]),
        (["reset-offsets", "--group", "g", "--topic", "NOPE", "--to", "first"], 1, NOPE),
    ],
)
def test_bad_input_is_one_line(small_dir: str, argv: list[str], code: int, fragments: list[str]) -> None:
    p = lite_push("group", *argv, "--source", small_dir)
    line = assert_error(p, code, *fragments)
    assert p.stderr.strip() == line and p.stdout == ""


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        (["group"], ["describe", "reset-offsets"]),
        (["group", "describe"], ["--source", "--group", "--topic", "--json", "--config", "LITE_PUSH_GROUP"]),
        (["group", "reset-offsets"], ["--topic", "--to", "--queue", "--execute", "prints the plan", "live members"]),
    ],
)
def test_help(argv: list[str], mentions: list[str]) -> None:
    p = lite_push(*argv, "--help")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    for m in mentions:
        assert m in text, m


@pytest.mark.parametrize(
    ("flags", "env", "toml", "given"),
    [
        ([], {}, "", False),
        (["--from", "first"], {}, "", True),
        ([], {"LITE_PUSH_FROM": "first"}, "", True),
        ([], {}, '[subscription]\nfrom = "last"\n', True),
    ],
    ids=["default", "flag", "environment", "file"],
)
def test_from_counts_as_given_from_a_flag_the_environment_or_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], env: dict[str, str], toml: str, given: bool
) -> None:
    """Only a --from given on purpose (not the default) makes consume check
    the group's committed offsets for the notice."""
    from lite_push.cli.parser import build_parser
    from lite_push.cli.plan import plan_of

    (tmp_path / "group_test_listener.py").write_text(LISTENER)
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    config = tmp_path / "c.toml"
    config.write_text(toml)
    argv = ["consume", "--source", "embedded:/x", "--group", "g", "--topic", "T", "--config", str(config)]
    args = build_parser().parse_args([*argv, "--listener", "group_test_listener:handle", *flags])
    plan, _, _ = plan_of(args)
    assert plan.from_given is given

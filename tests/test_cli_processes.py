"""``lite-push consume --processes N`` (issue 19, item 1): the setting from a
flag, ``LITE_PUSH_PROCESSES`` or the ``[service]`` table; what is refused
before any member starts; and N members run as a real subprocess against a
redis-server this module starts on a loopback port (and librdkafka's mock
cluster), stopped with SIGTERM: everything consumed once, in key order, and
committed."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import http_get as _get
from helpers import wait_until
from test_cli import Service, _check_consumed, _lines, _produce, _toml, assert_one_line_error, run_cli

from lite_push import ConfigError, MessageQueue
from lite_push.cli.consume_processes import stopped_line
from lite_push.cli.settings import load_settings
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer, free_port


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[tuple[str, RedisBroker]]:
    """A namespace of the test's own: its URL and a broker on it."""
    ns = f"clip-{uuid.uuid4().hex[:12]}"
    b = RedisBroker(redis_server.url, namespace=ns)
    yield f"{redis_server.url}?namespace={ns}", b
    b.close()


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "procs_listener.py").write_text("def handle(msgs):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "procs_listener:handle"


# -- the setting ------------------------------------------------------------------


def test_processes_comes_from_a_flag_the_environment_or_the_service_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[service]\nprocesses = 2\n")
    assert load_settings(environ={}).processes == 1  # the default: one process, as before
    assert load_settings(config_file=path, environ={}).processes == 2
    env = {"LITE_PUSH_PROCESSES": "3"}
    assert load_settings(config_file=path, environ=env).processes == 3  # env > file
    s = load_settings({"processes": 4}, config_file=path, environ=env)
    assert s.processes == 4 and s.origins["processes"] == "--processes"  # flag > env
    assert load_settings(config_file=path, environ={}).origins["processes"].endswith("[service] processes")


@pytest.mark.parametrize(
    ("env", "toml"),
    [
        ({"LITE_PUSH_PROCESSES": "two"}, None),
        ({"LITE_PUSH_PROCESSES": "0"}, None),
        ({"LITE_PUSH_PROCESSES": "-1"}, None),
        ({"LITE_PUSH_PROCESSES": "1.5"}, None),
        ({}, "[service]\nprocesses = 0\n"),
        ({}, "[service]\nprocesses = true\n"),
        ({}, "[service]\nprocesses = '2x'\n"),
    ],
)
def test_a_bad_processes_value_names_it(tmp_path: Path, env: dict[str, str], toml: str | None) -> None:
    path = None if toml is None else _toml(tmp_path, toml)
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=path, environ=env)
    assert info.value.field == "processes"


def test_an_unknown_key_of_the_service_table_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=_toml(tmp_path, "[service]\nprocesses = 2\nthreads = 4\n"), environ={})
    assert info.value.field == "service.threads" and "processes" in str(info.value)


def test_the_help_tells_of_processes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "consume", "--help")
    assert code == 0
    assert "--processes N" in out and "LITE_PUSH_PROCESSES" in out and "[service]" in out


# -- refused before any member starts ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--processes", "0"], {}, "processes: must be an int >= 1, got 0"),
        (["--processes", "-1"], {}, "processes: must be an int >= 1, got -1"),
        (["--processes", "two"], {}, "--processes: invalid int value: 'two'"),
        ([], {"LITE_PUSH_PROCESSES": "0"}, "processes: LITE_PUSH_PROCESSES: must be an int >= 1, got 0"),
    ],
)
def test_a_bad_processes_value_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    listener: str,
    argv: list[str],
    env: dict[str, str],
    fragment: str,
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, out, err = run_cli(
        capsys,
        "consume",
        "--source",
        "redis://127.0.0.1:1",
        "--group",
        "g",
        "--topic",
        "T",
        "--listener",
        listener,
        *argv,
    )
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


def test_an_embedded_source_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, listener: str) -> None:
    code, out, err = run_cli(
        capsys,
        "consume",
        "--processes",
        "2",
        "--source",
        f"embedded:{tmp_path}",
        "--group",
        "g",
        "--topic",
        "T",
        "--listener",
        listener,
    )
    assert code == 2 and out == ""
    assert_one_line_error(err, "--processes 2: an embedded: source belongs to the one process that opens it")


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (["--topic", "NOPE"], 1, "topic 'NOPE' does not exist on redis://127.0.0.1:"),
        (["--topic", "T", "--tags", "A || "], 2, "tags 'A || '"),
        (["--topic", "T", "--lanes", "0"], 2, "lanes:"),
    ],
)
def test_what_fails_before_the_members_start_fails_at_once(
    capsys: pytest.CaptureFixture[str],
    broker: tuple[str, RedisBroker],
    listener: str,
    argv: list[str],
    code: int,
    fragment: str,
) -> None:
    url, b = broker
    b.create_topic("T", 2)
    got, out, err = run_cli(
        capsys,
        "consume",
        "--processes",
        "2",
        "--source",
        url,
        "--group",
        "g",
        "--listener",
        listener,
        "--log-level",
        "ERROR",
        *argv,
    )
    assert got == code and out == ""
    assert_one_line_error(err, fragment)


def test_an_unreachable_source_fails_at_once(capsys: pytest.CaptureFixture[str], listener: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, err = run_cli(
        capsys,
        "consume",
        "--processes",
        "2",
        "--source",
        url,
        "--group",
        "g",
        "--topic",
        "T",
        "--listener",
        listener,
    )
    assert code == 1 and out == ""
    assert_one_line_error(err, "ConnectionError")


# -- members running (subprocess) ----------------------------------------------------------


def _members_consumed(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        page = r.read().decode()
    found = re.findall(r"^lite_push_messages_processed_total\{([^}]*)\} (\S+)$", page, re.MULTILINE)
    out: dict[str, float] = {}
    for labels, value in found:
        if 'outcome="success"' in labels:
            member = re.search(r'member="(\d+)"', labels)
            assert member, labels
            out[member[1]] = float(value)
    return out


@pytest.mark.parametrize("variant", ["flag", "env"])
def test_two_members_on_redis_drain_and_commit_on_sigterm(
    broker: tuple[str, RedisBroker], tmp_path: Path, variant: str
) -> None:
    url, b = broker
    n = 1000
    b.create_topic("ORDERS", 4)
    sent = _produce(b, "ORDERS", n, keys=37)
    argv = ["--source", url, "--group", "svc", "--topic", "ORDERS", "--from", "first", "--lanes", "8"]
    if variant == "flag":
        service = Service(
            tmp_path, [*argv, "--processes", "2", "--metrics-port", "0", "--listener", "cli_test_listener:handle"]
        )
    else:
        service = Service(
            tmp_path,
            [*argv, "--listener", "cli_test_listener:ahandle"],
            env={"LITE_PUSH_PROCESSES": "2"},
        )
    try:
        service.wait_consumed(n)
        if variant == "flag":  # one scrape target: both members, summing to what was consumed
            (metrics,) = re.findall(r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", service.stdout.read_text(), re.M)
            # (a member that has not started yet under a loaded machine is not on it yet)
            assert wait_until(lambda: set(_members_consumed(metrics)) == {"0", "1"}, timeout=60)
            consumed = _members_consumed(metrics)
            assert sum(consumed.values()) == n, consumed
        code = service.stop()
    finally:
        service.kill()
    assert code == 0, service.output()
    lines = _lines(service.consumed)
    _check_consumed(lines, sent)  # every message once, each key in offset order
    out = service.stdout.read_text()
    executor = "thread" if variant == "flag" else "asyncio"
    assert f"8 lanes per process, executor {executor}, listener cli_test_listener:" in out, out
    assert ", 2 processes)" in out
    assert "SIGTERM: stopping 2 members (waiting up to 30s for the listener calls running)" in out
    # each member committed what it owned at the end (a member that joined late may own nothing yet)
    owned = (
        r"(offsets committed for \d queues?|no queue owned at the end, nothing to commit"
        r"|stopped before its consumer started, nothing to commit)"  # a loaded machine: one started late
    )
    last = rf"^stopped: consumed {len(lines):,} \(2 members\); member 0: {owned}; member 1: {owned}$"
    assert re.search(last, out, re.M), out
    assert ("metrics:" in out) == (variant == "flag")
    reader = b.pull_consumer("svc")
    try:
        for q in b.queues("ORDERS"):
            committed = reader.committed(q)
            assert committed is not None and committed.offset == b.max_offset(q), q
    finally:
        reader.close()


def _committed_to_the_end(broker: KafkaBroker, queues: list[MessageQueue]) -> bool:
    for q in queues:
        committed = broker.committed("g", q)
        end = broker.watermarks(q)[1]
        if (committed.offset if committed is not None else 0) != end:  # an empty partition has no commit
            return False
    return True


def test_two_members_on_kafka(tmp_path: Path) -> None:
    """Both members join (the supervisor's /readyz says so), then the
    messages come.  The mock cluster completes a join after session - 1 s:
    a short session (and a revoke timeout inside it) keeps this quick."""
    n = 1000
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        try:
            broker.create_topic("T", 4)
            service = Service(
                tmp_path,
                [
                    "--source",
                    f"kafka://{cluster.bootstrap}?session_timeout=2",
                    "--group",
                    "g",
                    "--topic",
                    "T",
                    "--from",
                    "first",
                    "--lanes",
                    "8",
                    "--listener",
                    "cli_test_listener:handle",
                    "--processes",
                    "2",
                    "--metrics-port",
                    "0",
                ],
                env={"LITE_PUSH_REVOKE_TIMEOUT": "1.0", "LITE_PUSH_COMMIT_INTERVAL": "0.2"},
            )
            try:
                assert wait_until(lambda: "metrics: " in service.stdout.read_text() or service.proc.poll() is not None)
                (metrics,) = re.findall(r"^metrics: (\S+)/metrics$", service.stdout.read_text(), re.M)
                assert wait_until(lambda: _get(metrics + "/readyz") == (200, "ok\n"), timeout=60), service.output()
                broker.send_batch("T", [{"body": str(i).encode(), "keys": f"k{i % 37}"} for i in range(n)])
                service.wait_consumed(n, timeout=60)
                queues = broker.queues("T")
                # committed as it goes (every 0.2 s): a member leaving during the rebalance of
                # the other's leave may have its last commit refused by the coordinator
                assert wait_until(lambda: _committed_to_the_end(broker, queues), timeout=30)
                code = service.stop()
            finally:
                service.kill()
            assert code == 0, service.output()
            sent: dict[str, list[int]] = {}
            for i in range(n):
                sent.setdefault(f"k{i % 37}", []).append(i)
            _check_consumed(_lines(service.consumed), sent)
            out = service.stdout.read_text()
            assert "stopped: consumed 1,000 (2 members); member 0: offsets committed" in out, out
            assert _committed_to_the_end(broker, queues)
        finally:
            broker.close()


COMMITS = "; member 0: offsets committed for 2 queues; member 1: did not say what it committed (see the log)"


@pytest.mark.parametrize(
    ("short", "failure", "code", "line"),
    [
        ((), None, 0, "stopped: consumed 4,000 (2 members)" + COMMITS),
        (
            (1,),
            None,
            0,
            "stopped: consumed 4,000 (2 members; the count of member 1, killed, is as of its last report)" + COMMITS,
        ),
        (
            (0, 1),
            None,
            1,
            "stopped: consumed 4,000 (2 members; the counts of members 0, 1, killed, are as of their last reports); "
            "a member did not stop cleanly (see the log)" + COMMITS,
        ),
        ((), "member 0 ended 5 times", 1, "stopped: member 0 ended 5 times; consumed 4,000 (2 members)" + COMMITS),
    ],
)
def test_the_last_line_says_whose_count_is_as_of_a_last_report(
    short: tuple[int, ...], failure: str | None, code: int, line: str
) -> None:
    members = (
        SimpleNamespace(index=0, commits="offsets committed for 2 queues"),
        SimpleNamespace(index=1, commits=None),
    )
    supervisor: Any = SimpleNamespace(
        consumed=4000, consumed_short=short, processes=2, failure=failure, members=members
    )
    assert stopped_line(supervisor, code) == line

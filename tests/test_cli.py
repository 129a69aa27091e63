"""The ``lite-push`` command: parsing, settings, and each command end to end.

``consume`` runs as a real subprocess (it is stopped with SIGTERM) against a
redis-server this module starts on a loopback port, and against a durable
embedded broker; the other commands run in process through
:func:`lite_push.cli.main`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_until

from lite_push import (
    ConfigError,
    ConsumeMode,
    ConsumerConfig,
    ConsumerStats,
    LitePushConsumer,
    MessageExt,
    MessageQueue,
    cli,
    demo,
)
from lite_push.__main__ import main as module_main
from lite_push.cli.process_gc import GEN0_THRESHOLD, PYTHON_GEN0_THRESHOLD, prepare_gc
from lite_push.cli.settings import NON_CONFIG_ENV, load_settings
from lite_push.sources import ConsumeFromWhere, EmbeddedBroker
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer, free_port

FIRST = ConsumeFromWhere.FIRST_OFFSET
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The server's URL with a namespace of the test's own."""
    return f"{redis_server.url}?namespace=cli-{uuid.uuid4().hex[:12]}"


def _namespace(url: str) -> str:
    return url.rsplit("namespace=", 1)[1]


#: consume's required settings, on a source that is not there
NOWHERE_CONSUME = ("--source", "embedded:/no/such/dir", "--group", "g", "--topic", "T")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lite-push: error: "), err
    for f in fragments:
        assert f in lines[0], err


# -- help and argument errors ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        ([], ["demo", "consume", "dlq"]),
        (
            ["demo"],
            [
                "--messages",
                "--queues",
                "--keys",
                "--lanes",
                "--io-ms",
                "--metrics-port",
                "--no-metrics",
            ],
        ),
        (
            ["consume"],
            [
                "--source",
                "--group",
                "--topic",
                "--listener",
                "--tags",
                "--mode",
                "--lanes",
                "--executor",
            ]
            + ["--config", "--metrics-port", "--from", "LITE_PUSH_LANES", "[consumer]"],
        ),
        (["dlq"], ["list", "resend"]),
        (["dlq", "list"], ["--source", "--group", "--limit", "--json", "--config"]),
        (["dlq", "resend"], ["--source", "--group", "--offset", "--all", "--config"]),
    ],
)
def test_help_of_every_command(capsys: pytest.CaptureFixture[str], argv: list[str], mentions: list[str]) -> None:
    code, out, err = run_cli(capsys, *argv, "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: lite-push")
    for m in mentions:
        assert m in out


def test_the_benchmarks_are_not_commands(capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark scripts need the source checkout; the installed command
    does not offer them."""
    for command in ("bench", "gen-load"):
        code, out, err = run_cli(capsys, command)
        assert code == 2 and out == ""
        assert f"invalid choice: '{command}'" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.startswith("lite-push 0.")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "COMMAND"),
        (["nosuch"], "invalid choice"),
        (["demo", "--lanes", "x"], "--lanes"),
        (["demo", "--messages", "-5"], "--messages"),
        (["demo", "--io-ms", "-1"], "--io-ms"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["consume", "--lanes", "many"], "--lanes"),
        (["consume", "--mode", "SIDEWAYS"], "--mode"),
        (["consume", "--from", "middle"], "--from"),
        (["consume"], "--source is required"),
        (["consume", "--source", "redis://127.0.0.1:1"], "--group is required"),
        (["dlq"], "ACTION"),
        (["dlq", "list", "--limit", "-1"], "--limit"),
        (["dlq", "list", "--group", "g"], "--source is required"),
        (
            ["dlq", "resend", "--source", "redis://127.0.0.1:1", "--group", "g"],
            "--offset --all",
        ),
        (["dlq", "resend", "--offset", "1", "--all"], "not allowed with"),
        (
            ["dlq", "list", "--source", "nosuch://host:9092", "--group", "g"],
            "expected redis://",
        ),
        (
            ["dlq", "list", "--source", "embedded:/no/such/dir", "--group", "g"],
            "the directory /no/such/dir does not exist",
        ),
        (  # issue 30, 5: a database that is no number is not db 0
            ["dlq", "list", "--source", "redis://127.0.0.1:1/abc", "--group", "g"],
            "the database must be a number (redis://host:port/0), got 'abc'",
        ),
        (  # issue 30, 5: a misspelt parameter is named, with the accepted ones
            ["dlq", "list", "--source", "redis://127.0.0.1:1/0?namespce=x", "--group", "g"],
            "unknown query parameter 'namespce'; accepted: db, ",
        ),
        (
            ["dlq", "list", "--source", "redis://127.0.0.1:1?ssl_certfile=x", "--group", "g"],
            "unknown query parameter 'ssl_certfile'",  # TLS settings are for rediss://
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


def test_the_module_entry_point_exits_2_with_one_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "lite_push", "demo", "--lanes", "x"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert_one_line_error(r.stderr, "--lanes")
    assert module_main(["--version"]) == 0


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["demo", "--lanes", "0", "--messages", "10"], {}),
        (["consume", "--lanes", "0"], {}),
        (["consume"], {"LITE_PUSH_LANES": "0"}),
        (["consume", "--lanes", "2000"], {}),
    ],
)
def test_a_bad_config_value_names_the_field(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if argv[0] == "consume":
        (tmp_path / "ok_listener.py").write_text("def handle(msgs):\n    return None\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        argv = [*argv, *NOWHERE_CONSUME, "--listener", "ok_listener:handle"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, "lanes:")


# -- settings -------------------------------------------------------------------


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lite-push.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_precedence_flag_env_file_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
        [consumer]
        group = "from-file"
        mode = "CONCURRENTLY"
        lanes = 4
        commit_interval = 2
        batch_size = 8

        [source]
        url = "redis://file:6379/0"

        [listener]
        path = "file_mod:handle"

        [subscription]
        topic = "FILE"
        from = "first"
        """,
    )
    monkeypatch.setenv("LITE_PUSH_LANES", "8")
    monkeypatch.setenv("LITE_PUSH_COMMIT_INTERVAL", "3.5")
    monkeypatch.setenv("LITE_PUSH_SOURCE", "redis://env:6379/0")
    monkeypatch.setenv("LITE_PUSH_METRICS_PORT", "9464")
    monkeypatch.setenv("LITE_PUSH_OFFSET_DIR", str(tmp_path))  # not a setting: allowed
    s = load_settings({"lanes": 16, "topic": "FLAG"}, config_file=path)
    config = s.consumer_config()
    assert config.lanes == 16  # flag > env > file
    assert config.commit_interval == 3.5  # env > file
    assert config.mode is ConsumeMode.CONCURRENTLY  # file > default
    assert config.batch_size == 8 and config.group == "from-file"
    assert config.metrics_port == 9464
    assert config.pull_batch_size == ConsumerConfig(group="x").pull_batch_size  # default
    assert s.get("source") == "redis://env:6379/0" and s.get("topic") == "FLAG"
    assert s.get("listener") == "file_mod:handle" and s.get("from") == "first" and s.get("tags") is None
    assert s.origins["lanes"] == "--lanes" and s.origins["commit_interval"] == "LITE_PUSH_COMMIT_INTERVAL"
    assert s.origins["mode"].endswith("[consumer] mode")

    # without the flag, the environment wins; without both, the file
    assert load_settings({}, config_file=path).consumer_config().lanes == 8
    monkeypatch.delenv("LITE_PUSH_LANES")
    assert load_settings({}, config_file=path).consumer_config().lanes == 4
    assert load_settings({"group": "g"}).consumer_config().lanes == ConsumerConfig(group="g").lanes


def test_values_convert_to_the_field_type(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "LITE_PUSH_GROUP": "g",
        "LITE_PUSH_MODE": "queue_orderly",
        "LITE_PUSH_MAX_RECONSUME_TIMES": "-1",
        "LITE_PUSH_POLL_TIMEOUT": "0.25",
        "LITE_PUSH_METRICS_PORT": "none",
        "LITE_PUSH_METRICS_ADDR": "0.0.0.0",
        "LITE_PUSH_LANE_PLACEMENT": "hash",
    }
    config = load_settings(environ=env).consumer_config()
    assert config.mode is ConsumeMode.QUEUE_ORDERLY and config.max_reconsume_times == -1
    assert config.lane_placement == "hash"
    # the flag beats the environment
    assert load_settings({"lane_placement": "java"}, environ=env).consumer_config().lane_placement == "java"
    assert config.poll_timeout == 0.25 and config.metrics_port is None and config.metrics_addr == "0.0.0.0"
    # --no-metrics: a flag given as None beats the environment
    s = load_settings(
        {"metrics_port": None},
        environ={"LITE_PUSH_GROUP": "g", "LITE_PUSH_METRICS_PORT": "1"},
    )
    assert s.consumer_config().metrics_port is None
    # steal_after: a number, a word, or none; slow_call_warning: a number or none
    for raw, want in (("2.5", 2.5), ("auto", "auto"), ("none", None)):
        got = load_settings(environ={"LITE_PUSH_GROUP": "g", "LITE_PUSH_STEAL_AFTER": raw}).consumer_config()
        assert got.steal_after == want
    with pytest.raises(ConfigError, match="slow_call_warning"):
        load_settings(environ={"LITE_PUSH_GROUP": "g", "LITE_PUSH_SLOW_CALL_WARNING": "off"}).consumer_config()
    assert (
        load_settings(environ={"LITE_PUSH_GROUP": "g", "LITE_PUSH_SLOW_CALL_WARNING": "none"})
        .consumer_config()
        .slow_call_warning
        is None
    )
    with pytest.raises(ConfigError, match="steal_after.*'soon'"):
        load_settings(environ={"LITE_PUSH_GROUP": "g", "LITE_PUSH_STEAL_AFTER": "soon"}).consumer_config()


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"LITE_PUSH_LANES": "sixteen"}, "lanes"),
        ({"LITE_PUSH_LANES": "1.5"}, "lanes"),
        ({"LITE_PUSH_COMMIT_INTERVAL": "soon"}, "commit_interval"),
        ({"LITE_PUSH_MODE": "SIDEWAYS"}, "mode"),
        ({"LITE_PUSH_LANEZ": "4"}, "LITE_PUSH_LANEZ"),
        ({"LITE_PUSH_KEY_EXTRACTOR": "m:f"}, "LITE_PUSH_KEY_EXTRACTOR"),
    ],
)
def test_bad_environment_names_the_key(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[consumer]\nlanez = 4\n", "lanez"),
        ("[consumer]\nlanes = '4x'\n", "lanes"),
        ("[consumer]\nlanes = true\n", "lanes"),
        ("[consumer]\nmode = 3\n", "mode"),
        ("[consumer]\nkey_extractor = 'm:f'\n", "key_extractor"),
        ("[consumers]\nlanes = 4\n", "consumers"),
        ("[source]\nhost = 'x'\n", "source.host"),
        ("lanes = 4\n", "lanes"),
        ("[consumer\n", "config"),
    ],
)
def test_bad_toml_names_the_key(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=_toml(tmp_path, text), environ={})
    assert info.value.field == field


def test_config_errors_reach_the_user_as_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _toml(tmp_path, "[consumer]\ngroup = 'g'\nlanez = 4\n")
    code, _, err = run_cli(capsys, "dlq", "list", "--source", "redis://127.0.0.1:1", "--config", str(path))
    assert code == 2
    assert_one_line_error(err, "lanez")
    code, _, err = run_cli(capsys, "dlq", "list", "--config", str(tmp_path / "missing.toml"))
    assert code == 2
    assert_one_line_error(err, "config: cannot read")
    monkeypatch.setenv("LITE_PUSH_NOPE", "1")
    code, _, err = run_cli(capsys, "dlq", "list", "--source", "redis://127.0.0.1:1", "--group", "g")
    assert code == 2
    assert_one_line_error(err, "LITE_PUSH_NOPE")


def test_a_missing_group_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ={}).consumer_config()
    assert info.value.field == "group"


# -- listeners ------------------------------------------------------------------


@pytest.fixture
def listener_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "listeners"
    d.mkdir()
    (d / "cli_listeners_ok.py").write_text(
        textwrap.dedent(
            """
            COUNT = 3

            def handle(msgs):
                return None

            async def ahandle(msgs):
                return None

            class Handler:
                def on_messages(self, msgs):
                    return None

            handler = Handler()
            """
        )
    )
    (d / "cli_listeners_broken.py").write_text("import no_such_dependency_xyz\n")
    (d / "cli_listeners_raises.py").write_text("raise RuntimeError('config missing')\n")
    monkeypatch.syspath_prepend(str(d))
    return d


def test_a_listener_is_imported(listener_dir: Path) -> None:
    import cli_listeners_ok  # type: ignore[import-not-found]

    assert cli.load_listener("cli_listeners_ok:handle") is cli_listeners_ok.handle
    assert cli.load_listener("cli_listeners_ok:ahandle") is cli_listeners_ok.ahandle
    assert cli.load_listener("cli_listeners_ok:handler.on_messages") == cli_listeners_ok.handler.on_messages


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("cli_listeners_ok", "expected module:function"),
        ("cli_listeners_ok:", "expected module:function"),
        (":handle", "expected module:function"),
        ("cli_no_such_module_xyz:handle", "no module named 'cli_no_such_module_xyz'"),
        ("cli_listeners_ok:nope", "has no attribute 'nope'"),
        (
            "cli_listeners_ok:handler.nope",
            "'cli_listeners_ok:handler' has no attribute 'nope'",
        ),
        ("cli_listeners_ok:COUNT", "is not callable"),
        ("cli_listeners_broken:handle", "no_such_dependency_xyz"),
        ("cli_listeners_raises:handle", "RuntimeError: config missing"),
    ],
)
def test_listener_import_errors(
    capsys: pytest.CaptureFixture[str], listener_dir: Path, spec: str, fragment: str
) -> None:
    with pytest.raises(cli.CliError) as info:
        cli.load_listener(spec)
    assert fragment in str(info.value) and info.value.code == 2
    code, out, err = run_cli(capsys, "consume", *NOWHERE_CONSUME, "--listener", spec)
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


def test_an_async_listener_told_to_use_threads_is_a_config_error(
    capsys: pytest.CaptureFixture[str], listener_dir: Path, tmp_path: Path
) -> None:
    with EmbeddedBroker(tmp_path / "data") as broker:
        broker.create_topic("T", 2)
    argv = [
        "consume",
        "--source",
        f"embedded:{tmp_path / 'data'}",
        "--group",
        "g",
        "--topic",
        "T",
    ]
    code, _, err = run_cli(capsys, *argv, "--listener", "cli_listeners_ok:ahandle", "--executor", "thread")
    assert code == 2
    assert_one_line_error(err, "executor: 'thread' runs a plain listener, but ahandle is an `async def`")
    code, _, err = run_cli(capsys, *argv, "--listener", "cli_listeners_ok:handle", "--executor", "asyncio")
    assert code == 2
    assert_one_line_error(err, "executor: 'asyncio' runs an `async def` listener, but handle is a plain function")


# -- demo -----------------------------------------------------------------------


def test_demo_runs_and_prints_stats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys,
        "demo",
        "--messages",
        "2000",
        "--io-ms",
        "0",
        "--metrics-port",
        "0",
        "--lanes",
        "8",
        "--keys",
        "50",
    )
    assert code == 0, err
    assert "produced 2,000 messages over 8 queues and 50 keys" in out
    (url,) = re.findall(r"^metrics: (\S+)$", out, re.MULTILINE)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url) and not url.endswith(":0/metrics")
    assert re.search(r"\[final \] consumed 2,000/2,000 +[\d,]+ msg/s +lag 0 \(uncommitted 0\)", out)
    assert "ordering check: 0 per-key order inversions, 0 lost, 0 duplicates -> OK" in out


def test_demo_without_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "demo", "--messages", "100", "--io-ms", "0", "--no-metrics", "--lanes", "4")
    assert code == 0 and "metrics:" not in out and "-> OK" in out


def test_demo_exits_1_when_the_check_fails(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(broker: EmbeddedBroker, topic: str, label: str, *args: object, **kw: object) -> demo.RunResult:
        return demo.RunResult(label, 10, 0.1, inversions=1, lost=0, duplicates=0)

    monkeypatch.setattr(demo, "run_once", broken)
    code, out, _ = run_cli(capsys, "demo", "--messages", "10", "--io-ms", "0", "--no-metrics")
    assert code == 1 and "-> FAILED" in out


class _FakeConsumer:
    def __init__(self) -> None:
        self.consumed = 0

    def stats(self) -> ConsumerStats:
        q = MessageQueue("DEMO", "embedded", 0)
        return ConsumerStats(
            consumed=self.consumed,
            retried=0,
            in_flight={q: 7},
            in_flight_bytes={q: 70},
            paused=frozenset({q}),
            committed={q: 40},
            lane_depths=(0,),
        )


def test_live_stats_print_once_per_interval(capsys: pytest.CaptureFixture[str]) -> None:
    now = [100.0]
    live = demo.LiveStats(interval=1.0, clock=lambda: now[0])
    fake = _FakeConsumer()
    consumer = fake  # the callback only reads stats()
    live(consumer, 1000)  # type: ignore[arg-type]
    assert capsys.readouterr().out == ""
    now[0], fake.consumed = 101.0, 250
    live(consumer, 1000)  # type: ignore[arg-type]
    now[0] = 101.5
    live(consumer, 1000)  # type: ignore[arg-type]  # not a second yet
    now[0], fake.consumed = 102.0, 400
    live(consumer, 1000)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.search(
        r"consumed +250/1,000 +250 msg/s +lag +750 \(uncommitted 960\) +in flight +7 +paused queues 1",
        lines[0],
    )
    assert re.search(r"\[ +2\.0s\] consumed +400/1,000 +150 msg/s +lag +600", lines[1])


# -- consume (subprocess) ---------------------------------------------------------

LISTENER_MODULE = """
import os

OUT = os.environ["CLI_TEST_OUT"]


def _record(msgs):
    with open(OUT, "a") as f:
        f.write("".join(f"{m.keys} {m.queue_id} {m.queue_offset} {m.body.decode()}\\n" for m in msgs))


def handle(msgs):
    _record(msgs)


async def ahandle(msgs):
    _record(msgs)


def handle_gc(msgs):
    # handle, and how many objects the cyclic GC leaves alone (gc.freeze),
    # and its first generation's threshold
    import gc

    with open(OUT + ".frozen", "w") as f:
        f.write(f"{gc.get_freeze_count()} {gc.get_threshold()[0]}")
    _record(msgs)
"""


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


class Service:
    """``python -m lite_push consume ...`` as a subprocess, with a listener
    module in ``tmp_path`` that appends what it consumed to a file."""

    def __init__(self, tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> None:
        (tmp_path / "cli_test_listener.py").write_text(LISTENER_MODULE)
        self.consumed = tmp_path / "consumed.txt"
        self.stdout = tmp_path / "stdout.txt"
        self.stderr = tmp_path / "stderr.txt"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k in NON_CONFIG_ENV}
        full_env.update(env or {})
        full_env["CLI_TEST_OUT"] = str(self.consumed)
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), full_env.get("PYTHONPATH")]))
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lite_push", "consume", *argv],
                stdout=out,
                stderr=err,
                env=full_env,
                cwd=tmp_path,
            )

    def wait_consumed(self, n: int, timeout: float = 90.0) -> list[str]:
        ok = wait_until(
            lambda: self.proc.poll() is not None or len(_lines(self.consumed)) >= n,
            timeout,
            0.02,
        )
        assert ok and self.proc.poll() is None, self.output()
        return _lines(self.consumed)

    def stop(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return f"stdout:\n{self.stdout.read_text()}\nstderr:\n{self.stderr.read_text()}"


def _produce(broker: RedisBroker | EmbeddedBroker, topic: str, n: int, keys: int) -> dict[str, list[int]]:
    """Send n messages over ``keys`` keys; return each key's bodies in send order."""
    sent: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        key = f"k{i % keys}"
        broker.send(topic, str(i).encode(), keys=key)
        sent[key].append(i)
    return sent


def _check_consumed(lines: list[str], sent: dict[str, list[int]]) -> None:
    """Every message once, each key's messages in send (= offset) order."""
    got: dict[str, list[int]] = defaultdict(list)
    offsets: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        key, _qid, off, body = line.split()
        got[key].append(int(body))
        offsets[key].append(int(off))
    assert dict(got) == dict(sent)
    for key, offs in offsets.items():
        assert offs == sorted(offs), key


@pytest.mark.parametrize("executor", ["thread", "asyncio"])
def test_consume_on_redis_drains_and_commits_on_sigterm(redis_url: str, tmp_path: Path, executor: str) -> None:
    n, group = 600, "svc"
    broker = RedisBroker(redis_url.split("?")[0], namespace=_namespace(redis_url))
    try:
        broker.create_topic("ORDERS", 4)
        sent = _produce(broker, "ORDERS", n, keys=37)
        if executor == "thread":
            # settings from a file and the environment; the flags add the rest
            config = _toml(
                tmp_path,
                f"""
                [consumer]
                group = "{group}"
                lanes = 7
                commit_interval = 60.0

                [listener]
                path = "cli_test_listener:handle"

                [subscription]
                topic = "ORDERS"
                from = "first"
                """,
            )
            service = Service(
                tmp_path,
                ["--config", str(config), "--metrics-port", "0"],
                env={"LITE_PUSH_SOURCE": redis_url, "LITE_PUSH_MODE": "KEY_ORDERLY"},
            )
        else:
            service = Service(
                tmp_path,
                [
                    "--source",
                    redis_url,
                    "--group",
                    group,
                    "--topic",
                    "ORDERS",
                    "--from",
                    "first",
                ]
                + [
                    "--listener",
                    "cli_test_listener:ahandle",
                    "--lanes",
                    "32",
                    "--no-metrics",
                ],
            )
        try:
            lines = service.wait_consumed(n)
            code = service.stop()
        finally:
            service.kill()
        assert code == 0, service.output()
        _check_consumed(_lines(service.consumed), sent)
        assert len(lines) >= n
        out = service.stdout.read_text()
        assert f"executor {executor}" in out and f"stopped: consumed {n}; offsets committed for 4 queues" in out
        if executor == "thread":
            assert "7 lanes" in out and re.search(r"^metrics: http://127\.0\.0\.1:\d+/metrics$", out, re.MULTILINE)
        else:
            assert "metrics:" not in out
        reader = broker.pull_consumer(group)
        try:
            for q in broker.queues("ORDERS"):
                committed = reader.committed(q)
                assert committed is not None and committed.offset == broker.max_offset(q), q
        finally:
            reader.close()
    finally:
        broker.close()


def test_consume_on_a_durable_embedded_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 3)
        sent = _produce(broker, "T", 300, keys=11)
    service = Service(
        tmp_path,
        [
            "--source",
            f"embedded:{data}",
            "--group",
            "emb",
            "--topic",
            "T",
            "--from",
            "first",
        ]
        + ["--listener", "cli_test_listener:handle_gc", "--lanes", "5"],
    )
    try:
        service.wait_consumed(300)
        code = service.stop()
    finally:
        service.kill()
    assert code == 0, service.output()
    _check_consumed(_lines(service.consumed), sent)
    # What existed before the consumer started (modules, the listener, the
    # consumer) was frozen: thousands of objects no full collection walks;
    # young collections wait for the command's threshold.
    frozen, gen0 = map(int, (tmp_path / "consumed.txt.frozen").read_text().split())
    assert frozen > 10_000
    assert gen0 == GEN0_THRESHOLD
    with EmbeddedBroker(data) as broker:
        for q in broker.queues("T"):
            committed = broker.committed("emb", q)
            assert committed is not None and committed.offset == broker.max_offset(q)


@pytest.mark.parametrize(("before", "after"), [(PYTHON_GEN0_THRESHOLD, GEN0_THRESHOLD), (5_000, 5_000)])
def test_prepare_gc_raises_the_default_young_threshold_and_keeps_one_set(before: int, after: int) -> None:
    import gc

    saved = gc.get_threshold()
    gc.set_threshold(before, saved[1], saved[2])
    try:
        prepare_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (after, saved[1], saved[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_consume_of_an_unknown_topic_exits_1(
    capsys: pytest.CaptureFixture[str], redis_url: str, listener_dir: Path
) -> None:
    argv = ["consume", "--source", redis_url, "--group", "g", "--topic", "NOPE"]
    code, _, err = run_cli(capsys, *argv, "--listener", "cli_listeners_ok:handle", "--log-level", "ERROR")
    assert code == 1
    assert_one_line_error(
        err, f"topic 'NOPE' does not exist on {redis_url.split('?')[0]} in namespace '{_namespace(redis_url)}'"
    )


# -- dlq ------------------------------------------------------------------------


@pytest.fixture
def dead_letters(redis_url: str) -> Iterator[tuple[RedisBroker, list[MessageExt]]]:
    """Five messages of topic T that group g dead-lettered: its listener
    always fails, and max_reconsume_times is 1."""
    broker = RedisBroker(redis_url.split("?")[0], namespace=_namespace(redis_url))
    broker.create_topic("T", 2)
    for i in range(5):
        broker.send(
            "T",
            f"order-{i}".encode(),
            keys=f"acct-{i}",
            tags="Orders",
            properties={"user": f"u{i}"},
        )
    originals = [m for q in broker.queues("T") for m in broker.messages(q)]

    def fail(msgs: list[MessageExt]) -> None:
        raise ValueError(f"boom {msgs[0].keys}")

    config = ConsumerConfig(group="g", max_reconsume_times=1, suspend_ms=1, lanes=4)
    consumer = LitePushConsumer(config, source=broker.pull_consumer("g", consume_from=FIRST), listener=fail)
    consumer.subscribe("T")
    with consumer:
        assert wait_until(lambda: consumer.stats().dead_lettered >= 5, 60.0)
    try:
        yield broker, originals
    finally:
        broker.close()


def test_dlq_list(
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    dead_letters: tuple[RedisBroker, list[MessageExt]],
) -> None:
    broker, originals = dead_letters
    by_id = {m.msg_id: m for m in originals}
    code, out, err = run_cli(capsys, "dlq", "list", "--source", redis_url, "--group", "g")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 5
    seen = set()
    for i, line in enumerate(lines):
        m = re.fullmatch(
            r"offset=(\d+) origin=T/(\d)/(\d+) msg_id=(\S+) reconsume_times=(\d+) reason=(.+) exception=(.*)",
            line,
        )
        assert m, line
        assert int(m[1]) == i
        orig = by_id[m[4]]
        assert (orig.queue_id, orig.queue_offset) == (int(m[2]), int(m[3]))
        assert int(m[5]) == 1 and f"boom {orig.keys}" in m[7]
        seen.add(m[4])
    assert seen == set(by_id)

    code, out, _ = run_cli(capsys, "dlq", "list", "--source", redis_url, "--group", "g", "--json", "--start", "1")
    assert code == 0
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert [d["dlq_offset"] for d in docs] == [1, 2, 3, 4]
    for d in docs:
        orig = by_id[d["origin_msg_id"]]
        assert d["dlq_topic"] == "%DLQ%g" and d["group"] == "g" and d["origin_topic"] == "T"
        assert (d["origin_queue_id"], d["origin_offset"]) == (
            orig.queue_id,
            orig.queue_offset,
        )
        assert d["body"] == orig.body.decode() and d["body_encoding"] == "utf-8"
        assert (d["keys"], d["tags"], d["properties"]) == (
            orig.keys,
            "Orders",
            orig.properties,
        )
        assert d["reconsume_times"] == 1 and "boom" in d["exception"] and d["reason"]

    code, out, _ = run_cli(capsys, "dlq", "list", "--source", redis_url, "--group", "g", "--start", "3", "--limit", "1")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["offset=3"]
    # listing reads only: the group has no offset on its DLQ topic
    (dlq_queue,) = broker.queues("%DLQ%g")
    assert broker.committed("g", dlq_queue) is None
    # a group the source has no record of is an error naming it (and creates no topic)
    code, out, err = run_cli(capsys, "dlq", "list", "--source", redis_url, "--group", "other")
    assert (code, out) == (2, "")
    assert_one_line_error(err, "group: 'other' is unknown on redis://")
    assert "%DLQ%other" not in broker.topics()


def test_dlq_resend(
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    dead_letters: tuple[RedisBroker, list[MessageExt]],
) -> None:
    broker, originals = dead_letters
    queues = broker.queues("T")
    ends = {q: broker.max_offset(q) for q in queues}
    (dlq_queue,) = broker.queues("%DLQ%g")
    dl1 = broker.messages(dlq_queue, 1, 2)[0]

    code, out, err = run_cli(capsys, "dlq", "resend", "--source", redis_url, "--group", "g", "--offset", "1")
    assert code == 0, err
    (line,) = out.splitlines()
    m = re.fullmatch(r"resent offset=1 origin=T/\d/\d+ -> T/(\d)/(\d+) msg_id=\S+", line)
    assert m, line
    q = queues[int(m[1])]
    assert int(m[2]) == ends[q] and broker.max_offset(q) == ends[q] + 1
    (again,) = broker.messages(q, ends[q], ends[q] + 1)
    assert (again.body, again.keys, again.tags) == (dl1.body, dl1.keys, dl1.tags)
    assert again.properties == {"user": dl1.properties["user"]} and again.reconsume_times == 0
    assert sum(broker.max_offset(q) for q in queues) == sum(ends.values()) + 1

    # an offset with no dead letter: one-line error, nothing sent
    code, out, err = run_cli(capsys, "dlq", "resend", "--source", redis_url, "--group", "g", "--offset", "0", "9")
    assert code == 2 and out == ""
    assert_one_line_error(err, "no dead letter at offset 9 of %DLQ%g")
    assert sum(broker.max_offset(q) for q in queues) == sum(ends.values()) + 1

    code, out, err = run_cli(
        capsys, "dlq", "resend", "--source", redis_url, "--group", "g", "--all", "--progress", "on"
    )
    assert code == 0 and len(out.splitlines()) == 4  # offset 1 was resent already
    assert "resending: 100%" in err and "4/4" in err  # the progress bar, on stderr
    assert "1 dead letter(s) of %DLQ%g resent already, skipped (--force resends them)" in err
    assert sum(broker.max_offset(q) for q in queues) == sum(ends.values()) + 5
    bodies = sorted(m.body for q in queues for m in broker.messages(q, ends[q]))
    assert bodies == sorted(m.body for m in originals)


def test_dlq_on_an_embedded_broker(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 1)
        broker.send("T", b"\xff\x00", keys="k")
        c = broker.pull_consumer("g", consume_from=FIRST)
        c.subscribe("T")
        batches = [b for b in c.poll(5.0) if b.messages]
        (msg,) = batches[0].messages
        assert c.send_to_dlq([(msg, "NonRetryableError", "bad bytes")]) == [None]
        c.close()
    code, out, err = run_cli(capsys, "dlq", "list", "--source", f"embedded:{data}", "--group", "g", "--json")
    assert code == 0, err
    (doc,) = [orjson.loads(line) for line in out.splitlines()]
    assert (doc["body"], doc["body_encoding"], doc["reason"]) == (
        "/wA=",
        "base64",
        "NonRetryableError",
    )
    code, out, _ = run_cli(capsys, "dlq", "resend", "--source", f"embedded:{data}", "--group", "g", "--all")
    assert code == 0 and "-> T/0/1 " in out
    with EmbeddedBroker(data) as broker:
        assert [m.body for m in broker.messages(broker.queues("T")[0])] == [
            b"\xff\x00",
            b"\xff\x00",
        ]


def test_an_unreachable_redis_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, err = run_cli(capsys, "dlq", "list", "--source", url, "--group", "g")
    assert code == 1 and out == ""
    assert_one_line_error(err, "ConnectionError")

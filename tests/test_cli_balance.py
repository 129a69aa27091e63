"""``lite-push consume --balance {queue,message}``: the setting from a flag,
``LITE_PUSH_BALANCE`` or ``[source] balance``, its errors, and the value
reaching the source (the Redis source's ``pull_consumer``, and the embedded
and Kafka sources, which refuse ``message``)."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from lite_push import Balance, ConfigError, cli
from lite_push.cli.parser import build_parser
from lite_push.cli.plan import banner, opened, plan_of
from lite_push.cli.settings import load_settings
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lite-push: error: "), err
    return lines[0]


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lite-push.toml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def listener_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A plain listener ``module:function`` importable by the command."""
    name = f"balance_listener_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def handle(msgs):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:handle"


# -- the setting ----------------------------------------------------------------------


def test_balance_defaults_to_queue() -> None:
    s = load_settings({}, environ={})
    assert s.balance is Balance.QUEUE and "balance" not in s.service


@pytest.mark.parametrize("given", ["message", "MESSAGE", "Message"])
def test_balance_from_the_flag_env_or_file_in_any_case(tmp_path: Path, given: str) -> None:
    by_flag = load_settings({"balance": given}, environ={})
    assert by_flag.balance is Balance.MESSAGE and by_flag.origins["balance"] == "--balance"
    by_env = load_settings(environ={"LITE_PUSH_BALANCE": given})
    assert by_env.balance is Balance.MESSAGE and by_env.origins["balance"] == "LITE_PUSH_BALANCE"
    path = _toml(tmp_path, f'[source]\nurl = "redis://h:6379/0"\nbalance = "{given}"\n')
    by_file = load_settings(config_file=path, environ={})
    assert by_file.balance is Balance.MESSAGE and by_file.origins["balance"].endswith("[source] balance")


def test_the_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[source]\nbalance = "message"\n')
    assert load_settings({"balance": "queue"}, config_file=path, environ={"LITE_PUSH_BALANCE": "message"}).balance is (
        Balance.QUEUE
    )
    assert load_settings({}, config_file=path, environ={"LITE_PUSH_BALANCE": "queue"}).balance is Balance.QUEUE
    assert load_settings({}, config_file=path, environ={}).balance is Balance.MESSAGE


def test_the_parser_takes_balance_in_any_case() -> None:
    parser = build_parser()
    assert parser.parse_args(["consume", "--balance", "MESSAGE"]).balance == "message"
    assert parser.parse_args(["consume", "--balance", "queue"]).balance == "queue"
    assert parser.parse_args(["consume"]).balance is None


@pytest.mark.parametrize(
    ("flags", "env", "toml", "origin"),
    [
        ({"balance": "sideways"}, {}, None, ""),  # its own flag: the setting's name says it
        ({}, {"LITE_PUSH_BALANCE": "sideways"}, None, "LITE_PUSH_BALANCE"),
        ({}, {}, '[source]\nbalance = "sideways"\n', "[source] balance"),
        ({}, {}, "[source]\nbalance = 2\n", "[source] balance"),
    ],
)
def test_a_bad_balance_names_the_setting_and_where_it_came_from(
    tmp_path: Path, flags: dict[str, str], env: dict[str, str], toml: str | None, origin: str
) -> None:
    path = None if toml is None else _toml(tmp_path, toml)
    with pytest.raises(ConfigError) as info:
        load_settings(flags, config_file=path, environ=env)
    assert info.value.field == "balance"
    text = str(info.value)
    assert text.startswith("balance: ") and origin in text and "must be one of QUEUE, MESSAGE" in text


def test_a_bad_balance_on_the_command_line_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(capsys, "consume", "--balance", "sideways")
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "--balance" in line and "invalid choice" in line
    monkeypatch.setenv("LITE_PUSH_BALANCE", "sideways")
    code, out, err = run_cli(capsys, "consume", "--source", "embedded:/no/such/dir", "--group", "g")
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "balance: LITE_PUSH_BALANCE: must be one of QUEUE, MESSAGE" in line


def test_the_help_lists_balance(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "consume", "--help")
    assert code == 0
    assert "--balance {queue,message}" in out and "LITE_PUSH_BALANCE" in out and "balance =" in out


# -- the value reaches the source -------------------------------------------------------


def _consume_args(*argv: str) -> Any:
    return build_parser().parse_args(["consume", *argv])


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every ``RedisBroker.pull_consumer`` call
    (then the real method runs with them)."""
    calls: list[dict[str, Any]] = []
    real = RedisBroker.pull_consumer

    def pull_consumer(self: RedisBroker, group: str, **kw: Any) -> Any:
        calls.append(dict(kw))
        consumer = real(self, group, **kw)
        assert consumer.balance is kw.get("balance", Balance.QUEUE)
        return consumer

    monkeypatch.setattr(RedisBroker, "pull_consumer", pull_consumer)
    return calls


@pytest.mark.parametrize(("given", "passed"), [(None, {}), ("queue", {}), ("message", {"balance": Balance.MESSAGE})])
def test_the_redis_source_is_asked_for_the_balance(
    redis_server: RedisServer,
    recorded: list[dict[str, Any]],
    listener_spec: str,
    given: str | None,
    passed: dict[str, Balance],
) -> None:
    url = f"{redis_server.url}?namespace=cli-balance-{uuid.uuid4().hex[:12]}"
    argv = ["--source", url, "--group", "g", "--topic", "T", "--listener", listener_spec]
    plan, listener, _ = plan_of(_consume_args(*argv, *(["--balance", given] if given else [])))
    assert plan.balance is (Balance.MESSAGE if given == "message" else Balance.QUEUE)
    assert ("balance message" in banner(plan)) is (given == "message")
    with opened(plan, listener, subscribe=False) as built:
        built.consumer.shutdown(0.0)
    (call,) = recorded
    assert {k: v for k, v in call.items() if k == "balance"} == passed


def test_the_embedded_source_refuses_message_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, listener_spec: str
) -> None:
    store = tmp_path / "broker"
    store.mkdir()
    argv = ["--source", f"embedded:{store}", "--group", "g", "--topic", "T", "--listener", listener_spec]
    code, out, err = run_cli(capsys, "consume", *argv, "--balance", "message")
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "balance: Balance.MESSAGE is refused: the embedded broker runs in one process" in line


def test_the_kafka_source_refuses_message_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, listener_spec: str
) -> None:
    pytest.importorskip("confluent_kafka")
    monkeypatch.setenv("LITE_PUSH_BALANCE", "message")
    argv = ["--source", "kafka://127.0.0.1:1", "--group", "g", "--topic", "T", "--listener", listener_spec]
    code, out, err = run_cli(capsys, "consume", *argv)
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "balance: Balance.MESSAGE is refused: Kafka's share groups (KIP-932) give up key order" in line

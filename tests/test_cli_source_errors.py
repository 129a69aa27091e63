"""What ``lite-push`` says, as a subprocess, when its ``--source`` is not
what the user thinks (issue 41):

* a topic under the wrong ``?namespace=`` of a Redis URL: the one line
  names the server and the namespace, and the topics that namespace has
  (exit 1, as every unknown topic);
* an ``embedded:`` directory that does not exist: ``topic create`` makes
  it (parents too); every other command says it does not exist, one line,
  exit 2, and makes nothing;
* a Redis server that does not answer: one line naming it, exit 1, no
  traceback (the broker raises ``SourceUnavailableError`` when it is made).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from test_cli_topic import REPO, lite_push, ok, one_line_error

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer, free_port

LISTENER = "def handle(msgs):\n    pass\n"


@pytest.fixture
def listener_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess that can import ``srcerr_listener:handle``."""
    (tmp_path / "srcerr_listener.py").write_text(LISTENER)
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}


@pytest.fixture
def namespaces(redis_server: RedisServer) -> tuple[str, str]:
    """Two namespaces of the test's own: the first has topic ``orders``,
    the second ``payments`` and ``refunds`` (and a group's dead-letter
    topic, which is not listed)."""
    ns = f"right-{uuid.uuid4().hex[:8]}", f"wrong-{uuid.uuid4().hex[:8]}"
    with RedisBroker(redis_server.url, namespace=ns[0]) as b:
        b.create_topic("orders", 2)
    with RedisBroker(redis_server.url, namespace=ns[1]) as b:
        b.create_topic("refunds", 1)
        b.create_topic("payments", 1)
        b.create_topic("%DLQ%g", 1)
    return ns


# -- a topic under the wrong namespace --------------------------------------------------------


def test_consume_under_the_wrong_namespace_names_the_server_and_the_namespace(
    redis_server: RedisServer, namespaces: tuple[str, str], listener_env: dict[str, str]
) -> None:
    right, wrong = namespaces
    url = f"redis://127.0.0.1:{redis_server.port}"
    r = lite_push(
        "consume",
        "--source",
        f"{url}?namespace={wrong}",
        "--topic",
        "orders",
        "--group",
        "g",
        "--listener",
        "srcerr_listener:handle",
        "--log-level",
        "ERROR",
        env=listener_env,
    )
    one_line_error(r, 1, f"topic 'orders' does not exist on {url} in namespace '{wrong}'")
    # in its own namespace the topic is there
    assert ok(lite_push("topic", "describe", "--source", f"{url}?namespace={right}", "--topic", "orders"))[-1] == (
        "topic=orders queues=2 messages=0"
    )


@pytest.mark.parametrize(
    ("argv", "stdin", "hint"),
    [
        (["topic", "describe"], b"", ""),
        (["group", "describe", "--group", "g"], b"", ""),
        (["group", "reset-offsets", "--group", "g", "--to", "first"], b"", ""),
        (["produce"], b"x\n", "; create it first: lite-push topic create --topic orders --queues N"),
    ],
)
def test_the_other_commands_name_the_namespace_and_its_topics(
    redis_server: RedisServer, namespaces: tuple[str, str], argv: list[str], stdin: bytes, hint: str
) -> None:
    _, wrong = namespaces
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    r = lite_push(*argv, "--source", f"{url}?namespace={wrong}", "--topic", "orders", stdin=stdin)
    line = one_line_error(r, 1)
    assert line == (
        f"lite-push: error: topic 'orders' does not exist on {url} in namespace '{wrong}' "
        f"(topics there: payments, refunds{hint})"
    )


def test_an_empty_namespace_and_the_default_one_are_named(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    empty = f"none-{uuid.uuid4().hex[:8]}"
    r = lite_push("topic", "describe", "--source", f"{url}?namespace={empty}", "--topic", "orders")
    one_line_error(r, 1, f"topic 'orders' does not exist on {url} in namespace '{empty}' (no topics there)")
    r = lite_push("topic", "list", "--source", f"{url}?namespace={empty}")
    assert r.returncode == 0 and r.stdout == b""
    assert r.stderr.decode().strip() == (
        f"no topics on {url} in namespace '{empty}' (create one: lite-push topic create)"
    )
    r = lite_push(
        "topic",
        "describe",
        "--source",
        f"redis://:sec%40ret@127.0.0.1:{redis_server.port}/0?namespace=lite_push&socket_timeout=5",
        "--topic",
        "orders",
    )
    # the server has no password: the URL's is refused, and never shown
    line = one_line_error(r, 1, f"source redis://:***@127.0.0.1:{redis_server.port}/0?namespace=lite_push")
    assert "sec" not in line
    r = lite_push("topic", "describe", "--source", f"{url}?socket_timeout=5", "--topic", "orders")
    line = one_line_error(r, 1)
    assert line.startswith(
        f"lite-push: error: topic 'orders' does not exist on {url}?socket_timeout=5 in namespace 'lite_push' ("
    ), line


def test_an_unknown_topic_on_an_embedded_directory_names_it(tmp_path: Path, listener_env: dict[str, str]) -> None:
    data = tmp_path / "data"
    assert ok(lite_push("topic", "create", "--source", f"embedded:{data}", "--topic", "payments", "--queues", "1"))
    r = lite_push(
        "consume",
        "--source",
        f"embedded:{data}",
        "--topic",
        "orders",
        "--group",
        "g",
        "--listener",
        "srcerr_listener:handle",
        "--log-level",
        "ERROR",
        env=listener_env,
    )
    one_line_error(r, 1, f"topic 'orders' does not exist on embedded:{data}")


# -- an embedded: directory that does not exist ---------------------------------------------------


def test_topic_create_makes_the_directory_and_its_parents(tmp_path: Path) -> None:
    data = tmp_path / "a" / "b" / "data"
    assert ok(lite_push("topic", "create", "--source", f"embedded:{data}", "--topic", "T", "--queues", "2")) == [
        "created topic T with 2 queues"
    ]
    assert data.is_dir()
    assert ok(lite_push("topic", "list", "--source", f"embedded:{data}")) == ["topic=T queues=2 messages=0"]


@pytest.mark.parametrize(
    ("argv", "stdin"),
    [
        (["topic", "list"], b""),
        (["topic", "describe", "--topic", "T"], b""),
        (["produce", "--topic", "T"], b"x\n"),
        (["consume", "--topic", "T", "--group", "g", "--listener", "srcerr_listener:handle"], b""),
        (["group", "describe", "--group", "g"], b""),
        (["group", "reset-offsets", "--group", "g", "--topic", "T", "--to", "first"], b""),
        (["dlq", "list", "--group", "g"], b""),
        (["dlq", "resend", "--group", "g", "--all"], b""),
    ],
)
def test_the_other_commands_say_the_directory_does_not_exist(
    tmp_path: Path, listener_env: dict[str, str], argv: list[str], stdin: bytes
) -> None:
    data = tmp_path / "missing" / "data"
    r = lite_push(*argv, "--source", f"embedded:{data}", stdin=stdin, env=listener_env)
    line = one_line_error(r, 2)
    assert line == (
        f"lite-push: error: source 'embedded:{data}': the directory {data} does not exist "
        "(lite-push topic create makes it)"
    )
    assert not (tmp_path / "missing").exists()  # nothing was made


def test_a_file_or_a_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (["topic", "list"], ["topic", "create", "--topic", "T", "--queues", "1"]):
        one_line_error(lite_push(*argv, "--source", f"embedded:{afile}"), 2, f"{afile} is not a directory")
    under = afile / "data"  # its parent is a file
    r = lite_push("topic", "create", "--source", f"embedded:{under}", "--topic", "T", "--queues", "1")
    one_line_error(r, 1, f"source 'embedded:{under}': cannot create the directory {under}: Not a directory")


# -- a Redis server that does not answer -------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["topic", "list"],
        ["topic", "create", "--topic", "T", "--queues", "1"],
        ["consume", "--topic", "T", "--group", "g", "--listener", "srcerr_listener:handle"],
        ["dlq", "list", "--group", "g"],
    ],
)
def test_a_redis_server_that_does_not_answer_is_one_line(listener_env: dict[str, str], argv: list[str]) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?namespace=x"
    line = one_line_error(lite_push(*argv, "--source", url, env=listener_env), 1)
    assert line == (
        f"lite-push: error: source {url}: ConnectionError: Error 111 connecting to 127.0.0.1:{port}. "
        "Connection refused."
    )

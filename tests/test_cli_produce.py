"""``lite-push produce`` as a subprocess (``python -m lite_push``): standard
input, one message per line, on the embedded (durable), Redis and Kafka
(mock cluster) sources -- bodies, keys and tags stored as given, each key's
messages in input order; the newcomer's path (create a topic, feed it from
the shell, consume it); a pipe that stays open (each line sent as it comes,
Ctrl-C says how many were sent); and bad input, one line each."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from test_cli import Service, _check_consumed, _lines
from test_cli_topic import SOURCES, Source, cli_env, lite_push, ok, one_line_error, open_source

from lite_push import MessageExt
from lite_push.sources.redis_server import RedisServer


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    with open_source(request.param, tmp_path, server) as s:
        yield s


def stored(source: Source, topic: str) -> list[MessageExt]:
    """Every message of ``topic``, queue by queue, in offset order."""
    with source.broker() as b:
        return [m for q in b.queues(topic) for m in b.messages(q)]


def test_keys_bodies_and_tags_are_stored_in_input_order_per_key(source: Source) -> None:
    n = 2600  # several batches
    lines = [f"k{i % 13}:{i}".encode() for i in range(n)]
    lines += [b"k1:a:b\r", b":keyless", b"k2:"]  # split at the first ':'; \r\n ends a line; an empty key or body
    source.create("T", 4)
    # the last line has no newline
    r = lite_push(
        "produce",
        "--source",
        source.url,
        "--topic",
        "T",
        "--key-separator",
        ":",
        "--tags",
        "Orders",
        stdin=b"\n".join(lines),
    )
    assert ok(r) == [f"sent {n + 3} messages to T"]
    messages = stored(source, "T")
    assert len(messages) == n + 3
    assert {m.tags for m in messages} == {"Orders"}
    bodies: dict[str | None, list[bytes]] = defaultdict(list)
    queue_of: dict[str | None, set[int]] = defaultdict(set)
    for m in messages:
        bodies[m.keys].append(m.body)
        queue_of[m.keys].add(m.queue_id)
    for k in range(13):
        key = f"k{k}"
        sent = [str(i).encode() for i in range(k, n, 13)] + {"k1": [b"a:b"], "k2": [b""]}.get(key, [])
        assert bodies[key] == sent, key  # each key's messages in input order, on one queue
        assert len(queue_of[key]) == 1
    assert bodies[None] == [b"keyless"]
    assert len({q for k, qs in queue_of.items() if k for q in qs}) > 1  # the keys spread over the queues


def test_each_line_is_one_body(tmp_path: Path) -> None:
    """Without a separator the line is the body, bytes as they are (an empty
    line is an empty body, a \\r before \\n is dropped); a topic of one queue
    keeps them in input order."""
    with open_source("embedded", tmp_path, None) as source:
        source.create("T", 1)
        lines = b"plain\n\n\xff\x00 binary\r\nkey:not split\nlast"
        assert ok(lite_push("produce", "--source", source.url, "--topic", "T", stdin=lines)) == ["sent 5 messages to T"]
        assert ok(lite_push("produce", "--source", source.url, "--topic", "T")) == ["sent 0 messages to T"]
        messages = stored(source, "T")
    assert [m.body for m in messages] == [b"plain", b"", b"\xff\x00 binary", b"key:not split", b"last"]
    assert {m.keys for m in messages} == {None} and {m.tags for m in messages} == {None}


def test_the_newcomers_path_create_feed_consume(tmp_path: Path) -> None:
    """A topic made, fed from the shell and consumed, without the Python API."""
    with open_source("embedded", tmp_path, None) as source:
        assert ok(lite_push("topic", "create", "--source", source.url, "--topic", "ORDERS", "--queues", "3")) == [
            "created topic ORDERS with 3 queues"
        ]
        sent: dict[str, list[int]] = defaultdict(list)
        for i in range(500):
            sent[f"acct-{i % 17}"].append(i)
        feed = "".join(f"acct-{i % 17} {i}\n" for i in range(500)).encode()
        r = lite_push("produce", "--source", source.url, "--topic", "ORDERS", "--key-separator", " ", stdin=feed)
        assert ok(r) == ["sent 500 messages to ORDERS"]
        assert ok(lite_push("topic", "describe", "--source", source.url, "--topic", "ORDERS"))[-1] == (
            "topic=ORDERS queues=3 messages=500"
        )
        service = Service(
            tmp_path,
            [
                "--source",
                source.url,
                "--group",
                "g",
                "--topic",
                "ORDERS",
                "--from",
                "first",
                "--listener",
                "cli_test_listener:handle",
                "--no-metrics",
            ],
            env={"PYTHONPATH": cli_env()["PYTHONPATH"]},
        )
        try:
            service.wait_consumed(500)
            code = service.stop()
        finally:
            service.kill()
        assert code == 0, service.output()
        _check_consumed(_lines(service.consumed), dict(sent))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_open_pipe_is_sent_line_by_line_and_a_signal_says_what_was_sent(
    redis_server: RedisServer, tmp_path: Path, signum: int
) -> None:
    with open_source("redis", tmp_path, redis_server) as source:
        source.create("T", 2)
        proc = subprocess.Popen(
            [sys.executable, "-m", "lite_push", "produce", "--source", source.url, "--topic", "T"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"one\ntwo\nthree\n")
            proc.stdin.flush()  # the pipe stays open: the lines go out as no more is waiting
            assert wait_until(lambda: len(stored(source, "T")) == 3, 30.0, 0.05)
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        name = signal.Signals(signum).name
        r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        one_line_error(r, 128 + signum, f"stopped by {name}: sent 3 messages to T (input lines 1 to 3)")
        assert sorted(m.body for m in stored(source, "T")) == [b"one", b"three", b"two"]


def test_a_progress_bar_on_stderr_when_asked(tmp_path: Path) -> None:
    with open_source("embedded", tmp_path, None) as source:
        source.create("T", 2)
        feed = b"x\n" * 3000
        r = lite_push("produce", "--source", source.url, "--topic", "T", "--progress", "on", stdin=feed)
        assert r.returncode == 0 and r.stdout == b"sent 3000 messages to T\n"
        assert "sending to T: " in r.stderr.decode() and "3000msg" in r.stderr.decode()
        r = lite_push("produce", "--source", source.url, "--topic", "T", stdin=feed)  # auto: not a terminal
        assert ok(r) == ["sent 3000 messages to T"]


@pytest.mark.parametrize(
    ("argv", "stdin", "code", "fragment", "kept"),
    [
        (["--key-separator", ""], b"", 2, "key-separator: must not be empty", 0),
        (["--tags", "A || B"], b"", 2, "tags: one tag without whitespace, '|' or '*'", 0),
        (["--tags", ""], b"", 2, "tags: one tag", 0),
        (
            ["--key-separator", ":"],
            b"k:1\nk:2\nno separator\nk:4\n",
            2,
            "line 3: no key separator ':' in it; sent 2 messages to T (input lines 1 to 2)",
            2,
        ),
        (["--key-separator", ":"], b"\xff\xfe:body\n", 2, "line 1: its key is not UTF-8; sent 0 messages to T", 0),
        (
            [],
            b"small\n" + b"x" * (4 * 1024 * 1024 + 1) + b"\n",
            2,
            "line 2: its body has 4194305 bytes, more than the source's limit of 4194304; sent 1 message to T "
            "(input line 1)",
            1,
        ),
        (
            [],
            b"small\n" + b"x" * (4 * 1024 * 1024 + 70000),
            2,
            "line 2: it has more than 4259840 bytes and no end; sent 1 message to T (input line 1)",
            1,
        ),
        (
            ["--topic", "NOPE"],
            b"x\n",
            1,
            "topic 'NOPE' does not exist on {place} (topics there: T; create it first: lite-push topic create "
            "--topic NOPE --queues N)",
            0,
        ),
        (["--topic", "%DLQ%g"], b"x\n", 2, "topic: %DLQ%g is a group's retry or dead-letter topic", 0),
        (["--topic", "a/b"], b"x\n", 2, "topic 'a/b' must not contain", 0),
        (["--topic", ""], b"x\n", 2, "--topic is required", 0),
        (["--source", ""], b"x\n", 2, "--source is required", 0),
        (["--progress", "sometimes"], b"x\n", 2, "argument --progress: invalid choice", 0),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, argv: list[str], stdin: bytes, code: int, fragment: str, kept: int
) -> None:
    """Each is one line naming what is wrong; the lines before a bad line are
    sent (``kept``), nothing from it on."""
    with open_source("embedded", tmp_path, None) as source:
        source.create("T", 2)
        given = dict(zip(argv[::2], argv[1::2], strict=True))
        full = (
            ["produce", *argv]
            + ["--source", source.url] * ("--source" not in given)
            + ["--topic", "T"] * ("--topic" not in given)
        )
        fragment = fragment.replace("{url}", source.url).replace("{place}", source.place)
        one_line_error(lite_push(*full, stdin=stdin), code, fragment)
        assert len(stored(source, "T")) == kept


def test_an_unreachable_redis_is_one_line_and_exit_1() -> None:
    from lite_push.sources.redis_server import free_port

    r = lite_push("produce", "--source", f"redis://127.0.0.1:{free_port()}/0", "--topic", "T", stdin=b"x\n")
    one_line_error(r, 1, "ConnectionError")

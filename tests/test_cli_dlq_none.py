"""``lite-push dlq list`` says when there is nothing to list.

A group without dead letters (or, with ``--held``, without held keys)
gets one line on stderr saying so, exit status 0, and an empty standard
output (so ``--json`` output stays a clean stream of documents).  The
group is one the source knows (it committed offsets): a group it has no
record of is an error (``test_cli_dlq_groups.py``).  Run as a subprocess,
on the durable embedded broker and on Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lite_push import ConsumeFromWhere, EmbeddedBroker
from lite_push.sources import PullSource
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent


def _dlq_list(*argv: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "lite_push", "dlq", "list", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    return done.returncode, done.stdout, done.stderr


def _one_line(err: str, text: str) -> None:
    lines = err.splitlines()
    assert lines == [f"lite-push dlq list: {text}"], err


def _commit_once(member: PullSource) -> None:
    """Make the member's group known to the source: it polls topic T and
    commits what it read."""
    member.subscribe("T")
    polled = [m for b in member.poll(5.0) for m in b.messages]
    assert polled
    member.commit({q: 1 for q in member.assignment()})
    member.close()


@pytest.fixture
def embedded(tmp_path: Path) -> Path:
    """A durable embedded broker's directory: topic T; group g committed
    on it, and has no dead letters yet."""
    data = tmp_path / "data"
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 1)
        broker.send("T", b"x", keys="k")
        _commit_once(broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET))
    return data


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ([], "no dead letters in %DLQ%g"),
        (["--json"], "no dead letters in %DLQ%g"),
        (["--start", "5"], "no dead letters in %DLQ%g from offset 5"),
        (["--held"], "no keys held behind dead letters in %DLQ%g"),
        (["--held", "--json"], "no keys held behind dead letters in %DLQ%g"),
    ],
)
def test_an_embedded_group_without_dead_letters_says_so(embedded: Path, extra: list[str], text: str) -> None:
    code, out, err = _dlq_list("--source", f"embedded:{embedded}", "--group", "g", *extra)
    assert (code, out) == (0, "")
    _one_line(err, text)


def test_a_window_past_the_dead_letters_says_so_and_a_listing_says_nothing_more(embedded: Path) -> None:
    with EmbeddedBroker(embedded) as broker:
        c = broker.pull_consumer("g")
        (msg,) = broker.messages(broker.queues("T")[0])  # what the group read (and committed)
        assert c.send_to_dlq([(msg, "NonRetryableError", "bad")]) == [None]
        c.close()
    source = ["--source", f"embedded:{embedded}", "--group", "g"]
    code, out, err = _dlq_list(*source)
    assert code == 0 and out.startswith("offset=0 ") and err == ""
    code, out, err = _dlq_list(*source, "--start", "1", "--limit", "3")
    assert (code, out) == (0, "")
    _one_line(err, "no dead letters in %DLQ%g at offsets 1 to 3")
    code, out, err = _dlq_list(*source, "--start", "1", "--limit", "1")
    _one_line(err, "no dead letters in %DLQ%g at offset 1")
    code, out, err = _dlq_list(*source, "--limit", "0")
    _one_line(err, "no dead letters in %DLQ%g (--limit 0)")
    code, out, err = _dlq_list(*source, "--held")  # a dead letter, but no key held behind it
    assert (code, out) == (0, "")
    _one_line(err, "no keys held behind dead letters in %DLQ%g")


def test_a_redis_group_without_dead_letters_says_so(redis_server: RedisServer) -> None:
    ns = f"dlq-none-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(redis_server.url, namespace=ns)
    try:
        broker.create_topic("T", 1)
        broker.send("T", b"x", keys="k")
        _commit_once(broker.pull_consumer("sms", consume_from=ConsumeFromWhere.FIRST_OFFSET))
        url = f"{redis_server.url}?namespace={ns}"
        code, out, err = _dlq_list("--source", url, "--group", "sms", "--json")
        assert (code, out) == (0, "")
        _one_line(err, "no dead letters in %DLQ%sms")
        code, out, err = _dlq_list("--source", url, "--group", "sms", "--held")
        assert (code, out) == (0, "")
        _one_line(err, "no keys held behind dead letters in %DLQ%sms")
        assert "%DLQ%sms" not in broker.topics()  # listing created nothing
    finally:
        broker.close()

"""``lite-push dlq resend`` sends a dead letter back once, unless told
``--force``.

The dead-letter topic is append-only: ``resend`` writes a resend record
into it after the letters it sent back (``lite_push.dlq.record_resent``),
and the next ``resend --all`` skips them, ``--offset`` refuses them,
``dlq list`` shows where each copy went (``resent_to``).  Run as
subprocesses on each source (the records are the sources' plain messages),
and through a pipe closed under a running ``--all``: what was sent by then
is recorded, and the next ``--all`` sends exactly the rest.  The fold of
the records, :class:`~lite_push.dlq._resent_log.ResentLog`, is checked alone.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from lite_push import EmbeddedBroker, MessageExt, MessageQueue
from lite_push.cli.dlq import RECORD_EVERY
from lite_push.cli.pipes import SIGPIPE_EXIT
from lite_push.dlq import record_resent, resent_letters
from lite_push.dlq._resent_log import RECORD_LETTERS, RELEASED, ResentLog
from lite_push.sources import dlq_topic
from lite_push.sources.contract import HELD_KEY, RELEASED_KEY, RELEASED_THROUGH, RESENT_LETTERS
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _lite_push(*argv: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "lite_push", *argv], capture_output=True, text=True, timeout=120, env=_env()
    )
    return done.returncode, done.stdout, done.stderr


def _dead_letter(broker: Any, n: int) -> None:
    """Topic T of one queue with ``n`` messages, each dead-lettered by
    group g (``send_to_dlq``, as a consumer does)."""
    broker.send_batch("T", [{"body": f"m{i}".encode(), "keys": f"k{i}"} for i in range(n)])
    (queue,) = broker.queues("T")
    member = broker.pull_consumer("g")
    try:
        msgs = broker.messages(queue)
        assert len(msgs) == n
        assert member.send_to_dlq([(m, "NonRetryableError", "bad") for m in msgs]) == [None] * n
    finally:
        member.close()


class Source:
    """A source whose group g dead-lettered ``n`` messages of topic T:
    its URL, and :meth:`copies`, the bodies of what was sent to T again."""

    def __init__(self, url: str, open_broker: Any, n: int) -> None:
        self.url = url
        self.n = n
        self._open = open_broker

    def copies(self) -> list[bytes]:
        with self._open() as broker:
            (queue,) = broker.queues("T")
            return [m.body for m in broker.messages(queue, self.n)]

    def cli(self, *argv: str) -> tuple[int, str, str]:
        return _lite_push(*argv, "--source", self.url, "--group", "g")


class _Kept:
    """A broker left open across ``with`` blocks (Redis, Kafka)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def __enter__(self) -> Any:
        return self.broker

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture(params=["embedded", "redis", "kafka"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    n = 5
    if request.param == "embedded":
        data = tmp_path / "data"
        with EmbeddedBroker(data) as broker:
            broker.create_topic("T", 1)
            _dead_letter(broker, n)
        yield Source(f"embedded:{data}", lambda: EmbeddedBroker(data), n)
    elif request.param == "redis":
        ns = f"dlq-resent-{uuid.uuid4().hex[:8]}"
        with RedisServer(appendonly=False) as server:
            rb = RedisBroker(server.url, namespace=ns)
            try:
                rb.create_topic("T", 1)
                _dead_letter(rb, n)
                yield Source(f"{server.url}?namespace={ns}", lambda: _Kept(rb), n)
            finally:
                rb.close()
    else:
        with MockKafkaCluster() as cluster:
            kb = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
            try:
                kb.create_topic("T", 1)
                kb.ensure_topic(dlq_topic("g"), 1)
                _dead_letter(kb, n)
                yield Source(f"kafka://{cluster.bootstrap}", lambda: _Kept(kb), n)
            finally:
                kb.close()


def test_resend_all_twice_resends_once_and_force_resends_again(source: Source) -> None:
    code, out, err = source.cli("dlq", "resend", "--all")
    assert (code, err) == (0, "") and len(out.splitlines()) == source.n
    sent = {int(line.split()[1].removeprefix("offset=")): line.split(" -> ")[1].split()[0] for line in out.splitlines()}
    assert sorted(source.copies()) == sorted(f"m{i}".encode() for i in range(source.n))

    code, out, err = source.cli("dlq", "resend", "--all")  # the double resend of issue 41
    assert (code, out) == (0, "")
    assert err == "lite-push dlq resend: 5 dead letter(s) of %DLQ%g resent already, skipped (--force resends them)\n"
    assert len(source.copies()) == source.n

    code, out, _ = source.cli("dlq", "list")  # each letter says where its copy went
    assert [line.rsplit(" resent_to=", 1)[1] for line in out.splitlines()] == [sent[o] for o in sorted(sent)]
    code, out, _ = source.cli("dlq", "list", "--json", "--start", "2", "--limit", "1")
    (doc,) = [orjson.loads(line) for line in out.splitlines()]
    assert (doc["dlq_offset"], doc["resent_to"]) == (2, sent[2])

    code, out, err = source.cli("dlq", "resend", "--offset", "3", "1")  # refused, nothing sent
    assert (code, out) == (2, "")
    refused = f"offset: resent already: 3 (to {sent[3]}), 1 (to {sent[1]}); --force resends again"
    assert err == f"lite-push: error: {refused}\n"
    assert len(source.copies()) == source.n

    code, out, err = source.cli("dlq", "resend", "--offset", "3", "--force")
    assert code == 0 and out.startswith("resent offset=3 ") and err == ""
    again = out.split(" -> ")[1].split()[0]
    code, out, err = source.cli("dlq", "resend", "--all", "--force")
    assert code == 0 and len(out.splitlines()) == source.n and err == ""
    assert len(source.copies()) == 2 * source.n + 1  # n, then 1, then n more
    code, out, _ = source.cli("dlq", "list", "--start", "3", "--limit", "1")
    assert out.rstrip().rsplit(" resent_to=", 1)[1] != again  # the last copy's place wins


def test_a_resend_cut_short_by_a_closed_pipe_records_what_it_sent(tmp_path: Path) -> None:
    """``dlq resend --all | head -1``: the command stops at the closed pipe
    (exit 141) having sent some letters, recorded; the next ``--all``
    sends the others, and every letter went back exactly once."""
    n = 3000  # far more lines than a pipe holds: the pipe closes mid-run
    data = tmp_path / "data"
    with EmbeddedBroker(data) as broker:
        broker.create_topic("T", 1)
        _dead_letter(broker, n)
    source = Source(f"embedded:{data}", lambda: EmbeddedBroker(data), n)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lite_push", "dlq", "resend", "--all", "--source", source.url, "--group", "g"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert first.startswith(b"resent offset=0 ") and (code, err) == (SIGPIPE_EXIT, b"")
    cut = len(source.copies())
    assert 0 < cut < n
    code, out, err = source.cli("dlq", "resend", "--all")
    assert code == 0 and len(out.splitlines()) == n - cut
    skipped = f"{cut} dead letter(s) of %DLQ%g resent already, skipped (--force resends them)"
    assert err == f"lite-push dlq resend: {skipped}\n"
    assert sorted(source.copies()) == sorted(f"m{i}".encode() for i in range(n))  # each once
    assert RECORD_EVERY < n


# -- the records alone ---------------------------------------------------------------


def _record(offset: int, **props: str) -> MessageExt:
    return MessageExt(dlq_topic("g"), 0, offset, b"", properties=props)


def test_the_resent_log_folds_resend_and_release_records(caplog: pytest.LogCaptureFixture) -> None:
    log = ResentLog()
    log.feed(
        [
            _record(0, **{HELD_KEY: "K"}),
            _record(1, **{HELD_KEY: "K"}),
            _record(2),
            _record(3, **{RESENT_LETTERS: json.dumps([[2, "T/0/9"]])}),
            _record(4, **{RELEASED_KEY: "K", RELEASED_THROUGH: "0"}),  # K's letters up to offset 0
            _record(5, **{RESENT_LETTERS: "[[2, 3]]"}),  # malformed: marks nothing
            _record(6, **{RESENT_LETTERS: json.dumps([[2, "T/0/12"]])}),  # resent again (--force): the later place
        ]
    )
    assert log.resent == {0: RELEASED, 2: "T/0/12"}
    assert log.next_offset == 7
    assert "offset 5 marks nothing" in caplog.text
    log.feed([_record(7, **{RELEASED_KEY: "K", RELEASED_THROUGH: "1"})])
    assert log.resent == {0: RELEASED, 1: RELEASED, 2: "T/0/12"}


def test_record_resent_writes_one_record_per_record_letters_and_resent_letters_reads_them(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    from lite_push import SendResult

    caplog.set_level(logging.WARNING)
    assert resent_letters(broker, "g") == {}  # no dead-letter topic
    broker.create_topic(dlq_topic("g"), 1)  # as its first dead letter does
    results = [(i, SendResult(MessageQueue("T", "embedded", 1), 100 + i, f"id{i}")) for i in range(RECORD_LETTERS + 1)]
    record_resent(broker, "g", results)
    record_resent(broker, "g", [])
    (queue,) = broker.queues(dlq_topic("g"))
    assert [len(json.loads(m.properties[RESENT_LETTERS])) for m in broker.messages(queue)] == [RECORD_LETTERS, 1]
    assert resent_letters(broker, "g") == {i: f"T/1/{100 + i}" for i in range(RECORD_LETTERS + 1)}
    assert caplog.records == []

"""``lite-push dlq`` on a group the source has no record of.

A misspelt ``--group`` is not a group without dead letters: every ``dlq``
command on a group with no dead-letter or retry topic, no committed offsets
and no members prints one line naming it and exits 2, and creates nothing.
A group the source knows (it committed offsets) without dead letters is
still told "no dead letters" (exit 0).  Run as subprocesses on each source:
the durable embedded broker, a redis-server and librdkafka's mock cluster
(which describes no group: there the source asks for the group's committed
offsets partition by partition).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lite_push import ConsumeFromWhere, EmbeddedBroker
from lite_push.sources import PullSource, dlq_topic
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent

#: Each dlq command (``--source`` and ``--group`` added).
COMMANDS = [
    ["dlq", "list"],
    ["dlq", "list", "--json"],
    ["dlq", "list", "--held"],
    ["dlq", "resend", "--all"],
    ["dlq", "resend", "--offset", "0"],
    ["dlq", "resend", "--key", "K"],
]


def _lite_push(*argv: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "lite_push", *argv], capture_output=True, text=True, timeout=120, env=env
    )
    return done.returncode, done.stdout, done.stderr


def _commit_once(member: PullSource) -> None:
    """The member's group reads topic T and commits: the source knows it."""
    member.subscribe("T")
    polled: list[object] = []
    for _ in range(50):
        polled += [m for b in member.poll(0.5) for m in b.messages]
        if polled:
            break
    assert polled and member.assignment()
    member.commit({q: 1 for q in member.assignment()})
    member.close()


@pytest.fixture(params=["embedded", "redis", "kafka"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, object]]:
    """``(url, broker)``: topic T of one queue holding one message, which
    group ``known`` read and committed; no dead letters anywhere.  (The
    embedded broker is closed while the commands run: one process at a
    time opens its directory; it is reopened to check what they created.)"""
    if request.param == "embedded":
        data = tmp_path / "data"
        with EmbeddedBroker(data) as broker:
            broker.create_topic("T", 1)
            broker.send("T", b"x", keys="K")
            _commit_once(broker.pull_consumer("known", consume_from=ConsumeFromWhere.FIRST_OFFSET))
        yield f"embedded:{data}", data
    elif request.param == "redis":
        ns = f"dlq-groups-{uuid.uuid4().hex[:8]}"
        with RedisServer(appendonly=False) as server:
            rb = RedisBroker(server.url, namespace=ns)
            try:
                rb.create_topic("T", 1)
                rb.send("T", b"x", keys="K")
                _commit_once(rb.pull_consumer("known", consume_from=ConsumeFromWhere.FIRST_OFFSET))
                yield f"{server.url}?namespace={ns}", rb
            finally:
                rb.close()
    else:
        with MockKafkaCluster() as cluster:
            kb = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
            try:
                kb.create_topic("T", 1)
                kb.send("T", b"x", keys="K")
                _commit_once(kb.pull_consumer("known", consume_from=ConsumeFromWhere.FIRST_OFFSET))
                yield f"kafka://{cluster.bootstrap}", kb
            finally:
                kb.close()


def _topics(broker: object) -> list[str]:
    if isinstance(broker, Path):
        with EmbeddedBroker(broker) as b:
            return b.topics()
    return broker.topics()  # type: ignore[attr-defined, no-any-return]


def test_an_unknown_group_is_one_line_and_exit_2_on_every_dlq_command(source: tuple[str, object]) -> None:
    url, broker = source
    before = _topics(broker)
    for argv in COMMANDS:
        code, out, err = _lite_push(*argv, "--source", url, "--group", "nosuch")
        assert (code, out) == (2, ""), (argv, err)
        assert err.splitlines() == [
            f"lite-push: error: group: 'nosuch' is unknown on {url}: it has no dead-letter topic "
            f"({dlq_topic('nosuch')}), no committed offsets and no members"
        ], (argv, err)
    assert _topics(broker) == before  # nothing was created


def test_a_known_group_without_dead_letters_is_told_so(source: tuple[str, object]) -> None:
    url, _ = source
    code, out, err = _lite_push("dlq", "list", "--source", url, "--group", "known")
    assert (code, out, err) == (0, "", "lite-push dlq list: no dead letters in %DLQ%known\n")
    code, out, err = _lite_push("dlq", "resend", "--all", "--source", url, "--group", "known")
    assert (code, out, err) == (0, "", "lite-push dlq resend: no dead letters in %DLQ%known\n")
    code, out, err = _lite_push("dlq", "resend", "--offset", "0", "--source", url, "--group", "known")
    assert (code, out) == (2, "")
    assert err == "lite-push: error: offset: no dead letter at offset 0 of %DLQ%known\n"

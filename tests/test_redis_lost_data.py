"""A redis-server that comes back empty under running members (issue 41):
FLUSHALL, or a restart without its data (these servers keep none: no AOF,
no RDB).  Each member says so once, a WARNING from the Redis source naming
the server, the namespace, the topic and the group, instead of blaming its
session (or saying nothing), and goes on consuming what is sent after the
topic is made again.  A member that really lost its session still says
that, and nothing of lost data."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from helpers import wait_for

from lite_push import ConsumerConfig, LitePushConsumer, MessageExt
from lite_push.sources import Balance, ConsumeFromWhere, PullSource
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis.lost_data import went_back
from lite_push.sources.redis_server import RedisServer
from lite_push.testing import count_of, poll_messages, poll_until

FIRST = ConsumeFromWhere.FIRST_OFFSET
SAID = "lost lite_push's data"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A server of the test's own (tests empty it), keeping no data."""
    with RedisServer(appendonly=False) as s:
        yield s


def flush(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
    finally:
        client.close()


def restart_empty(server: RedisServer) -> None:
    server.restart()  # no AOF, no RDB: it comes back with nothing


EMPTYINGS: dict[str, Callable[[RedisServer], None]] = {"flushall": flush, "restart": restart_empty}


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The WARNINGs of the Redis source about lost data."""
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and SAID in r.getMessage()]


def blamed_sessions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "session expired" in r.getMessage() or "session lapsed" in r.getMessage()
    ]


def expected(server: RedisServer, namespace: str) -> str:
    return (
        f"redis-server redis://127.0.0.1:{server.port}/0 lost lite_push's data in namespace {namespace!r} (a "
        "FLUSHALL, or a restart without its saved data): topic 'orders' is gone and the committed offsets of "
        "group 'g' are gone; this member of group 'g' goes on, taking its queues again where consume_from says; "
        "create the topic again (lite-push topic create) for producers to find it"
    )


@pytest.mark.parametrize("emptying", sorted(EMPTYINGS))
@pytest.mark.parametrize("balance", [Balance.QUEUE, Balance.MESSAGE], ids=["by-queue", "by-message"])
def test_each_member_says_once_that_the_data_is_gone(
    server: RedisServer, caplog: pytest.LogCaptureFixture, emptying: str, balance: Balance
) -> None:
    ns = f"lost-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(server.url, namespace=ns, session_timeout=30.0)
    members: list[PullSource] = []
    try:
        broker.create_topic("orders", 4)
        broker.send_batch("orders", [(b"%d" % i, f"k{i}") for i in range(40)])
        members = [broker.pull_consumer("g", consume_from=FIRST, balance=balance) for _ in range(2)]
        for m in members:
            m.subscribe("orders")
        got = 0
        for _ in range(200):  # both members read, until everything came
            got += sum(count_of(m.poll(0.02)) for m in members)
            if got >= 40 and all(m.assignment() for m in members):
                break
        assert got == 40 and all(m.assignment() for m in members)
        caplog.set_level(logging.WARNING, logger="lite_push.sources.redis")
        EMPTYINGS[emptying](server)
        for _ in range(100):
            for m in members:
                m.poll(0.02)
            if len(said(caplog)) >= 2:
                break
        for _ in range(5):  # more polls say nothing more
            for m in members:
                m.poll(0.02)
        assert said(caplog) == [expected(server, ns)] * 2
        assert blamed_sessions(caplog) == []
        # the members go on: what is sent to the topic made again is read, from offset 0
        fresh = RedisBroker(server.url, namespace=ns)
        try:
            fresh.create_topic("orders", 4)
            fresh.send_batch("orders", [(b"new-%d" % i, f"k{i}") for i in range(8)])
        finally:
            fresh.close()
        again: list[MessageExt] = []
        for _ in range(200):
            again += [msg for m in members for b in m.poll(0.02) for msg in b.messages]
            if len(again) >= 8:
                break
        assert sorted(msg.body for msg in again) == sorted(b"new-%d" % i for i in range(8))
        assert len(said(caplog)) == 2
    finally:
        for m in members:
            m.close()
        broker.close()


def test_a_running_consumer_says_so_once_and_goes_on(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    ns = f"lost-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(server.url, namespace=ns)
    seen: list[bytes] = []
    consumer = LitePushConsumer(
        ConsumerConfig(group="g"),
        source=broker.pull_consumer("g", consume_from=FIRST),
        listener=lambda msgs: seen.extend(m.body for m in msgs),
    )
    try:
        broker.create_topic("orders", 2)
        broker.send_batch("orders", [(b"%d" % i, f"k{i}") for i in range(10)])
        consumer.subscribe("orders")
        consumer.start()
        wait_for(lambda: len(seen) == 10, 30, "the first 10 messages")
        caplog.set_level(logging.WARNING, logger="lite_push.sources.redis")
        restart_empty(server)
        wait_for(lambda: said(caplog), 30, "the warning")
        fresh = RedisBroker(server.url, namespace=ns)
        try:
            fresh.create_topic("orders", 2)
            fresh.send_batch("orders", [(b"new-%d" % i, f"k{i}") for i in range(6)])
        finally:
            fresh.close()
        wait_for(lambda: len(seen) == 16, 30, lambda: f"the 6 new messages (consumed {len(seen)})")
        assert said(caplog) == [expected(server, ns)]
        assert blamed_sessions(caplog) == []
    finally:
        consumer.shutdown(timeout=10)
        broker.close()


def test_a_member_that_lost_its_queues_alone_blames_its_session(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the owner keys gone (what an expired session leaves): the data
    is there, and the member says what it always said."""
    broker = RedisBroker(server.url, namespace="kept", heartbeat_interval=0.2, rebalance_interval=0.5)
    member = broker.pull_consumer("g", consume_from=FIRST)
    try:
        broker.create_topic("orders", 2)
        broker.send_batch("orders", [(b"x", f"k{i}") for i in range(4)])
        member.subscribe("orders")
        poll_messages(member, 4)
        caplog.set_level(logging.WARNING, logger="lite_push.sources.redis")
        owners = list(broker.client.scan_iter(match="kept:{g:g}:owner:*"))
        assert len(owners) == 2
        broker.client.delete(*owners)
        poll_until(member, lambda _: bool(blamed_sessions(caplog)), timeout=30)  # the next heartbeat sees it
        assert len(blamed_sessions(caplog)) == 1 and said(caplog) == []
    finally:
        member.close()
        broker.close()


def _sent(broker: RedisBroker, body: bytes) -> bool:
    """Send ``body`` unless the server is still loading its data."""
    try:
        broker.send("orders", body, keys="k0")
    except redis.BusyLoadingError:
        return False
    return True


def test_a_restart_that_keeps_the_data_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer(data_dir=tmp_path / "redis", appendonly=True) as durable:
        broker = RedisBroker(durable.url, namespace="kept")
        member = broker.pull_consumer("g", consume_from=FIRST)
        try:
            broker.create_topic("orders", 2)
            broker.send_batch("orders", [(b"%d" % i, f"k{i}") for i in range(4)])
            member.subscribe("orders")
            poll_messages(member, 4)
            caplog.set_level(logging.INFO, logger="lite_push.sources.redis")
            durable.restart()  # the AOF brings everything back
            wait_for(lambda: _sent(broker, b"more"), 30, "the server to load its AOF")
            got = poll_messages(member, 1, timeout=30)
            assert [m.body for b in got for m in b.messages] == [b"more"]
            assert any("lost lite_push's scripts" in r.getMessage() for r in caplog.records)  # it did restart
            assert said(caplog) == [] and blamed_sessions(caplog) == []
        finally:
            member.close()
            broker.close()


@pytest.mark.parametrize(
    ("seen", "now", "back"),
    [
        (None, None, False),
        (None, b"3", False),
        (b"3", None, True),
        (b"3", b"2", True),
        (b"3", b"3", False),
        (b"3", b"4", False),
        (b"3", b"x", False),
    ],
)
def test_a_version_went_back_when_it_vanished_or_fell(seen: bytes | None, now: bytes | None, back: bool) -> None:
    assert went_back(seen, now) is back

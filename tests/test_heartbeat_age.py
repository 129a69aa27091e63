"""A healthy Redis member's last heartbeat, as the group sees it, is never
older than its heartbeat interval (issue 41).

It was: a heartbeat was due once the whole interval had passed since the
last one came back, the member noticed at its next read, and the heartbeat
took a round trip, so just before each one the age was over the interval;
and ``group describe`` read the age from the session expiry assuming its
own broker's session timeout (30 s), so a member with another timeout
showed an age that was off by the difference.

* The schedule, on a clock the test moves (the broker's ``clock``): a
  heartbeat is due at three quarters of the interval after the last one
  was sent, by queue and by message.
* On a running member (real time, each executor), the group's record of
  its last heartbeat, read again and again from outside the group, and
  ``lite-push group describe`` run as a subprocess, stay under the interval.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from lite_push import Balance, ConsumerConfig, LitePushConsumer, ManualClock, MessageExt
from lite_push.cli.settings import NON_CONFIG_ENV
from lite_push.sources import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
SESSION = 6.0
INTERVAL = 2.0


class MovedMonotonic:
    """The broker's clock: ``monotonic()`` moves only when told (the
    heartbeat schedule), ``time()`` is the real one."""

    def __init__(self) -> None:
        self.manual = ManualClock()

    def monotonic(self) -> float:
        return self.manual.monotonic()

    def time(self) -> float:
        return time.time()


@pytest.mark.parametrize("balance", [Balance.QUEUE, Balance.MESSAGE])
def test_a_heartbeat_is_due_at_three_quarters_of_the_interval(redis_server: RedisServer, balance: Balance) -> None:
    clock = MovedMonotonic()
    broker = RedisBroker(
        redis_server.url,
        namespace=f"hb-{uuid.uuid4().hex[:10]}",
        session_timeout=30.0,
        heartbeat_interval=10.0,
        clock=clock,
    )
    broker.create_topic("T", 2)
    sent_at: list[float] = []
    heartbeat = broker.conn.heartbeat

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent_at.append(clock.monotonic())
        return heartbeat(*args, **kwargs)

    broker.conn.heartbeat = counted  # type: ignore[method-assign]
    c = broker.pull_consumer("g", balance=balance)
    try:
        c.subscribe("T")
        c.poll(0)  # joined
        start = clock.monotonic()
        for _ in range(60):  # 30 s, a read every 0.5 s
            clock.manual.advance(0.5)
            c.poll(0)
    finally:
        c.close()
        broker.close()
    beats = [t - start for t in sent_at if t > start]
    assert beats == [7.5, 15.0, 22.5, 30.0], sent_at  # each three quarters of the interval after the last


@pytest.fixture(params=["thread", "asyncio"])
def member(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[RedisBroker, str]]:
    """A running member of group ``g`` (session 6 s, heartbeat interval 2 s),
    on the executor of the parameter; yields its broker and the source URL
    of its namespace."""
    namespace = f"hb-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(redis_server.url, namespace=namespace, session_timeout=SESSION, heartbeat_interval=INTERVAL)
    broker.create_topic("T", 2)
    broker.send_batch("T", [(b"x", f"k{i}") for i in range(20)])

    def listener(msgs: list[MessageExt]) -> None:
        pass

    async def alistener(msgs: list[MessageExt]) -> None:
        pass

    consumer = LitePushConsumer(
        ConsumerConfig(group="g", executor=request.param, poll_timeout=0.05, revoke_timeout=2.0),
        source=broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET),
        listener=alistener if request.param == "asyncio" else listener,
    )
    consumer.subscribe("T")
    with consumer:
        yield broker, f"{redis_server.url}?namespace={namespace}"
    broker.close()


def test_a_polling_members_last_heartbeat_stays_under_its_interval(
    member: tuple[RedisBroker, str], redis_server: RedisServer
) -> None:
    """Read from outside the group (a broker of the default 30 s session
    timeout, as ``group describe`` is) until three more heartbeats landed."""
    _, source = member
    outside = RedisBroker(redis_server.url, namespace=source.split("namespace=")[1])
    try:
        admin = outside.group_admin("g")
        ages: list[float] = []
        beats = 0
        deadline = time.monotonic() + 60.0
        while beats < 3:
            assert time.monotonic() < deadline, f"fewer than 3 heartbeats seen: {ages[-20:]}"
            (m,) = admin.members()
            assert m.last_heartbeat is not None
            if ages and m.last_heartbeat < ages[-1]:
                beats += 1  # a new heartbeat landed since the previous read
            ages.append(m.last_heartbeat)
            time.sleep(0.005)
    finally:
        outside.close()
    assert max(ages) < INTERVAL, sorted(ages)[-5:]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_") or k in NON_CONFIG_ENV}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_group_describe_shows_a_live_members_age_under_its_interval(member: tuple[RedisBroker, str]) -> None:
    """``lite-push group describe`` (a subprocess, whose broker takes the
    session timeout to be 30 s) on a member whose session is 6 s."""
    _, source = member
    for _ in range(3):
        p = subprocess.run(
            [sys.executable, "-m", "lite_push", "group", "describe", "--source", source, "--group", "g", "--json"],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=90,
        )
        assert p.returncode == 0, p.stderr
        (m,) = orjson.loads(p.stdout)["members"]
        assert 0 <= m["last_heartbeat"] < INTERVAL, m

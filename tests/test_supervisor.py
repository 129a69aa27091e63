"""ProcessSupervisor (issue 19, item 1): member processes of one group on a
shared Redis source, restarted with back-off when they die, stopped by
SIGTERM with everything drained and committed, their metrics and health on
one scrape target.

The back-off rules are tested on their own with a ManualClock (no
sleeping); the processes run against a redis-server this module starts on a
loopback port and stops by its PID.  The member factories are in
``supervisor_members`` (spawned members import them by name).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import supervisor_members as members
from helpers import http_get as _get
from helpers import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from member_runs import KillRun, check_kill_run, read_log

from lite_push import ConfigError, ManualClock, ProcessSupervisor
from lite_push.metrics._members import merge_member_pages
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer, free_port
from lite_push.supervisor._restart_policy import RestartPolicy, RestartTracker

# -- the back-off rules (no processes) ------------------------------------------------


def test_the_back_off_doubles_per_death_in_a_row_up_to_its_cap() -> None:
    clock = ManualClock()
    tracker = RestartTracker(RestartPolicy(backoff=1.0, backoff_max=30.0, stable_after=60.0, max_start_failures=99))
    delays = []
    for _ in range(8):
        tracker.started(clock.monotonic())
        tracker.ready()
        clock.advance(5.0)  # shorter than stable_after: the series goes on
        delay = tracker.died(clock.monotonic())
        assert delay is not None
        delays.append(delay)
        clock.advance(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_run_of_stable_after_seconds_starts_a_new_series() -> None:
    clock = ManualClock()
    tracker = RestartTracker(RestartPolicy(backoff=0.5, backoff_max=8.0, stable_after=60.0, max_start_failures=3))
    for expected in (0.5, 1.0, 2.0):
        tracker.started(clock.monotonic())
        tracker.ready()
        clock.advance(59.9)
        assert tracker.died(clock.monotonic()) == expected
    tracker.started(clock.monotonic())
    clock.advance(60.0)  # it ran stable_after seconds (and never became ready: a start failure still)
    assert tracker.died(clock.monotonic()) == 0.5
    assert tracker.deaths_in_a_row == 1


def test_a_member_that_never_becomes_ready_is_a_crash_loop() -> None:
    clock = ManualClock()
    tracker = RestartTracker(RestartPolicy(backoff=0.1, backoff_max=1.0, stable_after=60.0, max_start_failures=3))
    for _ in range(2):
        tracker.started(clock.monotonic())
        assert tracker.died(clock.monotonic()) is not None
    # one ready run in between resets the count of start failures
    tracker.started(clock.monotonic())
    tracker.ready()
    assert tracker.died(clock.monotonic()) is not None
    for _ in range(2):
        tracker.started(clock.monotonic())
        assert tracker.died(clock.monotonic()) is not None
    tracker.started(clock.monotonic())
    assert tracker.died(clock.monotonic()) is None  # the third in a row: give up
    assert tracker.start_failures == 3


@settings(max_examples=300, deadline=None)
@given(
    backoff=st.floats(0.0, 10.0),
    extra=st.floats(0.0, 100.0),
    stable_after=st.floats(0.0, 100.0),
    max_failures=st.integers(1, 6),
    runs=st.lists(st.tuples(st.floats(0.0, 200.0), st.booleans()), min_size=1, max_size=30),
)
def test_the_back_off_follows_its_rules(
    backoff: float, extra: float, stable_after: float, max_failures: int, runs: list[tuple[float, bool]]
) -> None:
    """Against a model: the delay after the n-th death since the last stable
    run is min(max, backoff * 2**(n-1)); it gives up exactly when the last
    max_failures runs all ended before becoming ready."""
    policy = RestartPolicy(backoff, backoff + extra, stable_after, max_failures)
    tracker = RestartTracker(policy)
    clock = ManualClock()
    series = 0
    unready = 0
    for duration, ready in runs:
        started = clock.monotonic()
        tracker.started(started)
        if ready:
            tracker.ready()
        clock.advance(duration)
        delay = tracker.died(clock.monotonic())
        series = 1 if clock.monotonic() - started >= stable_after else series + 1
        unready = 0 if ready else unready + 1
        if unready >= max_failures:
            assert delay is None
            return
        assert delay is not None
        assert delay == min(backoff + extra, backoff * 2.0 ** (series - 1))
        assert backoff <= delay <= backoff + extra
        clock.advance(delay)


# -- arguments ---------------------------------------------------------------------------


def _factory(index: int) -> None:  # picklable; never called
    raise AssertionError("not run")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"processes": 0}, "processes"),
        ({"processes": -1}, "processes"),
        ({"processes": True}, "processes"),
        ({"processes": "2"}, "processes"),
        ({"shutdown_timeout": -1.0}, "shutdown_timeout"),
        ({"shutdown_timeout": float("inf")}, "shutdown_timeout"),
        ({"restart_backoff": -0.1}, "restart_backoff"),
        ({"restart_backoff": 5.0, "restart_backoff_max": 1.0}, "restart_backoff_max"),
        ({"stable_after": float("nan")}, "stable_after"),
        ({"max_start_failures": 0}, "max_start_failures"),
        ({"max_start_failures": 2.0}, "max_start_failures"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"metrics_port": -1}, "metrics_port"),
        ({"metrics_addr": ""}, "metrics_addr"),
        ({"factory": lambda index: None}, "factory"),
        ({"factory": "module:function"}, "factory"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"factory": _factory, "processes": 2, **kwargs}
    with pytest.raises(ConfigError) as info:
        ProcessSupervisor(**args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_members_pages_are_merged_with_a_member_label() -> None:
    page = (
        '# HELP x_total things\n# TYPE x_total counter\nx_total{group="g"} 3.0\n'
        "# HELP y_seconds a histogram\n# TYPE y_seconds histogram\n"
        'y_seconds_bucket{le="1.0"} 1.0\ny_seconds_bucket{le="+Inf"} 2.0\ny_seconds_count 2.0\ny_seconds_sum 3.5\n'
    )
    fams = {f.name: f for f in merge_member_pages([(0, page), (1, page.replace("3.0", "4.0")), (2, "x_total{")])}
    assert set(fams) == {"x", "y_seconds"}  # one family per name; member 2's page did not parse
    assert fams["x"].type == "counter"
    assert [(s.labels, s.value) for s in fams["x"].samples] == [
        ({"group": "g", "member": "0"}, 3.0),
        ({"group": "g", "member": "1"}, 4.0),
    ]
    assert {s.labels["member"] for s in fams["y_seconds"].samples} == {"0", "1"}
    assert len(fams["y_seconds"].samples) == 8


# -- member processes on Redis ------------------------------------------------------------------


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    return redis_server


@pytest.fixture
def topic(server: RedisServer) -> Iterator[tuple[str, RedisBroker]]:
    """A namespace of the test's own with topic ``T`` (8 queues)."""
    ns = f"sup-{uuid.uuid4().hex[:12]}"
    broker = RedisBroker(server.url, namespace=ns)
    broker.create_topic("T", queue_count=8)
    yield ns, broker
    broker.close()


def _send(broker: RedisBroker, total: int, keys: int) -> set[tuple[int, int]]:
    results = broker.send_batch("T", [(str(i).encode(), f"k{i % keys}") for i in range(total)])
    return {(r.queue.queue_id, r.offset) for r in results}


def _samples(page: str, name: str) -> dict[str, float]:
    """``{member: value}`` of the samples of ``name`` on a scraped page
    (the success outcome only, for the processed counter)."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith(name + "{") and ('outcome="success"' in line or "outcome" not in line):
            member = re.search(r'member="(\d+)"', line)
            assert member, line
            out[member[1]] = float(line.rsplit(" ", 1)[1])
    return out


def _assert_all_committed(broker: RedisBroker) -> None:
    for q in broker.queues("T"):
        committed = broker.committed("g", q)
        assert committed is not None and committed.offset == broker.max_offset(q), q


def _supervisor(server: RedisServer, ns: str, log: Path, processes: int = 2, **kwargs: object) -> ProcessSupervisor:
    member_kw = kwargs.pop("member_kw", {})
    factory = functools.partial(members.redis_member, server.url, ns, str(log), **member_kw)  # type: ignore[arg-type]
    kwargs.setdefault("shutdown_timeout", 10.0)
    return ProcessSupervisor(factory, processes, **kwargs)  # type: ignore[arg-type]


def test_two_members_consume_everything_in_key_order_and_serve_one_scrape_target(
    server: RedisServer, topic: tuple[str, RedisBroker], tmp_path: Path
) -> None:
    ns, broker = topic
    total = 4000
    log = tmp_path / "deliveries.log"
    supervisor = _supervisor(server, ns, log, metrics_port=0)
    supervisor.start()
    try:
        assert supervisor.metrics_url is not None
        base = supervisor.metrics_url.removesuffix("/metrics")
        # ready: both members joined and each owns queues
        assert wait_until(lambda: _get(base + "/readyz") == (200, "ok\n"), timeout=30)
        assert _get(base + "/healthz") == (200, "ok\n")
        stored = _send(broker, total, keys=250)
        assert wait_until(lambda: len(read_log(log)) >= total, timeout=60)
        states = supervisor.members
        assert [s.index for s in states] == [0, 1] and all(s.alive and s.ready for s in states)
        assert {r[0] for r in read_log(log)} == {s.pid for s in states}  # both took part
        # one scrape: both members' counters, labelled, summing to what was consumed
        status, page = _get(supervisor.metrics_url)
        assert status == 200
        consumed = _samples(page, "lite_push_messages_processed_total")
        assert set(consumed) == {"0", "1"} and sum(consumed.values()) == len(read_log(log))
        assert _samples(page, "lite_push_supervisor_member_up") == {"0": 1.0, "1": 1.0}
        assert _samples(page, "lite_push_supervisor_member_restarts_total") == {"0": 0.0, "1": 0.0}
        assert "lite_push_supervisor_members 2.0" in page
        assert _get(base + "/nope")[0] == 404
    finally:
        supervisor.stop()
        code = supervisor.wait(60)
    assert code == 0
    rows = read_log(log)
    assert {(q, o) for _, q, o, *_ in rows} == stored  # nothing lost
    assert len(rows) == total  # a clean rebalance: nothing twice
    assert supervisor.consumed == total  # the members' final counts
    by_key: dict[str, list[tuple[int, int, int, int]]] = {}
    for _pid, q, o, k, s, e in rows:
        by_key.setdefault(k, []).append((q, o, s, e))
    for k, items in by_key.items():  # each key in offset order, never two at once
        items.sort()
        for (_, _, _, e1), (_, _, s2, _) in itertools.pairwise(items):
            assert e1 <= s2, k
    _assert_all_committed(broker)
    assert all(not s.alive and s.pid is None for s in supervisor.members)
    with pytest.raises(urllib.error.URLError):  # the endpoint is gone
        urllib.request.urlopen(supervisor.metrics_url, timeout=5)


def test_a_killed_member_is_restarted_and_nothing_is_lost(
    server: RedisServer, topic: tuple[str, RedisBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lite_push.supervisor")
    ns, broker = topic
    total = 6000
    log = tmp_path / "deliveries.log"
    supervisor = _supervisor(
        server, ns, log, metrics_port=0, restart_backoff=0.2, restart_backoff_max=0.2, member_kw={"sleep": 0.003}
    )
    supervisor.start()
    try:
        assert supervisor.metrics_url is not None
        ready = supervisor.metrics_url.replace("/metrics", "/readyz")
        assert wait_until(lambda: _get(ready) == (200, "ok\n"), timeout=30)  # both own queues
        stored = _send(broker, total, keys=300)
        assert wait_until(lambda: len({r[0] for r in read_log(log)}) == 2, timeout=60)
        assert wait_until(lambda: supervisor.members[1].consumed > 0, timeout=60)  # it reported a count
        assert len(read_log(log)) < total // 2  # mid-run
        victim = supervisor.members[1]
        assert victim.pid is not None and victim.consumed_exact
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.time_ns()
        assert wait_until(lambda: supervisor.members[1].restarts == 1 and supervisor.members[1].ready, timeout=30)
        again = supervisor.members[1]
        assert again.alive and again.pid not in (None, victim.pid)
        assert again.last_exit == "killed by SIGKILL"
        assert wait_until(lambda: {(q, o) for _, q, o, *_ in read_log(log)} == stored, timeout=60)
    finally:
        supervisor.stop()
        code = supervisor.wait(60)
    assert code == 0
    assert [s.restarts for s in supervisor.members] == [0, 1]
    # the final count keeps what the killed process had reported, and says it may be short
    rows = read_log(log)
    by_survivors = sum(1 for r in rows if r[0] != victim.pid)  # processes that drained: exact counts
    assert by_survivors + victim.consumed <= supervisor.consumed <= len(rows)
    assert supervisor.members[1].consumed >= victim.consumed and not supervisor.members[1].consumed_exact
    assert supervisor.consumed_short == (1,) and supervisor.members[0].consumed_exact
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"member 1 (pid {victim.pid}) ended while not asked to stop: killed by SIGKILL" in m for m in said), said
    # no loss, each key's first deliveries in order and never two at once,
    # duplicates only of the queues the killed member held
    check_kill_run(KillRun(read_log(log), victim.pid, killed_at, {}), stored)
    _assert_all_committed(broker)


def test_health_names_a_killed_member_until_its_restart_is_ready(
    server: RedisServer, topic: tuple[str, RedisBroker], tmp_path: Path
) -> None:
    """The restart waits on a ManualClock: /healthz and /readyz say 503,
    naming the member, until the test moves the clock past the back-off."""
    ns, broker = topic
    _send(broker, 200, keys=20)
    clock = ManualClock()
    supervisor = _supervisor(
        server,
        ns,
        tmp_path / "deliveries.log",
        metrics_port=0,
        restart_backoff=1000.0,
        restart_backoff_max=1000.0,
        clock=clock,
    )
    supervisor.start()
    try:
        assert supervisor.metrics_url is not None
        base = supervisor.metrics_url.removesuffix("/metrics")
        assert wait_until(lambda: _get(base + "/readyz") == (200, "ok\n"), timeout=30)
        victim = supervisor.members[1]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        down = (503, "member 1: not running (killed by SIGKILL)\n")
        assert wait_until(lambda: _get(base + "/healthz") == down, timeout=10)
        assert _get(base + "/readyz") == down
        page = _get(supervisor.metrics_url)[1]
        assert _samples(page, "lite_push_supervisor_member_up") == {"0": 1.0, "1": 0.0}
        assert set(_samples(page, "lite_push_messages_processed_total")) == {"0"}  # only who is up
        assert supervisor.members[1].restarts == 0  # waiting for the clock
        clock.advance(1000.0)
        assert wait_until(lambda: _get(base + "/readyz") == (200, "ok\n"), timeout=30)
        assert _get(base + "/healthz") == (200, "ok\n")
        page = _get(supervisor.metrics_url)[1]
        assert _samples(page, "lite_push_supervisor_member_restarts_total") == {"0": 0.0, "1": 1.0}
        assert supervisor.members[1].pid not in (None, victim.pid)
    finally:
        supervisor.stop()
        assert supervisor.wait(60) == 0


def test_run_stops_on_sigterm_and_members_ignore_sigint(
    server: RedisServer, topic: tuple[str, RedisBroker], tmp_path: Path
) -> None:
    ns, broker = topic
    total = 1000
    stored = _send(broker, total, keys=50)
    log = tmp_path / "deliveries.log"
    # the factory's plain form: a consumer (itself a context manager, which the member must not enter)
    supervisor = ProcessSupervisor(functools.partial(members.plain_redis_member, server.url, ns, str(log)), 2)
    previous = signal.getsignal(signal.SIGTERM)

    def drive() -> None:
        if wait_until(lambda: all(s.ready for s in supervisor.members), timeout=60):
            pid = supervisor.members[0].pid
            assert pid is not None
            os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the members too: they leave it to the supervisor
            wait_until(lambda: {(q, o) for _, q, o, *_ in read_log(log)} == stored, timeout=60)
        os.kill(os.getpid(), signal.SIGTERM)  # to run(), in this (main) thread

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    code = supervisor.run()
    driver.join(10)
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is previous  # restored
    assert [s.restarts for s in supervisor.members] == [0, 0]  # SIGINT killed no member
    assert {(q, o) for _, q, o, *_ in read_log(log)} == stored
    _assert_all_committed(broker)


def test_a_member_that_never_starts_is_a_crash_loop_and_the_supervisor_gives_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lite_push.supervisor")
    supervisor = ProcessSupervisor(
        members.failing_member, 1, restart_backoff=0.05, restart_backoff_max=0.1, max_start_failures=3
    )
    supervisor.start()
    assert supervisor.wait(60) == 1
    failure = supervisor.failure
    assert failure is not None
    assert failure.startswith("member 0 ended 3 times in a row before its consumer started; last: pid ")
    assert "exit code 1: ImportError: no module named 'handlers' (member 0)" in failure
    (member,) = supervisor.members
    assert member.restarts == 2 and not member.alive
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(failure in m and "giving up" in m for m in errors), errors


def test_stopping_while_a_member_waits_for_its_restart_exits_1() -> None:
    clock = ManualClock()
    supervisor = ProcessSupervisor(
        members.failing_member, 1, restart_backoff=60.0, restart_backoff_max=60.0, max_start_failures=5, clock=clock
    )
    supervisor.start()
    assert wait_until(lambda: supervisor.members[0].last_exit is not None, timeout=30)
    assert not supervisor.members[0].alive  # waiting on the clock
    supervisor.stop()
    assert supervisor.wait(60) == 1  # it died without draining
    assert supervisor.failure is None and supervisor.members[0].restarts == 0


@pytest.fixture
def unused_tcp_port() -> int:
    return free_port()


def test_a_member_consumer_with_its_own_metrics_port_is_refused(unused_tcp_port: int) -> None:
    supervisor = ProcessSupervisor(
        functools.partial(members.fixed_port_member, unused_tcp_port), 1, metrics_port=0, max_start_failures=1
    )
    supervisor.start()
    assert supervisor.wait(60) == 1
    assert supervisor.failure is not None
    assert "ConfigError: metrics_port: the supervisor serves the members' metrics" in supervisor.failure


def test_a_metrics_port_in_use_is_a_config_error_at_start(unused_tcp_port: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", unused_tcp_port))
        s.listen()
        supervisor = ProcessSupervisor(members.failing_member, 1, metrics_port=unused_tcp_port)
        with pytest.raises(ConfigError) as info:
            supervisor.start()
    assert info.value.field == "metrics_port"
    assert supervisor.members[0].pid is None  # nothing was started


def test_what_a_stopped_member_committed_says_when_it_never_ran_its_consumer() -> None:
    """A member asked to stop before its consumer started (a slow start on
    a loaded machine) exits 0 without a final report: it owned nothing,
    and its state says so; one killed or failed says nothing."""
    from types import SimpleNamespace

    from lite_push.supervisor import _Slot

    def ended(**proc: object) -> str | None:
        slot = _Slot(0, RestartPolicy())
        base: dict[str, object] = {"consumed": 0, "finished": None, "started": None, "error": None, "exitcode": 0}
        slot.ended(SimpleNamespace(**{**base, **proc}))  # type: ignore[arg-type]
        return slot.state().commits

    assert ended() == "stopped before its consumer started, nothing to commit"
    assert ended(exitcode=-9) is None  # killed
    assert ended(started=object(), exitcode=1) is None  # ran, then ended without its report
    assert ended(finished=SimpleNamespace(commits="offsets committed for 2 queues", consumed=3)) == (
        "offsets committed for 2 queues"
    )

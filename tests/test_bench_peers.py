"""The side-by-side grid (issue 31): the checker flags each planted fault
(lost below the committed offset, a duplicate, an order violation, a
same-key overlap), the catalog finds the runners, and a tiny grid
round-trips through the orchestrator: lite_push on Kafka and on Redis and the
serial loop (with this project's python: no venv is made here), on the mock
cluster and a redis-server it starts itself (a few seconds)."""

from __future__ import annotations

import array
import gc
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lite_push.sources.redis_server import RedisServer

# the benchmark modules import each other flat (``import workloads``) and as ``peers.*``
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from peers.catalog import discover, unrunnable  # noqa: E402  (benchmarks/ is put on sys.path above)
from peers.loading import Placement  # noqa: E402
from peers.measure import lost_count, measure  # noqa: E402
from peers.report import markdown, summarize  # noqa: E402
from peers.runner_protocol import GcTimes, settings_of, write_record  # noqa: E402
from peers.thread_cpu import shares, snapshot  # noqa: E402

#: seq -> key: "a" has seqs 0, 2, 4; "b" has 1, 3.  Partition 0 holds a, 1 holds b.
KEYS = ["a", "b", "a", "b", "a"]


def placement() -> Placement:
    placed = Placement.sized(2, len(KEYS))
    for seq, key in enumerate(KEYS):
        placed.part[seq] = 0 if key == "a" else 1
        placed.offset[seq] = seq // 2
        placed.sent_ns[seq] = 0
    return placed


def out(*calls: tuple[int, int, int], capped: bool = False) -> dict[str, object]:
    """An OUT.json with ``(seq, start, end)`` calls, t0 at 0 and wall = perf."""
    return {
        "t0_ns": 0,
        "wall_minus_perf_ns": 0,
        "cpu_s": 0.5,
        "peak_rss_kb": 2048,
        "capped": capped,
        "error": None,
        "config": {"package": "x==1", "keeps_key_order": True},
        "seq": [c[0] for c in calls],
        "start_ns": [c[1] for c in calls],
        "end_ns": [c[2] for c in calls],
    }


def counts(row: dict[str, object]) -> tuple[object, ...]:
    return row["lost"], row["duplicates"], row["order_violations"], row["overlaps"]


CLEAN = ((0, 0, 10), (1, 0, 10), (2, 10, 20), (3, 12, 30), (4, 20, 25))


def test_a_clean_run_passes_and_is_timed() -> None:
    row = measure("p", out(*CLEAN), None, KEYS, placement(), bytearray(5), hot_rate=1e9)
    assert counts(row) == (0, 0, 0, 0)
    assert row["handled"] == 5 and row["rate"] == pytest.approx(5 / 30e-9)
    assert row["of_bound"] == pytest.approx(row["rate"] / 1e9) and row["first_call_ms"] == 0
    assert row["peak_rss_mb"] == 2.0 and row["p99_ms"] == pytest.approx(30e-6)


def test_the_rate_runs_from_the_first_call_start_to_the_last_call_end() -> None:
    # the same calls 3 s after t0 (a group join): the rate is unchanged, the wait is first_call_ms
    late = 3_000_000_000
    shifted = [(seq, start + late, end + late) for seq, start, end in CLEAN]
    row = measure("p", out(*shifted), None, KEYS, placement(), bytearray(5), hot_rate=1e9)
    assert row["rate"] == pytest.approx(5 / 30e-9) and row["seconds"] == pytest.approx(30e-9)
    assert row["first_call_ms"] == pytest.approx(3000.0) and row["of_bound"] == pytest.approx(row["rate"] / 1e9)
    # first start, not first end: a first call that ends last spans the whole run
    row = measure("p", out((0, 5, 100), (1, 10, 20), (2, 100, 110)), None, KEYS[:3], placement(), bytearray(3), 1e9)
    assert row["seconds"] == pytest.approx(105e-9) and row["first_call_ms"] == pytest.approx(5e-6)
    table = markdown({"s": {"summary": {"p": summarize([row], 1e9)}, "hot_key_rate": 1e9}}, {})
    header = table.splitlines()[0].split(" | ")
    assert header[5] == "start ms" and table.splitlines()[2].split(" | ")[5] == "0"


def test_a_message_below_the_committed_offset_never_handled_is_lost() -> None:
    # capped after a's seq 0 and b's 1 and 3; the group committed a up to offset 2 (seqs 0 and 2): seq 2 is lost
    acked = bytearray([1, 1, 1, 1, 0])
    row = measure("p", out((0, 0, 10), (1, 0, 10), (3, 12, 30), capped=True), None, KEYS, placement(), acked, 1e9)
    assert counts(row) == (1, 0, 0, 0) and row["capped"]
    # what was committed past is fine when it was handled; unhandled above the commit is not lost in a capped run
    assert lost_count(bytearray([1, 1, 0, 1, 0]), bytearray([1, 1, 0, 1, 0]), complete=False) == 0
    # an uncommitted, unhandled message is lost only in a run that claims to be complete
    assert lost_count(bytearray([1, 1, 0, 1, 1]), bytearray(5), complete=True) == 1
    assert lost_count(bytearray([1, 1, 0, 1, 1]), None, complete=False) is None


def test_a_duplicate_is_counted() -> None:
    row = measure("p", out(*CLEAN, (0, 40, 41)), None, KEYS, placement(), bytearray(5), 1e9)
    assert counts(row) == (0, 1, 0, 0) and row["calls"] == 6 and row["handled"] == 5


def test_an_order_violation_is_counted() -> None:
    # key a's seq 4 starts before its seq 2
    row = measure(
        "p",
        out((0, 0, 10), (1, 0, 10), (4, 10, 20), (3, 12, 30), (2, 20, 25)),
        None,
        KEYS,
        placement(),
        bytearray(5),
        1e9,
    )
    assert counts(row) == (0, 0, 1, 0)


def test_a_same_key_overlap_is_counted() -> None:
    # key a's seq 2 starts at 5, before seq 0 ends at 10
    row = measure(
        "p",
        out((0, 0, 10), (1, 0, 10), (2, 5, 20), (3, 12, 30), (4, 20, 25)),
        None,
        KEYS,
        placement(),
        bytearray(5),
        1e9,
    )
    assert counts(row) == (0, 0, 0, 1)


def test_a_run_without_output_is_a_row_with_its_error() -> None:
    row = measure("p", None, "runner exited 1 without output: boom", KEYS, placement(), None, 1e9)
    assert row["rate"] == 0.0 and "boom" in row["error"]


def test_the_catalog_and_the_settings() -> None:
    peers = discover()
    assert {"lite_push_kafka", "lite_push_redis", "serial", "pyrallel"} <= set(peers)
    assert peers["lite_push_redis"].broker == "redis" and peers["serial"].broker == "kafka"
    assert peers["lite_push_kafka"].requirements is None and peers["serial"].requirements is not None
    # quixstreams' replicas need the delayed cluster; every other peer shares the one without a delay
    assert peers["quixstreams"].rebalance_delay_ms == 3000
    assert {p.rebalance_delay_ms for n, p in peers.items() if n != "quixstreams"} == {0}
    assert all(p.requirements is None or p.requirements.exists() for p in peers.values())
    assert isinstance(unrunnable(), dict)
    assert settings_of(["lanes=8", "loop=asyncio", "on=false"], {"lanes": 1, "loop": "uvloop", "on": True}) == {
        "lanes": 8,
        "loop": "asyncio",
        "on": False,
    }
    with pytest.raises(SystemExit):
        settings_of(["nope=1"], {"lanes": 1})


def test_a_runner_is_a_peer_with_its_pins_and_unrunnable_peers_have_reasons(tmp_path: Path) -> None:
    for name in (
        "lite_push_x_runner.py",
        "a_runner.py",
        "b_redis_runner.py",
        "try_runner.py",
        "helper.py",
        "quixstreams_runner.py",
    ):
        (tmp_path / name).write_text("")
    for name in ("a", "quixstreams"):
        (tmp_path / f"{name}.requirements.txt").write_text("# python 3.12\na==1\n")
    (tmp_path / "b_redis.requirements.txt").write_text("# python 3.11\nb==2\n")
    (tmp_path / "UNRUNNABLE.md").write_text(
        "# peers\n\n| peer | reason |\n|---|---|\n| `faust` | needs kafka-python's admin client |\n"
    )
    peers = discover(tmp_path)
    assert list(peers) == ["lite_push_x", "a", "b_redis", "quixstreams"]  # try_runner.py has no pins: a helper
    assert peers["quixstreams"].rebalance_delay_ms == 3000 and peers["a"].rebalance_delay_ms == 0
    assert peers["b_redis"].source == "faststream_redis" and peers["a"].source == "kafka"
    assert unrunnable(tmp_path) == {"faust": "needs kafka-python's admin client"}


@pytest.mark.timeout(180)
def test_a_tiny_grid_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench_peers import main

    report = tmp_path / "grid.json"
    argv = [
        "--shapes",
        "kpipe-1ms,io5",
        "--messages",
        "300",
        "--repeat",
        "1",
        "--cap",
        "60",
        "--timeout",
        "90",
        "--peers",
        "lite_push_kafka,serial,lite_push_redis",
        "--python",
        f"serial={sys.executable}",
        "--set",
        "lite_push_kafka:lanes=64",
        "--set",
        "lite_push_redis:lanes=64",
        "--json",
        str(report),
        "--markdown",
    ]
    assert main(argv) == 0
    data = json.loads(report.read_text())
    assert set(data["shapes"]) == {"kpipe-1ms", "io5"}
    for shape in data["shapes"].values():
        assert set(shape["runs"]) == {"lite_push_kafka", "serial", "lite_push_redis"}
        for rows in shape["runs"].values():
            (row,) = rows
            assert row["error"] is None, row["error"]
            assert row["handled"] == 300 and not row["capped"]
            assert counts(row) == (0, 0, 0, 0)
            assert row["rate"] > 0 and row["p99_ms"] > 0 and row["peak_rss_mb"] > 0
    assert data["shapes"]["kpipe-1ms"]["runs"]["lite_push_kafka"][0]["config"]["lanes"] == 64
    table = capsys.readouterr().out
    assert "| lite_push_redis | io5 |" in table and "| serial | kpipe-1ms |" in table


def test_a_stream_group_acks_what_was_delivered_and_not_pending(redis_server: RedisServer) -> None:
    import redis
    from peers.committed import stream_group_acked
    from peers.loading import fill_faststream_redis

    client = redis.Redis.from_url(redis_server.url)

    def filler(c: redis.Redis, stream: str, items: list[tuple[str, bytes]]) -> None:
        for key, value in items:
            c.xadd(stream, {"key": key, "data": value})

    placed = fill_faststream_redis(client, "s", KEYS, 16, filler)
    assert len(placed.stream_ids) == 5 and placed.stream_ids == sorted(placed.stream_ids)
    assert stream_group_acked(client, "s", "g", placed) == bytearray(5)  # no such group: nothing acked
    client.xgroup_create("s", "g", id="0")
    got = client.xreadgroup("g", "c", {"s": ">"}, count=3)  # seqs 0, 1, 2 delivered
    ids = [entry_id for entry_id, _ in got[0][1]]
    client.xack("s", "g", ids[0], ids[2])  # 1 stays pending
    assert stream_group_acked(client, "s", "g", placed) == bytearray([1, 0, 1, 0, 0])
    client.close()


@pytest.mark.timeout(60)
def test_a_peer_asking_for_a_rebalance_delay_gets_its_own_cluster_with_the_shape_filled() -> None:
    from contextlib import ExitStack

    from bench_peers import Brokers
    from peers.shapes import messages_of

    peers = discover()
    quix, serial = peers["quixstreams"], peers["serial"]
    msgs = messages_of("kpipe-1ms", 40)
    with ExitStack() as stack:
        brokers = Brokers(stack, {0, quix.rebalance_delay_ms}, redis_=False)
        assert [c.rebalance_delay_ms for c in brokers.clusters.values()] == [0, 3000]
        slots = {brokers.slot(quix), brokers.slot(serial)}
        assert slots == {"kafka", "kafka@3000ms"}
        filled = brokers.fill(msgs, slots, "t")
        (topic, plain), (topic2, delayed) = filled["kafka"], filled["kafka@3000ms"]
        assert topic == topic2 and list(plain.part) == list(delayed.part)
        assert list(plain.offset) == list(delayed.offset)
        assert brokers.broker_args(quix) == ["--bootstrap", brokers.clusters[3000].bootstrap]
        assert brokers.broker_args(serial) == ["--bootstrap", brokers.clusters[0].bootstrap]
        assert brokers.acked(quix, topic, "nobody", delayed) == bytearray(40)  # read on its own cluster


def test_thread_shares_name_each_thread_and_its_share_of_a_core() -> None:
    """A thread's name may hold spaces and parentheses; the process's own
    thread is ``main``; each share is the ticks it used over the window,
    busiest first; threads that used nothing or are new and idle are left out."""
    import os
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    pid = 100
    before = {100: ("python", 10), 101: ("rdk:broker1", 5), 102: ("python", 7)}
    after = {100: ("python", 10 + tick), 101: ("rdk:broker1", 5 + tick // 2), 102: ("python", 7), 103: ("a (b) c", 0)}
    assert shares(pid, before, after, 2.0) == [("main 100", 0.5), ("rdk:broker1 101", (tick // 2) / tick / 2.0)]
    # this process, read from /proc: every thread is there under its id
    t = threading.Thread(target=threading.Event().wait, args=(5.0,), daemon=True)
    t.start()
    Path(f"/proc/self/task/{t.native_id}/comm").write_text("a (b) c")  # the kernel's name of that thread
    now = snapshot(os.getpid())
    assert os.getpid() in now
    assert now[t.native_id][0] == "a (b) c"
    assert all(ticks >= 0 for _name, ticks in now.values())


def test_a_record_says_where_the_process_spent_on_gc_and_how_often_it_switched(tmp_path: Path) -> None:
    times = GcTimes()
    times.install()
    try:
        for _ in range(3):
            a: list[object] = []
            a.append(a)  # a cycle only the collector frees
            del a
            gc.collect()
    finally:
        times.uninstall()
    assert times.collections[2] >= 3
    assert all(s >= 0.0 for s in times.seconds)
    calls = SimpleNamespace(seq=array.array("q", [0]), start_ns=array.array("q", [1]), end_ns=array.array("q", [2]))
    path = tmp_path / "OUT.json"
    write_record(path, {"t0_ns": 0}, {"package": "x==1"}, calls)
    record = json.loads(path.read_text())
    assert len(record["gc"]["collections"]) == 3 and record["gc"]["collections"][2] >= 3  # this process's own
    assert len(record["context_switches"]) == 2 and all(n >= 0 for n in record["context_switches"])
    assert record["seq"] == [0] and record["config"]["package"] == "x==1"


def test_the_cpu_probe_says_each_thread_s_cpu_the_gc_and_librdkafka_s_consume_calls() -> None:
    import os
    import re
    import subprocess

    root = BENCHMARKS.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "peers" / "cpu_probe.py"), "--messages", "20000", "--cost-ms", "0.1"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rate = re.search(r"([\d,]+) msg/s over ([\d,]+) messages, CPU [\d.]+ us/msg: (.*)", done.stdout)
    assert rate is not None, done.stdout
    assert 0 < int(rate.group(2).replace(",", "")) <= 20000
    assert "loop " in rate.group(3), done.stdout  # the pull side is a task on the loop; its helper seldom runs
    assert re.search(r"GC \(collections, CPU us/msg\): gen0 ", done.stdout), done.stdout
    calls = re.search(r"consume: ([\d,]+) calls, (\d+) records each", done.stdout)
    assert calls is not None and int(calls.group(1).replace(",", "")) > 0, done.stdout

"""Balance.MESSAGE across real processes under real faults: three member
processes of one group on a real redis-server; one is killed with
``kill -9``, frozen with SIGSTOP past its session, or cut off from Redis by
a proxy that stops forwarding (its sockets open); or redis-server itself is
killed and restarted.  Nothing may be lost, no key may run in two members
at once, and each key's first deliveries keep offset order."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from member_runs import check_kill_run, run_three_and_kill

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from fault_suite import run_redis  # noqa: E402  (benchmarks/ is put on sys.path above)


def test_one_of_three_members_killed_its_keys_go_on_in_order_elsewhere(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """c: the killed member's unacknowledged messages and keys go to the
    others once its session lapsed, in key order; nothing is lost."""
    ns = f"mk-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(redis_server.url, namespace=ns)
    broker.create_topic("T", queue_count=2)
    total = 8000
    broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(total)])
    source_lines = (
        "from lite_push.sources import Balance, ConsumeFromWhere\n"
        "from lite_push.sources.redis import RedisBroker\n"
        f"broker = RedisBroker({redis_server.url!r}, namespace={ns!r}, session_timeout=2.0, heartbeat_interval=0.3)\n"
        'source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="{cid}",\n'
        "                              balance=Balance.MESSAGE)\n"
    )
    run = run_three_and_kill(source_lines, tmp_path / "deliveries.log", total)
    stored = {(q.queue_id, o) for q in broker.queues("T") for o in range(broker.max_offset(q))}
    broker.close()
    assert len({pid for pid, *_ in run.rows if pid != run.victim}) == 2  # both survivors took part
    check_kill_run(run, stored)


@pytest.mark.parametrize("scenario", ["msg-sigstop", "msg-partition", "msg-redis-kill"])
def test_a_frozen_or_cut_off_member_or_a_restarted_server_breaks_nothing(scenario: str) -> None:
    """c, 4: a member frozen (SIGSTOP) or partitioned (a proxy that stops
    forwarding) past its session: its keys go to the others only after its
    fence closed, and when it comes back its late acknowledgements change
    nothing; redis-server killed and restarted on its data: nothing lost."""
    res = run_redis(scenario, 3000, seed=11)
    # nothing lost: the victim's keys did move (the run waits for every message)
    assert (res.lost, res.inversions, res.overlaps) == (0, 0, 0), res

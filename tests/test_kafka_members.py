"""Three lite_push member processes of one group on the Kafka source, one
killed with SIGKILL mid-run: its partitions move to the survivors after its
session expires, nothing is lost, each key's messages stay in order and no
key runs in two processes at once.  The broker is librdkafka's mock cluster,
started here on 127.0.0.1 and stopped by its PID."""

from __future__ import annotations

from member_runs import check_kill_run, run_three_and_kill

from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

#: The members' session: the mock rebalances in (session - 1 s) per phase.
SESSION = 2.0


def test_three_members_one_killed_its_partitions_move_and_keys_stay_ordered(tmp_path):
    with MockKafkaCluster() as cluster:
        broker = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        queues = broker.create_topic("T", 8)
        total = 12_000
        broker.send_batch("T", [(b"x", f"k{i % 300}") for i in range(total)])
        ends = {q.queue_id: broker.watermarks(q)[1] for q in queues}
        broker.close()
        assert sum(ends.values()) == total
        source_lines = (
            "from lite_push.sources import ConsumeFromWhere\n"
            "from lite_push.sources.kafka import KafkaBroker\n"
            f"broker = KafkaBroker({cluster.bootstrap!r}, session_timeout={SESSION!r})\n"
            'source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET, client_id="{cid}")\n'
        )
        # slow enough that the others join before one member is half done
        run = run_three_and_kill(source_lines, tmp_path / "deliveries.log", total, sleep=0.004)
    # the partitions it held are consumed again within the session timeout,
    # the mock's two rebalance phases and slack
    check_kill_run(run, {(q, o) for q, end in ends.items() for o in range(end)})

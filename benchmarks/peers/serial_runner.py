"""The serial confluent-kafka loop, as a runner of ``bench_peers.py``: the
baseline every framework is measured against (``kafka_peers.run_serial``'s
loop, in a process and a venv of its own).

confluent-kafka 2.16.1 (the project's version; librdkafka 2.16.0), Python
3.11.  One ``Consumer``: ``poll`` one message, ``time.sleep(cost)``,
``store_offsets`` (``enable.auto.offset.store`` false: a message's offset
is stored only once it was handled, at-least-once), librdkafka's auto
commit of the stored offsets every 5 s (its default), a final synchronous
commit when the run stops.  ``auto.offset.reset`` earliest.  No settings:
one message at a time is what it is.  It keeps per-key order (and
per-partition order: everything is in order, one call at a time).
"""

from __future__ import annotations

import importlib.metadata
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException
from runner_protocol import Calls, Usage, load_costs, parse_args, settings_of, write_out


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    settings_of(args.set, {})
    costs = load_costs(args.costs)
    calls = Calls(len(costs))
    conf = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
    }
    clock, sleep = time.perf_counter_ns, time.sleep
    capped, error = False, None
    usage = Usage()
    usage.start()
    consumer = Consumer(conf)
    consumer.subscribe([args.topic])
    try:
        while not calls.done:
            if usage.over(args.cap):
                capped = True
                break
            if usage.over(args.timeout):
                error = f"timeout after {args.timeout:g}s ({calls.distinct} of {calls.total} handled)"
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue  # partition EOF and the like
            seq = int.from_bytes(msg.value()[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                sleep(cost / 1e6)
            calls.record(seq, start, clock())
            consumer.store_offsets(msg)
        usage.stop()
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as e:  # nothing stored (no message handled): nothing to commit
            if e.args[0].code() != KafkaError._NO_OFFSET:
                raise
    finally:
        consumer.close()
    write_out(
        args.out,
        usage,
        calls,
        capped=capped,
        error=error,
        config={
            "package": f"confluent-kafka=={importlib.metadata.version('confluent-kafka')}",
            "client": "confluent_kafka.Consumer, poll one message at a time",
            "handler": "time.sleep(cost)",
            **{k: v for k, v in conf.items() if k not in ("bootstrap.servers", "group.id")},
            "keeps_key_order": True,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""lite_push on its Kafka source, as a runner of ``bench_peers.py``.

lite_push 0.1.0 (this repository, run with the project's own venv: no
requirements file), confluent-kafka 2.16.1 (librdkafka 2.16.0) under its
Kafka source.  The consumer and its settings are ``lite_push_consume.py``'s:
``AsyncLitePushConsumer`` on uvloop, ``KEY_ORDERLY`` (a key's messages one
at a time, in offset order: per key, not per partition), an ``async def``
listener awaiting ``asyncio.sleep(cost)``, 1,024 lanes.  The source is
``KafkaBroker(bootstrap).pull_consumer(group, consume_from=FIRST_OFFSET)``
(session timeout 45 s, librdkafka's default); the topic exists (the
orchestrator made it through the mock cluster), and KEY_ORDERLY subscribes no
retry topic, so nothing needs the admin API.

Lanes tried (``--set lanes=N``; rough, 2 busy cores, other benchmarks
running): see ``benchmarks/RESULTS.md``'s issue 31 section and the report of
the run that chose 1,024.
"""

from __future__ import annotations

import sys

from lite_push_consume import consume
from runner_protocol import parse_args

from lite_push import ConsumeFromWhere
from lite_push.sources.kafka import KafkaBroker


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    broker = KafkaBroker(args.bootstrap, session_timeout=45.0)
    try:
        return consume(
            args, lambda group: broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET), "kafka"
        )
    finally:
        broker.close()


if __name__ == "__main__":
    sys.exit(main())

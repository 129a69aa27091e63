"""lite_push on its Redis Streams source, as a runner of ``bench_peers.py``.

lite_push 0.1.0 (this repository, run with the project's own venv: no
requirements file), redis-py 6.4.0 with hiredis under its Redis source,
redis-server 7.0.  The consumer and its settings are
``lite_push_consume.py``'s: ``AsyncLitePushConsumer`` on uvloop,
``KEY_ORDERLY`` (a key's messages one at a time, in offset order), an
``async def`` listener awaiting ``asyncio.sleep(cost)``, 2,048 lanes.  The
source is ``RedisBroker(url).pull_consumer(group,
consume_from=FIRST_OFFSET)`` in the default namespace ``lite_push``, where
the orchestrator stored the topic (``RedisBroker.send_batch``, 8 queues, a
key's queue ``lane_of(key, 8)``, as the Kafka topic's partitions).
"""

from __future__ import annotations

import sys

from lite_push_consume import consume
from runner_protocol import parse_args

from lite_push import ConsumeFromWhere
from lite_push.sources.redis import RedisBroker


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "redis")
    broker = RedisBroker(args.redis)
    try:
        return consume(
            args, lambda group: broker.pull_consumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET), "redis"
        )
    finally:
        broker.close()


if __name__ == "__main__":
    sys.exit(main())

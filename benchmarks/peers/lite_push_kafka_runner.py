"""lite_push on its Kafka source, as a runner of ``bench_peers.py``.

lite_push 0.1.0 (this repository, run with the project's own venv: no
requirements file), confluent-kafka 2.16.1 (librdkafka 2.16.0) under its
Kafka source.  The consumer and its settings are ``lite_push_consume.py``'s:
``AsyncLitePushConsumer`` on uvloop, ``KEY_ORDERLY`` (a key's messages one
at a time, in offset order: per key, not per partition), an ``async def``
listener awaiting ``asyncio.sleep(cost)``, 2,048 lanes.  The source is
``KafkaBroker(bootstrap).pull_consumer(group, consume_from=FIRST_OFFSET)``
(session timeout 45 s, librdkafka's default); the topic exists (the
orchestrator made it through the mock cluster), and KEY_ORDERLY subscribes no
retry topic, so nothing needs the admin API.

Lanes tried (``--set lanes=N``, one run each, 2 cores shared with other
benchmarks: rough), msg/s and share of the hot-key bound:

=================  ==============  ==============  ==============  =========
shape (messages)   512             1,024           2,048           4,096
=================  ==============  ==============  ==============  =========
kpipe-100ms (40k)  2,291 (33 %)    3,027-4,653     6,593-6,702     6,705
                                   (44-67 %)       (96-97 %)       (97 %)
kpipe-10ms (100k)                  20,174 (27 %)   21,659 (29 %)   22,163
kpipe-1ms (100k)                   32,582          29,909          32,431
=================  ==============  ==============  ==============  =========

(256 lanes: 11,766 msg/s on kpipe-10ms at 60k, a quarter of 1,024's
ceiling ``lanes / cost``.)  At 100 ms, 1,024 lanes for 1,000 keys was not
enough: a key without queued work goes to the least-loaded lane, and with a
backlog some keys ended up sharing one; 2,048 reaches the bound.  At 1 and
10 ms the lanes do not matter: lite_push runs at 20-35k msg/s there, with
about half a core of CPU in its own process (the mock cluster serving its
fetches runs in another) on a machine shared with other runs; the hot-key
bound of 1,000 uniform keys (70k and 700k msg/s) is far above.
uvloop against asyncio's loop: 33k against 23k msg/s (kpipe-10ms, 60k).

``pull_threshold_for_queue`` (unfinished messages per partition before it
is paused; lite_push's default 1000), with 2,048 lanes, Kafka / Redis
source, one run each:

=================  ====================  ====================  ===========
shape (messages)   1000                  5000                  10000
=================  ====================  ====================  ===========
io5 (50k)          11,007 / 14,663       14,658 / 14,737
                   (63 % / 84 %)         (84 % / 85 %)
io1 (50k)          5,001 / 5,085         5,201 / 5,289
kpipe-10ms (50k)   20,963 / 25,203       40,243 / 24,330
kpipe-10ms (100k)                        30,286 / 22,437       22,669 / 18,585
kpipe-100ms (100k)                       7,162 / 7,253 (97 %)  7,059 / 7,124
kpipe-1ms (50k)    43,080 / 42,341       44,953 / 46,189
=================  ====================  ====================  ===========

At 1000 the Kafka source's partitions were paused and resumed all along
(io5: 1.3 CPU s in a 5 s run, the mock cluster idle: waiting, not
working); 5000 is the default here.  ``pull_batch_size`` 64 with it:
36,266 / 27,666 on kpipe-10ms (100k), within the noise of 32's; 128 and 512
on io5: 10,580 and 11,526 (at threshold 1000, against 11,075), so 32 stayed.

The tables above were measured before three changes to lite_push that
followed from profiling this runner (py-spy, every thread; in-process runs
of 150,000 messages): (1) the cyclic GC walked every message in flight --
40,000 with this threshold -- and took about a fifth of the CPU (0.85 s of
3.4); the sources now hand messages out untracked and the router its
segments (``lite_push._kernels.untrack_py``), 0.3 s left; (2) admission held lanes
back on ``kpipe-10ms`` (30,000-39,000 msg/s against 47,000 with it off):
it now weighs a turn by the loop thread's CPU and aims at no less than
half a listener's latency; (3) a queue resumed after a flow-control pause
waited a median 300 ms for records (librdkafka's 500 ms
``fetch.wait.max.ms``); members now fetch with 100.  Together, with
``pull_batch_size`` 128 since: ``kpipe-1ms`` (150,000) 38,000-44,000 msg/s
to 61,000-73,000, ``kpipe-10ms`` 34,000 to 47,000-55,000, the CPU per
message from 21 to 13-15 microseconds (aiokafka's runner: 10-11).
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

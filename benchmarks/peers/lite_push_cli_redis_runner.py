"""lite_push's command line on Redis, as a runner of ``bench_peers.py`` (issue 40).

    lite-push consume --source redis://HOST:PORT/0 --group G --topic T --from first \\
        --listener lite_push_cli_listener:listener --progress off --log-level WARNING [--lanes N]

run in this process by ``lite_push.cli.main`` (``lite_push_cli.py``: how it
stops, what it records, its settings), with the project's python.  The
topic is lite_push's Redis topic (``peers/catalog.py``: a ``lite_push_*_redis``
peer reads it), which the orchestrator stored in the default namespace
``lite_push`` with as many queues as the Kafka topic has partitions.  Its
variant ``lite_push_cli_redis@1024`` passes ``--lanes 1024``.
"""

from __future__ import annotations

import sys

from lite_push_cli import run_command
from runner_protocol import parse_args


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "redis")
    return run_command(args, args.redis, "redis")


if __name__ == "__main__":
    sys.exit(main())

"""lite_push's command line on Kafka, as a runner of ``bench_peers.py`` (issue 40).

    lite-push consume --source kafka://HOST:PORT --group G --topic T --from first \\
        --listener lite_push_cli_listener:listener --progress off --log-level WARNING [--lanes N]

run in this process by ``lite_push.cli.main`` (``lite_push_cli.py``: how it
stops, what it records, its settings), with the project's python: lite_push
of this working copy and confluent-kafka under its Kafka source, every
source setting at its default (``kafka://`` with no query).  Its variant
``lite_push_cli_kafka@1024`` passes ``--lanes 1024``.
"""

from __future__ import annotations

import sys

from lite_push_cli import run_command
from runner_protocol import parse_args


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], "kafka")
    return run_command(args, f"kafka://{args.bootstrap}", "kafka")


if __name__ == "__main__":
    sys.exit(main())

"""Where a Redis member's pull thread spends a poll, balanced by queue and by
message (issue 42): the same consumer as ``grain_costs.py`` (one member,
no-op listener, 8 lanes, 4 queues, 2,000 keys), with ``PollRead``'s steps
and the member's commits timed (wall time on the pull thread, GIL waits
included), QUEUE then MESSAGE in one run.

    .venv/bin/python benchmarks/grain_poll_times.py --messages 40000

Per step: total ms, calls, µs per call.  ``poll`` is a whole
``PollRead.__call__``; ``build`` queues the read (by message: the
proposals), ``apply`` turns the replies into batches (by message: the
records, the read-ahead), ``execute`` is every pipeline's round trip (polls
and commits); ``empty polls`` are the polls made while every owned queue
was paused (by message a queue's buffer is 4 messages per lane).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grain_costs import per_message

from lite_push import Balance
from lite_push.sources.redis import message_grain, polling
from lite_push.sources.redis_server import RedisServer

TOTAL: Counter[str] = Counter()
CALLS: Counter[str] = Counter()


def timed(owner: Any, name: str, label: str) -> None:
    real: Callable[..., Any] = getattr(owner, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            TOTAL[label] += time.perf_counter() - t
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40000)
    args = ap.parse_args()
    timed(polling.PollRead, "__call__", "poll")
    timed(polling.PollRead, "_build", "build")
    timed(polling.PollRead, "_apply", "apply")
    timed(redis.client.Pipeline, "execute", "execute")
    timed(message_grain.MessageGrain, "commit", "commit (by message)")
    empty = [0]
    real_build = polling.PollRead._build

    def build(self: Any, *a: Any, **k: Any) -> Any:
        out = real_build(self, *a, **k)
        empty[0] += not out[2]
        return out

    polling.PollRead._build = build  # type: ignore[method-assign]
    with RedisServer(appendonly=False) as server:
        for balance in (Balance.QUEUE, Balance.MESSAGE):
            TOTAL.clear()
            CALLS.clear()
            empty[0] = 0
            r = per_message(server.url, args.messages, balance)
            print(f"## {balance.value}: {r['rate']:,.0f} msg/s, {empty[0]} empty polls")
            print("| step | ms | calls | µs per call |")
            print("|---|---:|---:|---:|")
            for label in ("poll", "build", "apply", "execute", "commit (by message)"):
                if CALLS[label]:
                    ms, n = TOTAL[label] * 1000, CALLS[label]
                    print(f"| {label} | {ms:.0f} | {n} | {TOTAL[label] / n * 1e6:.0f} |")
            print()


if __name__ == "__main__":
    main()

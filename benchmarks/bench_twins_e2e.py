"""End-to-end no-op throughput with the compiled kernels and with the
pure-Python twins, in the same run.

    .venv/bin/python benchmarks/bench_twins_e2e.py [--messages 1000000] [--rounds 3]

The twin is chosen at import time, so each measurement is a child process
(``LITE_PUSH_NO_EXTENSIONS=1`` for the twins); rounds alternate c, py, c, py
so that the machine's noise hits both alike.  Each child fills an in-memory
embedded broker (8 queues, 10,000 keys, 16-byte bodies) and consumes it
twice with a no-op listener in KEY_ORDERLY mode, 16 lanes, default config;
the better of the two is reported (the first warms the caches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import gc, json, sys
from lite_push import OFFSETS_IMPL, ROUTER_IMPL, ConsumerConfig, EmbeddedBroker
from lite_push.demo import fill_broker, run_once
n = int(sys.argv[1]); pull = int(sys.argv[2])
broker = EmbeddedBroker()
fill_broker(broker, "NOOP", n, queues=8, keys=10_000, body_size=16)
rates = []
for i in range(2):
    gc.collect()
    config = ConsumerConfig(group=f"g{i}", lanes=16, pull_batch_size=pull)
    r = run_once(broker, "NOOP", "noop", config, None, check=False)
    rates.append(r.rate)
print(json.dumps({"router": ROUTER_IMPL, "offsets": OFFSETS_IMPL, "rate": max(rates)}))
"""


def measure(pure: bool, messages: int, pull: int) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("LITE_PUSH_NO_EXTENSIONS", None)
    if pure:
        env["LITE_PUSH_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(messages), str(pull)], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pull-batch-size", type=int, default=32)
    args = parser.parse_args()
    got: dict[str, list[float]] = {"cython": [], "python": []}
    for r in range(args.rounds):
        for pure in (False, True):
            res = measure(pure, args.messages, args.pull_batch_size)
            key = "python" if pure else "cython"
            if res["router"] != key or res["offsets"] != key:
                raise SystemExit(f"expected the {key} kernels, got {res}")
            got[key].append(float(res["rate"]))  # type: ignore[arg-type]
            print(f"round {r + 1}: {key} {res['rate']:,.0f} msg/s", file=sys.stderr)
    c, py = statistics.median(got["cython"]), statistics.median(got["python"])
    print(
        f"\n{args.messages:,} messages, 16 lanes, KEY_ORDERLY, pull_batch_size {args.pull_batch_size}, "
        f"{args.rounds} alternating rounds\n"
    )
    print("| kernels | msg/s per round | median msg/s |")
    print("|---|---|---:|")
    for key in ("cython", "python"):
        print(f"| {key} | {', '.join(f'{x:,.0f}' for x in got[key])} | {statistics.median(got[key]):,.0f} |")
    print(f"\ncython / python (medians): {c / py:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

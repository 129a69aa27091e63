"""What CPython's threads allow, without lite_push: N threads that each sleep
1 ms per "message" plus a little Python work, as a ceiling for thread lanes.

    .venv/bin/python benchmarks/bench_gil_sleep.py
"""

from __future__ import annotations

import sys
import threading
import time


def rate(threads: int, per_thread: int, work: int) -> float:
    def worker() -> None:
        for _ in range(per_thread):
            time.sleep(0.001)
            x = 0
            for i in range(work):
                x += i

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return threads * per_thread / (time.perf_counter() - t0)


def main() -> int:
    print("| threads | Python loop iterations per sleep | sleeps/s | ideal |")
    print("|---:|---:|---:|---:|")
    for threads in (8, 64, 256):
        for work in (0, 100, 200):
            print(f"| {threads} | {work} | {rate(threads, 400, work):,.0f} | {threads * 1000:,} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

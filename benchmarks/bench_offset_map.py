"""Size and speed of the offset map committed with each offset.

    .venv/bin/python benchmarks/bench_offset_map.py [--span 1000000] [--repeat 5]

For a span of ``--span`` offsets above the committed one with 10, 1,000 and
100,000 unfinished offsets at random positions, prints the encoded size (the
chosen form and the other one), ``estimate_size`` (the flow-control bound),
the time to read the unfinished offsets from the tracker and encode them (what
a commit costs), and the time to decode and test every offset of the span
(what a restart costs).  Best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import random
import time

from lite_push._kernels.offsets import OFFSETS_IMPL, OffsetTracker
from lite_push._state.offset_map import decode, encode, estimate_size
from lite_push._types import MessageExt


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--span", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    span = args.span
    print(f"tracker: {OFFSETS_IMPL}; span {span:,} offsets")
    print(
        "| unfinished | form | bytes | other form bytes | estimate_size | commit (unfinished()+encode) ms "
        "| restart (decode + test span) ms |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    rng = random.Random(1)
    for count in (10, 1_000, 100_000):
        unfinished = sorted({0, *rng.sample(range(1, span), count - 1)})
        tracker = OffsetTracker(0)
        msgs = [MessageExt("T", 0, o, b"") for o in range(span)]
        tracker.add_batch(msgs, span)
        keep = set(unfinished)
        tracker.complete_batch([m for m in msgs if m.queue_offset not in keep])
        assert tracker.unfinished() == unfinished
        text = encode(0, span, unfinished)
        runs = encode(0, span, unfinished, form="runs")
        bitmap = encode(0, span, unfinished, form="bitmap")
        form = "runs" if text == runs else "bitmap"
        other = len(bitmap) if form == "runs" else len(runs)
        commit = best(lambda t=tracker: encode(0, span, t.unfinished()), args.repeat)

        def restart(text: str = text, count: int = count) -> None:
            fin = decode(text, 0)
            assert fin is not None
            n = 0
            for o in range(span):
                n += o in fin
            assert n == span - count

        restart_s = best(restart, max(1, args.repeat // 2))
        print(
            f"| {count:,} | {form} | {len(text):,} | {other:,} | {estimate_size(span, count):,} | "
            f"{commit * 1e3:.1f} | {restart_s * 1e3:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The harness's listeners: sleep (or await) each message's cost and record
every delivery for the consumption log (``harness.py``, ``check_log.py``).

A message's body starts with its workload ``seq`` (8 bytes, big endian); a
recorder maps it back to the row's cost and ``fail_times``.
"""

from __future__ import annotations

import threading
import time
from array import array

import pyarrow as pa

from lite_push import MessageExt

__all__ = ["AsyncRecorder", "Recorder"]


#: The recorders' columns, in order (one ``array('q')`` each: appending an
#: int allocates no object the cyclic GC tracks, where a tuple per delivery
#: made the collector a visible share of a 100,000 msg/s run).
_COLUMNS = ("seq", "queue", "offset", "start_ns", "end_ns", "attempt")


def _columns() -> list[array[int]]:
    return [array("q") for _ in _COLUMNS]


def _table(run: str, keys: list[str], parts: list[tuple[int, list[array[int]]]]) -> pa.Table:
    """The consumption log from ``(lane, columns)`` parts."""
    cols: dict[str, list[int]] = {c: [] for c in _COLUMNS}
    lanes: list[int] = []
    for lane, part in parts:
        for name, col in zip(_COLUMNS, part, strict=True):
            cols[name].extend(col)
        lanes.extend([lane] * len(part[0]))
    n = len(lanes)
    return pa.table(
        {
            "run": pa.array([run] * n, pa.string()),
            "seq": pa.array(cols["seq"], pa.int64()),
            "key": pa.array([keys[s] for s in cols["seq"]], pa.string()),
            "queue": pa.array(cols["queue"], pa.int32()),
            "offset": pa.array(cols["offset"], pa.int64()),
            "lane": pa.array(lanes, pa.int32()),
            "start_ns": pa.array(cols["start_ns"], pa.int64()),
            "end_ns": pa.array(cols["end_ns"], pa.int64()),
            "attempt": pa.array(cols["attempt"], pa.int32()),
        }
    )


class AsyncRecorder:
    """The asyncio executor's listener: awaits ``asyncio.sleep`` for each
    message's cost (simulated async I/O) and records the delivery as
    :class:`Recorder` does (one set of columns: every lane runs on the loop
    thread; the lane is logged as -1)."""

    def __init__(self, costs: list[int], fail_times: list[int] | None = None) -> None:
        self._costs = costs
        self._fails = fail_times if fail_times is not None and any(fail_times) else None
        self._cols = _columns()

    @property
    def costs(self) -> list[int]:
        """Each message's cost in microseconds, by ``seq``."""
        return self._costs

    async def __call__(self, msgs: list[MessageExt]) -> None:
        import asyncio

        fails = self._fails
        if fails is not None:
            for m in msgs:
                if m.reconsume_times < fails[int.from_bytes(m.body[:8], "big")]:
                    raise RuntimeError("poisoned")
        # (asyncio.current_task() per call, to log the lane, would cost more than the rest of this listener)
        seqs, queues, offsets, starts, ends, attempts = self._cols
        costs = self._costs
        clock = time.perf_counter_ns
        sleep = asyncio.sleep
        for m in msgs:
            seq = int.from_bytes(m.body[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                await sleep(cost / 1e6)
            ends.append(clock())
            seqs.append(seq)
            queues.append(m.queue_id)
            offsets.append(m.queue_offset)
            starts.append(start)
            attempts.append(m.reconsume_times)

    def table(self, run: str, keys: list[str]) -> pa.Table:
        return _table(run, keys, [(-1, self._cols)])


class Recorder:
    """The listener: sleeps each message's cost and records the delivery in
    per-thread columns (no lock on the hot path).

    ``fail_times[seq]`` (default: none fail) is how many attempts of a
    message fail: while ``reconsume_times`` is below it the call raises
    ``RuntimeError("poisoned")`` before doing or logging anything -- for the
    whole batch, so a retried batch is never logged twice."""

    def __init__(self, costs: list[int], fail_times: list[int] | None = None) -> None:
        self._costs = costs
        self._fails = fail_times if fail_times is not None and any(fail_times) else None
        self._local = threading.local()
        self._all: list[tuple[str, list[array[int]]]] = []
        self._lock = threading.Lock()

    def _cols(self) -> list[array[int]]:
        try:
            return self._local.cols  # type: ignore[no-any-return]
        except AttributeError:
            cols = _columns()
            self._local.cols = cols
            with self._lock:
                self._all.append((threading.current_thread().name, cols))
            return cols

    def __call__(self, msgs: list[MessageExt]) -> None:
        fails = self._fails
        if fails is not None:
            for m in msgs:
                if m.reconsume_times < fails[int.from_bytes(m.body[:8], "big")]:
                    raise RuntimeError("poisoned")
        seqs, queues, offsets, starts, ends, attempts = self._cols()
        costs = self._costs
        clock = time.perf_counter_ns
        for m in msgs:
            seq = int.from_bytes(m.body[:8], "big")
            start = clock()
            cost = costs[seq]
            if cost:
                time.sleep(cost / 1e6)
            ends.append(clock())
            seqs.append(seq)
            queues.append(m.queue_id)
            offsets.append(m.queue_offset)
            starts.append(start)
            attempts.append(m.reconsume_times)

    def table(self, run: str, keys: list[str]) -> pa.Table:
        with self._lock:
            parts = list(self._all)
        return _table(
            run,
            keys,
            [(int(name.rsplit("-", 1)[1]) if name.startswith("lite-push-lane-") else -1, cols) for name, cols in parts],
        )

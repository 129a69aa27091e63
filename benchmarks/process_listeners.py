"""Listeners of ``bench_processes.py``, imported by ``lite-push consume`` in
each member process (the benchmark puts ``benchmarks/`` on ``PYTHONPATH``).

``sleep_1ms`` is the ``sms`` workload's cost: 1 ms awaited per call
(``batch_size`` 1: per message).  ``sleep_1ms_logged`` does the same and
appends one line per message to ``$BENCH_PROCESSES_LOG/<pid>.log``::

    pid queue offset key start_ns end_ns 0

(``time.monotonic_ns``, one clock for every process of the machine; the
last field is the fault suite's "failed attempt" flag, always 0 here), with
one ``os.write`` per call: a member process ends with ``os._exit``, so
nothing may wait in a buffer.
"""

from __future__ import annotations

import asyncio
import os
import time

from lite_push import MessageExt

__all__ = ["sleep_1ms", "sleep_1ms_logged"]

_fd: int | None = None


async def sleep_1ms(msgs: list[MessageExt]) -> None:
    await asyncio.sleep(0.001)


def _log_fd() -> int:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["BENCH_PROCESSES_LOG"], f"{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return _fd


async def sleep_1ms_logged(msgs: list[MessageExt]) -> None:
    start = time.monotonic_ns()
    await asyncio.sleep(0.001)
    end = time.monotonic_ns()
    pid = os.getpid()
    lines = "".join(f"{pid} {m.queue_id} {m.queue_offset} {m.keys} {start} {end} 0\n" for m in msgs)
    os.write(_log_fd(), lines.encode())

"""Where a process's CPU goes, by thread (Linux ``/proc``).

``try_runner.py --threads SECONDS`` reads a runner's threads twice, that
many seconds apart, once the run is under way, and prints each thread's
share of one core.  It answers what the process total cannot: whether a
Python consumer is bound by the GIL (its Python threads together near one
core) and which of its threads spends it.  Python threads are named
``python`` by the kernel (the main thread is the one whose id is the
process id); librdkafka names its own (``rdk:broker1``, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ThreadTicks", "shares", "snapshot"]

#: Per thread id: (kernel name, user + system CPU in clock ticks).
ThreadTicks = dict[int, tuple[str, int]]


def _parse_stat(text: str) -> tuple[str, int]:
    """The name and the user + system ticks of one ``/proc/.../stat`` line
    (the name is in parentheses and may hold spaces or parentheses)."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return name, int(fields[11]) + int(fields[12])


def snapshot(pid: int) -> ThreadTicks:
    """The CPU ticks of each of ``pid``'s threads now (threads that exit
    while being read are left out)."""
    out: ThreadTicks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _parse_stat((task / "stat").read_text())
        except (OSError, ValueError):
            continue
    return out


def shares(pid: int, before: ThreadTicks, after: ThreadTicks, seconds: float) -> list[tuple[str, float]]:
    """Each thread's share of one core between two snapshots, busiest
    first, labelled ``name tid`` (``main`` for the process's own thread);
    threads that used nothing are left out."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for tid, (name, ticks) in after.items():
        used = ticks - before.get(tid, (name, 0))[1]
        if used > 0:
            label = f"main {tid}" if tid == pid else f"{name} {tid}"
            rows.append((label, used / tick / seconds))
    return sorted(rows, key=lambda r: -r[1])

"""Where ``lite-push group reset-offsets`` moves a group's committed
offsets: the ``--to`` value read (``first``, ``last``, an ISO 8601 time or
epoch milliseconds), the ``--queue`` choice checked against the topic, and
the new offset of each chosen queue."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from .._types import MessageQueue
from ..sources.group_admin import GroupAdmin
from .errors import CliError
from .queues import QueueRange

__all__ = ["EPOCH_MS_FLOOR", "ResetTo", "chosen_ranges", "parse_to", "targets"]

#: The least epoch-milliseconds value ``--to`` takes (1973-03-03): a
#: smaller number is most likely seconds, and is refused as such.
EPOCH_MS_FLOOR = 100_000_000_000


@dataclass(frozen=True, slots=True)
class ResetTo:
    """A ``--to`` value: ``first`` (each queue's first stored offset),
    ``last`` (its end: nothing left to read) or ``time`` (the first message
    stored at or after ``timestamp``, epoch ms)."""

    kind: str
    timestamp: int | None = None
    text: str = ""

    def __str__(self) -> str:
        if self.kind != "time":
            return self.kind
        assert self.timestamp is not None
        when = dt.datetime.fromtimestamp(self.timestamp / 1000, dt.UTC).isoformat(timespec="milliseconds")
        return f"{when.replace('+00:00', 'Z')} ({self.timestamp} ms)"


def parse_to(text: str) -> ResetTo:
    """``--to``'s value; :class:`CliError` naming ``--to`` when it is none
    of ``first``, ``last``, an ISO 8601 time with its zone
    (``2026-11-26T10:00:00Z``, ``...+01:00``) or epoch milliseconds."""
    value = text.strip()
    if value.lower() in ("first", "last"):
        return ResetTo(value.lower(), text=value.lower())
    if value.isdigit():
        ms = int(value)
        if ms < EPOCH_MS_FLOOR:
            raise CliError(
                f"--to: {value} is before 1973 in epoch milliseconds (seconds? then {value}000); "
                "give first, last, epoch milliseconds or an ISO 8601 time such as 2026-11-26T10:00:00Z"
            )
        return ResetTo("time", ms, value)
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise CliError(
            f"--to: expected first, last, an ISO 8601 time such as 2026-11-26T10:00:00Z, or epoch "
            f"milliseconds; got {text!r}"
        ) from None
    if when.tzinfo is None:
        raise CliError(f"--to: {text!r} has no time zone; add one (Z for UTC, or +01:00)")
    return ResetTo("time", round(when.timestamp() * 1000), value)


def chosen_ranges(ranges: Sequence[QueueRange], ids: Sequence[int] | None) -> list[QueueRange]:
    """The ranges of the queues ``--queue`` chose (every queue without it);
    :class:`CliError` naming ``--queue`` for an id the topic does not have."""
    if not ids:
        return list(ranges)
    by_id = {r.queue.queue_id: r for r in ranges}
    missing = sorted({i for i in ids if i not in by_id})
    if missing:
        topic = ranges[0].queue.topic if ranges else "?"
        raise CliError(
            f"--queue: topic {topic!r} has queues 0 to {len(ranges) - 1}; no queue " + ", ".join(map(str, missing))
        )
    return [by_id[i] for i in sorted(set(ids))]


def targets(admin: GroupAdmin, ranges: Sequence[QueueRange], to: ResetTo) -> dict[MessageQueue, int]:
    """The new committed offset of each queue of ``ranges`` (in queue order)."""
    if to.kind == "first":
        return {r.queue: r.first for r in ranges}
    if to.kind == "last":
        return {r.queue: r.end for r in ranges}
    assert to.timestamp is not None
    found = admin.offsets_at([r.queue for r in ranges], to.timestamp)
    return {r.queue: min(max(found[r.queue], r.first), r.end) for r in ranges}

"""``lite-push group describe`` and ``lite-push group reset-offsets``: a
consumer group's position on each queue and its members, and moving its
committed offsets while it is empty (Kafka's ``kafka-consumer-groups
--describe`` / ``--reset-offsets``, RocketMQ's ``consumerProgress`` /
``resetOffsetByTime``).

Both read the group from outside it, through the source's
:class:`~lite_push.sources.group_admin.GroupAdmin`: they join nothing and
commit as no member.  ``describe`` prints, per queue of each topic the group
consumes (or of ``--topic``), the committed offset, the end offset, the lag
(end minus the committed offset, or minus the first stored offset when that
is higher), the owning member and the in-flight count where the source
knows them ("-" where it does not); then the live members, each with the
seconds since its last heartbeat.  ``reset-offsets`` prints its plan (per
queue: committed -> new) and changes nothing without ``--execute``; with
it, it refuses while the group has live members (exit status 1, naming
them), else writes the new offsets.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from .._errors import AdminNotSupportedError, UnknownTopicError
from .._types import MessageQueue
from ..sources.group_admin import GroupAdmin, GroupMember
from .errors import CliError
from .queues import QueueRange, queue_ranges
from .reset_plan import chosen_ranges, parse_to, targets
from .settings import Settings, require, settings_of
from .sources import Broker, open_source, redact, source_errors

__all__ = ["QueueRow", "cmd_group_describe", "cmd_group_reset", "table"]


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue as ``describe`` shows it (``None``: not committed, or not
    known to the source)."""

    range: QueueRange
    committed: int | None
    owners: tuple[str, ...] | None
    in_flight: int | None

    @property
    def lag(self) -> int | None:
        """Messages stored after the committed offset (``None`` when the
        group has not committed the queue)."""
        if self.committed is None:
            return None
        return max(0, self.range.end - max(self.committed, self.range.first))

    def to_dict(self) -> dict[str, object]:
        q = self.range.queue
        return {
            "topic": q.topic,
            "queue": q.queue_id,
            "committed": self.committed,
            "first": self.range.first,
            "end": self.range.end,
            "lag": self.lag,
            "owners": None if self.owners is None else list(self.owners),
            "in_flight": self.in_flight,
        }


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """``rows`` under ``header`` in left-aligned columns ("-" for ``None``)."""
    text = [[str(h) for h in header]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(header))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text]


def _source(args: argparse.Namespace) -> tuple[Settings, str, str]:
    settings = settings_of(args, ("source", "group", "topic"))
    url = require(settings, "source", "--source")
    group = require(settings, "group", "--group").strip()  # require refuses a blank one
    return settings, url, group


def _members(admin: GroupAdmin) -> tuple[list[GroupMember] | None, str | None]:
    """The live members, or ``None`` and why the source cannot tell."""
    try:
        return admin.members(), None
    except AdminNotSupportedError as e:
        return None, str(e)


def _rows(broker: Broker, admin: GroupAdmin, topic: str, owners_known: bool) -> list[QueueRow]:
    ranges = queue_ranges(broker, topic)
    queues = [r.queue for r in ranges]
    committed = admin.committed(queues)
    owners: dict[MessageQueue, tuple[str, ...]] | None = None
    if owners_known:
        owners = admin.owners(queues)
    flight = admin.in_flight(queues)
    return [
        QueueRow(
            r,
            committed.get(r.queue),
            None if owners is None else owners.get(r.queue, ()),
            None if flight is None else flight.get(r.queue, 0),
        )
        for r in ranges
    ]


def _member_line(m: GroupMember, hosts: bool) -> list[object]:
    beat = None if m.last_heartbeat is None else f"{m.last_heartbeat:.1f}s ago"
    line: list[object] = [m.client_id, ",".join(m.topics) or None, beat]
    return line + [m.host] if hosts else line


def cmd_group_describe(args: argparse.Namespace) -> int:
    settings, url, group = _source(args)
    topic = settings.get("topic")
    broker = open_source(url, settings.kafka)
    try:
        with source_errors(url, broker):
            admin = broker.group_admin(group)
            members, unknown = _members(admin)
            topics = [topic] if topic else admin.topics()
            rows: list[QueueRow] = []
            missing: list[str] = []
            for t in topics:
                try:
                    rows += _rows(broker, admin, t, members is not None)
                except UnknownTopicError:
                    if topic:
                        raise
                    missing.append(t)  # a topic the group committed on that is gone
            if not members and not any(r.committed is not None for r in rows):
                where = f"on topic {topic!r}" if topic else "on this source"
                whom = "no members" if members is not None else "the source cannot list its members"
                hint = "" if topic else "; name its topic with --topic if the source cannot list them"
                raise CliError(f"group {group!r} has no committed offsets {where} and {whom}{hint}")
            if args.json:
                doc = {
                    "group": group,
                    "queues": [r.to_dict() for r in rows],
                    "members": None if members is None else [_member_doc(m) for m in members],
                    "members_unknown": unknown,
                    "missing_topics": missing,
                }
                sys.stdout.write(orjson.dumps(doc).decode() + "\n")
                return 0
            _print_description(group, url, rows, members, unknown, missing)
    finally:
        broker.close()
    return 0


def _member_doc(m: GroupMember) -> dict[str, object]:
    return {"client_id": m.client_id, "topics": list(m.topics), "last_heartbeat": m.last_heartbeat, "host": m.host}


def _print_description(
    group: str,
    url: str,
    rows: list[QueueRow],
    members: list[GroupMember] | None,
    unknown: str | None,
    missing: list[str],
) -> None:
    out = [f"group {group!r} on {redact(url)}"]
    body = []
    for r in rows:
        owner = None if r.owners is None else (",".join(r.owners) or "(none)")
        q = r.range.queue
        body.append([q.topic, q.queue_id, r.committed, r.range.end, r.lag, owner, r.in_flight])
    out += table(["TOPIC", "QUEUE", "COMMITTED", "END", "LAG", "OWNER", "IN-FLIGHT"], body)
    out += [f"topic {t!r}: the group has committed offsets on it, but the source has no such topic" for t in missing]
    if members is None:
        out.append(f"members: unknown: {unknown}")
    elif not members:
        out.append("members: none (its offsets can be reset)")
    else:
        out.append(f"members: {len(members)}")
        hosts = any(m.host is not None for m in members)
        header = ["MEMBER", "TOPICS", "LAST-HEARTBEAT"] + (["HOST"] if hosts else [])
        out += table(header, [_member_line(m, hosts) for m in members])
    print("\n".join(out), flush=True)


def cmd_group_reset(args: argparse.Namespace) -> int:
    settings, url, group = _source(args)
    topic = require(settings, "topic", "--topic")
    to = parse_to(args.to)
    broker = open_source(url, settings.kafka)
    try:
        with source_errors(url, broker):
            admin = broker.group_admin(group)
            ranges = chosen_ranges(queue_ranges(broker, topic), args.queue)
            committed = admin.committed([r.queue for r in ranges])
            new = targets(admin, ranges, to)
            if args.execute:
                admin.reset(new)  # refused while the group has live members: nothing printed but the error
            rows = [[r.queue.queue_id, committed.get(r.queue), new[r.queue], r.end] for r in ranges]
            mode = "" if args.execute else " (dry run: nothing changes; --execute applies it)"
            print(f"group {group!r} topic {topic!r}: reset to {to}{mode}", flush=True)
            print("\n".join(table(["QUEUE", "COMMITTED", "NEW", "END"], rows)), flush=True)
            if args.execute:
                print(f"reset: {len(new)} queue(s) of topic {topic!r} committed for group {group!r}", flush=True)
                return 0
            members, _ = _members(admin)
            if members:
                names = ", ".join(m.client_id for m in members)
                print(f"note: the group has live members ({names}): --execute refuses until they stop", flush=True)
    finally:
        broker.close()
    return 0

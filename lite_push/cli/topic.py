"""``lite-push topic create | list | describe``: a source's topics, made and
shown without the Python API.

* ``create`` makes a topic of N queues; for a topic that exists with N
  queues it changes nothing (and says so), with another count it is an
  error naming ``queues`` (a topic's queue count never changes).
* ``list`` prints one line per topic: its queue count and how many messages
  it stores; the topics a consumer subscribes to first, then the retry and
  dead-letter topics of the groups (``%RETRY%<group>``, ``%DLQ%<group>``),
  each marked with its kind and group.
* ``describe`` prints one line per queue (its first stored offset, its end
  offset -- the one its next message gets -- and the count between them),
  then the totals.

A topic the source does not have is a failure of the run, exit status 1,
as it is for ``consume``: the arguments are well formed, the source's
state says no.  Reading commands join no group and change nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import orjson

from .._errors import ConfigError, UnknownTopicError
from ..sources import is_retry_or_dlq_topic
from ..sources._common import validate_topic
from ..sources.contract import DLQ_PREFIX, RETRY_PREFIX
from .errors import CliError
from .queues import QueueRange, queue_ranges
from .settings import require, settings_of
from .sources import Broker, open_source, source_errors, source_place, unknown_topic

__all__ = [
    "TopicRow",
    "bad_topic",
    "cmd_topic_create",
    "cmd_topic_describe",
    "cmd_topic_list",
    "source_and_topic",
    "topic_kind",
]


def source_and_topic(args: argparse.Namespace, *, topic: bool = True, create: bool = False) -> tuple[Broker, str, str]:
    """The broker of ``--source`` (or ``LITE_PUSH_SOURCE``, or the config
    file's ``[source] url``), its URL, and the checked ``--topic`` (or
    ``LITE_PUSH_TOPIC``, or ``[subscription] topic``; ``""`` when ``topic``
    is false).  The topic name is checked before the source is opened;
    ``create``: an ``embedded:`` directory that does not exist is made."""
    settings = settings_of(args, ("source", "topic") if topic else ("source",))
    url = require(settings, "source", "--source")
    name = ""
    if topic:
        name = require(settings, "topic", "--topic")
        try:
            validate_topic(name)
        except ValueError as e:
            raise bad_topic(e) from None
    return open_source(url, settings.kafka, create=create), url, name


def bad_topic(e: ValueError) -> CliError:
    """The one-line error (exit status 2) for a topic name the source refuses."""
    text = str(e)
    return CliError(text if text.startswith("topic") else f"topic: {text}")


def topic_kind(topic: str) -> tuple[str, str | None]:
    """``("topic", None)``, or ``("retry", group)`` / ``("dlq", group)`` for
    a group's retry or dead-letter topic."""
    if is_retry_or_dlq_topic(topic):
        for prefix, kind in ((RETRY_PREFIX, "retry"), (DLQ_PREFIX, "dlq")):
            if topic.startswith(prefix):
                return kind, topic[len(prefix) :]
    return "topic", None


@dataclass(frozen=True, slots=True)
class TopicRow:
    """One line of ``topic list``: a topic, its queue count and how many
    messages its queues store; ``kind`` is ``topic``, ``retry`` or ``dlq``,
    ``group`` the group of a retry or dead-letter topic."""

    topic: str
    queues: int
    messages: int
    kind: str
    group: str | None

    def line(self) -> str:
        """The text line: ``topic=T queues=8 messages=1200`` (``kind=dlq
        group=G`` after it for a group's topic)."""
        text = f"topic={self.topic} queues={self.queues} messages={self.messages}"
        if self.group is not None:
            text += f" kind={self.kind} group={self.group}"
        return text

    def doc(self) -> dict[str, object]:
        """The JSON object of ``topic list --json``."""
        return {
            "topic": self.topic,
            "queues": self.queues,
            "messages": self.messages,
            "kind": self.kind,
            "group": self.group,
        }


def _ranges(broker: Broker, topic: str, url: str) -> list[QueueRange]:
    try:
        return queue_ranges(broker, topic)
    except UnknownTopicError:
        raise unknown_topic(topic, url, broker) from None
    except ValueError as e:  # a name this source cannot have (Kafka's rules)
        raise bad_topic(e) from None


def _stored(ranges: list[QueueRange]) -> int:
    return sum(r.end - r.first for r in ranges)


def cmd_topic_create(args: argparse.Namespace) -> int:
    broker, url, topic = source_and_topic(args, create=True)
    count: int = args.queues
    try:
        with source_errors(url, broker):
            try:
                existing = len(broker.queues(topic))
            except UnknownTopicError:
                existing = 0
            except ValueError as e:  # a name this source cannot have (Kafka's rules)
                raise bad_topic(e) from None
            if existing and existing != count:
                raise CliError(
                    f"queues: topic {topic!r} exists with {existing} queues, not {count} (a topic's queue count "
                    "does not change)"
                )
            try:
                queues = broker.create_topic(topic, count)
            except ConfigError as e:  # a retry or dead-letter topic, or another process's count
                raise CliError(f"queues: {str(e).partition(': ')[2]}") from None
            except ValueError as e:  # a name this source refuses
                raise bad_topic(e) from None
    finally:
        broker.close()
    verb = f"topic {topic} exists" if existing else f"created topic {topic}"
    print(f"{verb} with {len(queues)} queue{'' if len(queues) == 1 else 's'}", flush=True)
    return 0


def cmd_topic_list(args: argparse.Namespace) -> int:
    broker, url, _ = source_and_topic(args, topic=False)
    rows: list[TopicRow] = []
    try:
        with source_errors(url, broker):
            for name in broker.topics():
                try:
                    ranges = queue_ranges(broker, name)
                except UnknownTopicError:  # deleted since it was listed
                    continue
                kind, group = topic_kind(name)
                rows.append(TopicRow(name, len(ranges), _stored(ranges), kind, group))
    finally:
        broker.close()
    rows.sort(key=lambda r: (r.group is not None, r.topic))  # a group's topics after the others
    out = sys.stdout
    for row in rows:
        out.write((orjson.dumps(row.doc()).decode() if args.json else row.line()) + "\n")
    out.flush()
    if not rows:
        print(f"no topics on {source_place(url)} (create one: lite-push topic create)", file=sys.stderr)
    return 0


def cmd_topic_describe(args: argparse.Namespace) -> int:
    broker, url, topic = source_and_topic(args)
    try:
        with source_errors(url, broker):
            ranges = _ranges(broker, topic, url)
    finally:
        broker.close()
    total = _stored(ranges)
    out = sys.stdout
    if args.json:
        queues = [
            {"queue": r.queue.queue_id, "first": r.first, "end": r.end, "messages": r.end - r.first} for r in ranges
        ]
        out.write(orjson.dumps({"topic": topic, "queues": queues, "messages": total}).decode() + "\n")
    else:
        for r in ranges:
            out.write(f"queue={r.queue.queue_id} first={r.first} end={r.end} messages={r.end - r.first}\n")
        out.write(f"topic={topic} queues={len(ranges)} messages={total}\n")
    out.flush()
    return 0

"""A Kafka consumer group, read and changed from outside it
(``lite-push group describe`` / ``reset-offsets``), through Kafka's admin
API: ``ListConsumerGroupOffsets`` (committed offsets),
``DescribeConsumerGroups`` (members and their partitions),
``AlterConsumerGroupOffsets`` (a reset), and ``ListOffsets`` by time
(``offsets_for_times``).

librdkafka's mock cluster, which the tests run against, answers
ListConsumerGroupOffsets, and AlterConsumerGroupOffsets for a group that
never had members; it has no DescribeConsumerGroups (``_UNSUPPORTED_FEATURE``),
refuses AlterConsumerGroupOffsets for a group that had members
(``UNKNOWN_MEMBER_ID``, as a real cluster does for a group with live
members), answers every ListOffsets by time with "none", and lists no
offsets for a group without naming its partitions (so whether it knows a
group, :meth:`KafkaGroupAdmin.known`, is asked partition by partition).  What the cluster does
not do raises :class:`~lite_push.AdminNotSupportedError` naming Kafka's own
tool, ``kafka-consumer-groups.sh``; on a real cluster every call is the
real one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ..._errors import AdminNotSupportedError, GroupActiveError
from ..._types import MessageQueue
from ..group_admin import GroupAdmin, GroupMember
from .client_log import LIBRDKAFKA_LOG
from .codec import kafka_topic, lite_topic
from .offset_reader import OffsetReader

__all__ = ["REQUEST_TIMEOUT", "KafkaGroupAdmin"]

#: Seconds one admin request may take, broker lookup included.
REQUEST_TIMEOUT = 15.0

_TOOL = "kafka-consumer-groups.sh --bootstrap-server {servers} --group {group}"


class KafkaGroupAdmin(GroupAdmin):
    """Group ``group`` of the cluster at ``servers``: ``admin_settings``
    make its admin client, ``reader`` reads partitions by offset and makes
    the client of ``offsets_for_times``, ``broker_name`` names its queues."""

    def __init__(
        self,
        group: str,
        servers: str,
        admin_settings: Mapping[str, Any],
        reader: OffsetReader,
        check_open: Callable[[], None],
    ) -> None:
        super().__init__(group)
        self._servers = servers
        self._admin = AdminClient({**admin_settings, "logger": LIBRDKAFKA_LOG})  # type: ignore[dict-item]
        self._reader = reader
        self._check_open = check_open

    def _tool(self, args: str) -> str:
        return _TOOL.format(servers=self._servers, group=self.group) + " " + args

    # -- reading -------------------------------------------------------------------

    def _description(self) -> Any:
        """The group's ``ConsumerGroupDescription``."""
        self._check_open()
        future = self._admin.describe_consumer_groups([self.group], request_timeout=REQUEST_TIMEOUT)[self.group]
        try:
            return future.result()
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._UNSUPPORTED_FEATURE:
                raise AdminNotSupportedError(
                    f"the cluster does not describe consumer groups (DescribeConsumerGroups: {err.str()}); "
                    f"see them with {self._tool('--describe --members')}"
                ) from None
            raise

    def members(self) -> list[GroupMember]:
        out = []
        for m in self._description().members:
            tps = m.assignment.topic_partitions if m.assignment is not None else []
            topics = tuple(sorted({lite_topic(tp.topic) for tp in tps}))
            out.append(GroupMember(m.member_id, topics, None, m.host))
        return sorted(out, key=lambda m: m.client_id)

    def owners(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[str, ...]]:
        wanted = {(kafka_topic(q.topic), q.queue_id): q for q in queues}
        out: dict[MessageQueue, tuple[str, ...]] = {}
        for m in self._description().members:
            for tp in m.assignment.topic_partitions if m.assignment is not None else []:
                q = wanted.get((tp.topic, tp.partition))
                if q is not None:
                    out[q] = (*out.get(q, ()), m.member_id)
        return out

    def _offsets(self, partitions: list[TopicPartition] | None) -> list[TopicPartition]:
        self._check_open()
        request = ConsumerGroupTopicPartitions(self.group, partitions)
        futures = self._admin.list_consumer_group_offsets([request], request_timeout=REQUEST_TIMEOUT)
        result: Any = futures[self.group].result()
        return list(result.topic_partitions or [])

    def topics(self) -> list[str]:
        names = {lite_topic(tp.topic) for tp in self._offsets(None) if tp.offset is not None and tp.offset >= 0}
        try:
            for m in self.members():
                names.update(m.topics)
        except AdminNotSupportedError:
            pass
        return sorted(names)

    def known(self) -> bool:
        """Committed offsets listed for the group, or members.  A cluster
        that describes no group and lists no offsets without partitions
        (librdkafka's mock cluster) is asked for the group's committed
        offsets on every partition of its topics instead."""
        if any(tp.offset is not None and tp.offset >= 0 for tp in self._offsets(None)):
            return True
        try:
            return bool(self.members())
        except AdminNotSupportedError:
            pass
        except KafkaException as e:  # a cluster of the consumer protocol (KIP-848) may say so
            err = e.args[0] if e.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return False
            raise
        topics = self._admin.list_topics(timeout=REQUEST_TIMEOUT).topics
        tps = [TopicPartition(name, p) for name, t in topics.items() if not name.startswith("__") for p in t.partitions]
        found = self._offsets(tps) if tps else []
        return any(tp.error is None and tp.offset is not None and tp.offset >= 0 for tp in found)

    def committed(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        if not queues:
            return {}
        by_name = {(kafka_topic(q.topic), q.queue_id): q for q in queues}
        out = {}
        for tp in self._offsets([TopicPartition(name, p) for name, p in by_name]):
            q = by_name.get((tp.topic, tp.partition))
            if q is not None and tp.error is None and tp.offset is not None and tp.offset >= 0:
                out[q] = int(tp.offset)
        return out

    def offsets_at(self, queues: Sequence[MessageQueue], timestamp: int) -> dict[MessageQueue, int]:
        """``offsets_for_times``; a partition it says has nothing at or after
        ``timestamp`` is checked against its last record, so a cluster that
        cannot search by time (librdkafka's mock) is refused, not believed."""
        self._check_open()
        c = self._reader.client()
        try:
            asked = [TopicPartition(kafka_topic(q.topic), q.queue_id, timestamp) for q in queues]
            found = c.offsets_for_times(asked, timeout=REQUEST_TIMEOUT)
            out = {}
            for q, tp in zip(queues, found, strict=True):
                if tp.error is not None:
                    raise KafkaException(tp.error)
                if tp.offset is not None and tp.offset >= 0:
                    out[q] = int(tp.offset)
                    continue
                lo, hi = OffsetReader.marks(c, kafka_topic(q.topic), q.queue_id)
                last = self._reader.messages(q, hi - 1, hi) if hi > lo else []
                if last and last[-1].store_timestamp >= timestamp:
                    raise AdminNotSupportedError(
                        f"the cluster finds no offset of {q.topic}-{q.queue_id} at or after {timestamp} ms, though its "
                        f"last record is at {last[-1].store_timestamp} ms: it cannot search by time (ListOffsets); "
                        f"use {self._tool(f'--topic {kafka_topic(q.topic)} --reset-offsets --to-datetime ...')}"
                    )
                out[q] = hi
            return out
        finally:
            c.close()

    # -- changing ------------------------------------------------------------------

    def reset(self, offsets: Mapping[MessageQueue, int]) -> None:
        """``AlterConsumerGroupOffsets``, after DescribeConsumerGroups found
        no member (where the cluster answers it; where it does not, the
        cluster itself refuses a group with live members)."""
        if not offsets:
            return
        try:
            live = self.members()
        except AdminNotSupportedError:
            live = []
        if live:
            raise GroupActiveError(self.group, [m.client_id for m in live])
        self._check_open()
        tps = [TopicPartition(kafka_topic(q.topic), q.queue_id, int(off)) for q, off in offsets.items()]
        request = ConsumerGroupTopicPartitions(self.group, tps)
        future = self._admin.alter_consumer_group_offsets([request], request_timeout=REQUEST_TIMEOUT)[self.group]
        errors: list[KafkaError] = []
        try:
            result: Any = future.result()
            errors = [tp.error for tp in result.topic_partitions or [] if tp.error is not None]
        except KafkaException as e:
            if not (e.args and isinstance(e.args[0], KafkaError)):
                raise
            errors = [e.args[0]]
        if errors:
            err = errors[0]
            topics = " ".join(sorted({f"--topic {name}" for name in (tp.topic for tp in tps)}))
            raise AdminNotSupportedError(
                f"group {self.group!r}: the cluster refused to set its offsets from outside the group "
                f"({err.name()}: {err.str()}; a real cluster does while a member is live, librdkafka's mock "
                f"cluster for any group that ever had members); use "
                + self._tool(f"{topics} --reset-offsets --to-earliest|--to-latest|--to-datetime ... --execute")
            )

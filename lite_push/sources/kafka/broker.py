"""KafkaBroker: one Kafka cluster as lite_push sees it.

It holds what a cluster's members share: the librdkafka settings, the
producer (sending, retry and dead-letter copies), topic creation and
metadata, and reading by offset for tools (``lite_push.dlq``).  It wires
the parts: the topic catalog (:mod:`.topics`), the sender
(:mod:`.producer`), the copies (:mod:`.copies`), the offset reader
(:mod:`.offset_reader`) and the record format (:mod:`.codec`).  A consumer group member, a
:class:`~.consumer.KafkaPullConsumer` made by :meth:`KafkaBroker.pull_consumer`,
keeps the parts it uses, not the broker.

Settings: ``config`` holds librdkafka properties (``security.protocol``,
``sasl.*``, ``fetch.max.bytes`` ...) given to every client the broker makes;
``consumer_config`` / ``producer_config`` only to consumers / the producer.
Properties lite_push itself decides are refused with a ``ConfigError``
naming them (:data:`RESERVED`).  Unknown properties are refused at
construction (librdkafka checks them).

Topics: a broker with the admin API creates topics with ``CreateTopics``;
``topic_creator`` replaces that (librdkafka's mock cluster has no admin
API: pass its ``create_topic``).  Retry and dead-letter topics are created
with one partition on first use (see :mod:`.codec` for their Kafka names).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from ..._errors import ConfigError, SourceClosedError, UnknownTopicError
from ..._tracing import check_tracing, send_context
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, SendResult
from .._common import check_delay_levels
from .._sending import checked_items
from ..contract import DEFAULT_DELAY_LEVELS, Balance, ConsumeFrom, ConsumeFromWhere
from .client_log import LIBRDKAFKA_LOG
from .codec import Record, RecordFormat, kafka_topic, key_decoder
from .consumer import KafkaPullConsumer
from .copies import Copies
from .group_admin import KafkaGroupAdmin
from .offset_reader import OffsetReader
from .producer import Sender
from .settings import RESERVED, checked_settings
from .topics import TopicCatalog

__all__ = ["RESERVED", "KafkaBroker", "Record"]

logger = logging.getLogger(__name__)


class KafkaBroker:
    """A Kafka cluster: its bootstrap servers and shared settings.

    ``tracing``: what is sent carries the sender's OpenTelemetry context
    in its headers (``lite-push[tracing]``), for the consumer's spans to
    continue its trace."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        config: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        session_timeout: float = 45.0,
        delay_levels: Iterable[float] = DEFAULT_DELAY_LEVELS,
        metadata_max_bytes: int = 4096,
        tags_header: str = "tags",
        key_encoding: str = "utf-8",
        topic_creator: Callable[[str, int], None] | None = None,
        broker_name: str = "kafka",
        max_message_size: int = 1_000_000,
        send_timeout: float = 30.0,
        tracing: bool = False,
    ) -> None:
        #: Whether what is sent carries the sender's OpenTelemetry context.
        self.tracing = check_tracing(tracing)
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers", f"must be 'host:port[,host:port]', got {bootstrap_servers!r}")
        if (
            isinstance(session_timeout, bool)
            or not isinstance(session_timeout, (int, float))
            or not (1.0 <= session_timeout <= 3600.0)
        ):
            raise ConfigError("session_timeout", f"must be seconds in [1, 3600], got {session_timeout!r}")
        if type(metadata_max_bytes) is not int or metadata_max_bytes < 64:
            raise ConfigError("metadata_max_bytes", f"must be an int >= 64, got {metadata_max_bytes!r}")
        if not isinstance(tags_header, str) or not tags_header:
            raise ConfigError("tags_header", f"must be a non-empty string, got {tags_header!r}")
        try:
            self.decode_key = key_decoder(key_encoding)
        except (LookupError, TypeError):
            raise ConfigError("key_encoding", f"must be 'hex' or a Python codec name, got {key_encoding!r}") from None
        if topic_creator is not None and not callable(topic_creator):
            raise ConfigError("topic_creator", f"must be callable, got {topic_creator!r}")
        self.bootstrap_servers = bootstrap_servers.strip()
        self.session_timeout = float(session_timeout)
        self.delay_levels = check_delay_levels(delay_levels)
        self.metadata_max_bytes = metadata_max_bytes
        self.tags_header = tags_header
        self.key_encoding = key_encoding
        self.broker_name = broker_name
        self.max_message_size = max_message_size
        self.send_timeout = send_timeout
        self._common = checked_settings("config", config)
        self._consumer_only = checked_settings("consumer_config", consumer_config)
        producer_settings = {
            "bootstrap.servers": self.bootstrap_servers,
            "partitioner": "murmur2_random",  # the Java producer's choice of partition for a key
            "linger.ms": "2",
            "reconnect.backoff.ms": "10",  # a first connection is held back half of it (default 100)
            **self._common,
            **checked_settings("producer_config", producer_config),
            "logger": LIBRDKAFKA_LOG,
        }
        try:
            producer = Producer(producer_settings)
        except KafkaException as e:
            raise ConfigError("config", str(e.args[0].str() if e.args else e)) from None
        self._closed = False
        #: How records read as messages, and copies' headers are written.
        self.format = RecordFormat(self.decode_key, tags_header, broker_name, key_encoding)
        #: The producer: records produced and waited for together.
        self.sender = Sender(producer, send_timeout, self.check_open)
        #: Partition counts and topic creation.
        admin = {"bootstrap.servers": self.bootstrap_servers, **self._common}
        self.catalog = TopicCatalog(producer, admin, topic_creator, broker_name, self.check_open)
        #: Retry and dead-letter copies, malformed records' dead letters.
        self.copies = Copies(self.sender, self.catalog, self.format, self.delay_levels, max_message_size)
        #: Reading by offset without a group (tools, a member's dead letters).
        self.reader = OffsetReader(self.client_settings, self.catalog, self.format, self.check_open)

    def __repr__(self) -> str:
        return f"<KafkaBroker {self.bootstrap_servers}{' closed' if self._closed else ''}>"

    # -- clients -----------------------------------------------------------------

    def client_settings(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The settings of a new consumer client: the bootstrap servers, the
        common and consumer settings, then ``extra``."""
        return {"bootstrap.servers": self.bootstrap_servers, **self._common, **self._consumer_only, **(extra or {})}

    def pull_consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFrom = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        balance: Balance = Balance.QUEUE,
    ) -> KafkaPullConsumer:
        """A new member of consumer group ``group`` (it joins at subscribe).
        ``balance``: only ``Balance.QUEUE`` (one partition, one member);
        ``Balance.MESSAGE`` is a ``ConfigError`` (Kafka's share groups give
        up key order)."""
        return KafkaPullConsumer(
            self,
            group,
            consume_from=consume_from,
            consume_timestamp=consume_timestamp,
            client_id=client_id,
            balance=balance,
        )

    def check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"{self!r} is closed")

    # -- topics ------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int) -> list[MessageQueue]:
        """Create ``topic`` (its lite_push name) with ``partitions``
        partitions and return its queues.  Idempotent when the topic exists
        with that count; ``ConfigError`` naming ``partitions`` when it exists
        with another (it is left as it is); ``LitePushError`` naming Kafka's
        ``kafka-topics.sh`` when the cluster does not support creating topics
        through the admin API."""
        return self.catalog.create_topic(topic, partitions)

    def topics(self) -> list[str]:
        """The lite_push names of the cluster's topics, sorted: retry and
        dead-letter topics as ``%RETRY%<group>`` / ``%DLQ%<group>``; Kafka's
        internal topics (``__consumer_offsets``, ...) left out."""
        return self.catalog.names()

    def ensure_topic(self, topic: str, partitions: int = 1) -> None:
        """Create ``topic`` unless it exists (retry and dead-letter topics)."""
        self.catalog.ensure_topic(topic, partitions)

    def partition_count(self, topic: str, *, fresh: bool = False, client: Any = None) -> int | None:
        """How many partitions ``topic`` (lite_push name) has, or None when
        it does not exist (see :meth:`TopicCatalog.partition_count`)."""
        return self.catalog.partition_count(topic, fresh=fresh, client=client)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted; ``UnknownTopicError`` if none."""
        return self.catalog.queues(topic)

    def watermarks(self, queue: MessageQueue) -> tuple[int, int]:
        """``(low, high)``: the first stored offset and the next one (through
        one reading client the broker keeps until it closes, so a tool that
        asks for every partition makes one client, not one per partition)."""
        self.check_open()
        return self.reader.marks(self.reader.shared_client(), kafka_topic(queue.topic), queue.queue_id)

    # -- sending -----------------------------------------------------------------

    def produce(self, records: list[Record]) -> list[BaseException | None]:
        """Produce ``records`` and wait for all of them (one flush);
        ``None`` per stored record, else why not."""
        return self.sender.produce(records)

    def deliver(self, records: list[Record]) -> list[tuple[BaseException | None, int, int]]:
        """Produce ``records``, wait for all of them (one flush), and say
        per record ``(error or None, partition, offset)``."""
        return self.sender.deliver(records)

    def send(
        self,
        topic: str,
        body: bytes,
        keys: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
    ) -> SendResult:
        """Store one message (``queue_id``: its partition, else Kafka's
        partitioner on the key); return where."""
        item = {"body": body, "keys": keys, "tags": tags, "properties": properties or {}, "queue_id": queue_id}
        return self.send_batch(topic, [item])[0]

    def send_batch(self, topic: str, items: Iterable[Any]) -> list[SendResult]:
        """Store many messages; each item is ``body``, ``(body, keys)`` or a
        mapping (``body``, ``keys``, ``tags``, ``properties``, ``queue_id``).
        Every item is checked first (a bad one stores nothing).  Results in
        input order; raises the first delivery error."""
        n = self.partition_count(topic)
        if n is None:
            raise UnknownTopicError(topic)
        name = kafka_topic(topic)
        records: list[Record] = []
        trace = send_context() if self.tracing else None
        for body, keys, tags, props, qid in checked_items(items, topic, n, self.max_message_size, None, trace):
            key = None if keys is None else keys.encode("utf-8")
            records.append((name, qid, key, body, self.format.headers(tags, props)))
        results = []
        for err, partition, offset in self.deliver(records):
            if err is not None:
                raise err
            mq = MessageQueue(topic, self.broker_name, partition)
            results.append(SendResult(mq, offset, f"{name}-{partition}-{offset}"))
        return results

    # -- reading without a group (tools) -------------------------------------------

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` at offsets ``[start, stop)``,
        read without joining a group (tools; malformed records are left
        out; see :class:`~.offset_reader.OffsetReader`)."""
        return self.reader.messages(queue, start, stop)

    def committed(self, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
        """``group``'s committed position of ``queue`` (tools, tests), read
        without joining the group."""
        self.check_open()
        c = Consumer(self.client_settings({"group.id": group, "enable.auto.commit": "false", "logger": LIBRDKAFKA_LOG}))
        try:
            (tp,) = c.committed([TopicPartition(kafka_topic(queue.topic), queue.queue_id)], timeout=10.0)
        finally:
            c.close()
        if tp.offset is None or tp.offset < 0:
            return None
        return OffsetAndMetadata(tp.offset, tp.metadata or "")

    def group_admin(self, group: str) -> KafkaGroupAdmin:
        """Consumer group ``group`` read and changed from outside it, through
        the admin API (:class:`~lite_push.sources.group_admin.GroupAdmin`;
        what the cluster cannot do raises
        :class:`~lite_push.AdminNotSupportedError`)."""
        self.check_open()
        admin = {"bootstrap.servers": self.bootstrap_servers, **self._common}
        return KafkaGroupAdmin(group, self.bootstrap_servers, admin, self.reader, self.check_open)

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Deliver what the producer holds (up to ``send_timeout``) and stop."""
        if self._closed:
            return
        self._closed = True
        self.reader.close()
        left = self.sender.close()
        if left:
            logger.warning("%r: %d message(s) not delivered at close", self, left)

"""The Kafka source: consumer groups on a Kafka cluster, through confluent-kafka.

Needs the ``kafka`` extra (``pip install 'lite-push[kafka]'``).  One concern
per module:

* :mod:`.broker`        ``KafkaBroker``: settings, sending, reading by
  offset for tools, and the wiring of the parts below;
* :mod:`.settings`      librdkafka settings: reserved, checked, a member's;
* :mod:`.topics`        partition counts and topic creation;
* :mod:`.producer`      the producer: records produced with one flush;
* :mod:`.consumer`      ``KafkaPullConsumer``: a group member (cooperative-
  sticky rebalance, per-partition pause), built with the parts it uses,
  never the broker;
* :mod:`.partitions`    the rebalance callbacks and the owned partitions;
* :mod:`.reading`       per-partition files of fetched records, batches,
  start positions;
* :mod:`.commits`       commits: the offset map within the metadata limit,
  the coordinator's refusals;
* :mod:`.ownership`     fencing: how long ownership is certain;
* :mod:`.copies`        retry and dead-letter copies, malformed records;
* :mod:`.codec`         records as messages, and lite_push topic names as
  Kafka names (retry and dead-letter topics);
* :mod:`.client_log`    librdkafka's log lines, without repeats;
* :mod:`.group_admin`   a group read and reset from outside it through the
  admin API (``lite-push group``);
* :mod:`.mock_cluster`  librdkafka's mock cluster: a local Kafka to try
  lite_push on (``python -m lite_push.sources.kafka.mock_cluster``), and
  in a helper process for tests, benchmarks and demos;
* :mod:`.mock_server`   the process that hosts it (librdkafka through
  ``ctypes``).

Partitions are the queues (``MessageQueue(topic, broker_name, partition)``);
the ordering key is the record key; the offset map rides in the commit
metadata, within Kafka's default ``offset.metadata.max.bytes`` of 4,096.
"""

from __future__ import annotations

from .broker import KafkaBroker
from .consumer import KafkaPullConsumer

__all__ = ["KafkaBroker", "KafkaPullConsumer"]

"""The compiled kernels and their pure-Python twins.

Each ``<name>.py`` selects ``<name>_c`` (built from ``_ext/<name>_c.pyx``)
when it is built, else ``<name>_py``; ``LITE_PUSH_NO_EXTENSIONS`` forces the
twins.  The router (:mod:`.router`), the offset tracker (:mod:`.offsets`),
the lanes' distribution recorder (:mod:`.lanemetrics`), the release of
finished offsets (:mod:`.untrack`), and the Kafka and Redis decoders
(:mod:`.kafka_decode`, :mod:`.redis_decode`); ``kafka_fetch_c`` has no
twin (:mod:`lite_push.sources.kafka.fetch_client` falls back to
confluent-kafka's consumer).
"""

"""Where librdkafka is: the shared library inside the installed
confluent-kafka wheel (``confluent_kafka.libs/librdkafka-*.so*``), which the
mock cluster loads with ``ctypes`` and the compiled fetch client
(``lite_push._kernels.kafka_fetch_c``) with ``dlopen``: the copy confluent-kafka
itself runs on."""

from __future__ import annotations

import glob
import os

__all__ = ["librdkafka_path"]


def librdkafka_path() -> str:
    """The path of the wheel's librdkafka; ``FileNotFoundError`` when the
    installed confluent-kafka ships none."""
    import confluent_kafka

    base = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    found = sorted(glob.glob(os.path.join(os.path.dirname(base), "confluent_kafka.libs", "librdkafka*.so*")))
    if not found:
        raise FileNotFoundError(f"no librdkafka shared library beside {base} (a confluent-kafka wheel ships one)")
    return found[0]

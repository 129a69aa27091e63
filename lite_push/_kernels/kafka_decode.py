"""Selects :func:`decode_plain`: the compiled twin when built (a Kafka record
without headers becomes its message in one C pass), else the pure-Python
one.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python; ``DECODE_IMPL``
tells.  What it is: ``_kernels.kafka_decode_py``."""

from __future__ import annotations

from .router import NO_EXTENSIONS

__all__ = ["DECODE_IMPL", "decode_plain"]

if NO_EXTENSIONS:
    from .kafka_decode_py import decode_plain

    DECODE_IMPL = "python"
else:
    try:
        from .kafka_decode_c import decode_plain  # type: ignore[no-redef,import-not-found]

        DECODE_IMPL = "cython"
    except ImportError:
        from .kafka_decode_py import decode_plain

        DECODE_IMPL = "python"

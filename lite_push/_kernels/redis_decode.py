"""Selects :func:`decode_plain` for Redis stream entries: the compiled twin
when built (a run of plain entries becomes its messages in one C pass),
else the pure-Python one.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python;
``REDIS_DECODE_IMPL`` tells.  What it is: ``_kernels.redis_decode_py``."""

from __future__ import annotations

from .router import NO_EXTENSIONS

__all__ = ["REDIS_DECODE_IMPL", "decode_plain"]

if NO_EXTENSIONS:
    from .redis_decode_py import decode_plain

    REDIS_DECODE_IMPL = "python"
else:
    try:
        from .redis_decode_c import decode_plain  # type: ignore[no-redef,import-not-found]

        REDIS_DECODE_IMPL = "cython"
    except ImportError:
        from .redis_decode_py import decode_plain

        REDIS_DECODE_IMPL = "python"

"""Selects the offset tracker: compiled twin when built, else pure Python.
``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python; ``OFFSETS_IMPL`` tells."""

from __future__ import annotations

from ._router import NO_EXTENSIONS

__all__ = ["OFFSETS_IMPL", "OffsetTracker"]

if NO_EXTENSIONS:
    from ._offsets_py import OffsetTracker

    OFFSETS_IMPL = "python"
else:
    try:
        from ._offsets_c import OffsetTracker  # type: ignore[no-redef,import-not-found]

        OFFSETS_IMPL = "cython"
    except ImportError:
        from ._offsets_py import OffsetTracker

        OFFSETS_IMPL = "python"

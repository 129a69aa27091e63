"""Selects the lanes' distribution recorder: the compiled twin when built,
else pure Python.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python;
``LANE_METRICS_IMPL`` tells."""

from __future__ import annotations

from .router import NO_EXTENSIONS

__all__ = ["LANE_METRICS_IMPL", "LaneMetrics", "clock"]

if NO_EXTENSIONS:
    from .lanemetrics_py import LaneMetrics, clock

    LANE_METRICS_IMPL = "python"
else:
    try:
        from .lanemetrics_c import LaneMetrics, clock  # type: ignore[no-redef,import-not-found]

        LANE_METRICS_IMPL = "cython"
    except ImportError:
        from .lanemetrics_py import LaneMetrics, clock

        LANE_METRICS_IMPL = "python"

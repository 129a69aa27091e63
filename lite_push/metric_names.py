"""Every Prometheus metric lite_push exports, under its first name:
everything :mod:`lite_push.metrics.names` exports."""

from .metrics.names import *  # noqa: F403
from .metrics.names import __all__ as __all__

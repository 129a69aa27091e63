"""Selects the fetcher's client: the compiled twin when built (librdkafka's
C API directly: a record becomes its message in one C pass, no
confluent-kafka ``Message`` between), else the pure-Python one on
confluent-kafka's ``Consumer``.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure
Python; ``FETCH_IMPL`` tells.  What it is: ``fetch_client_py``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from ..._kernels.router import NO_EXTENSIONS
from .client_log import LogSink
from .codec import ReadRecord
from .fetch_client_py import FetchClient as PyFetchClient
from .library import librdkafka_path
from .reading import decode_rest

__all__ = ["FETCH_IMPL", "new_fetch_client"]

#: Makes a fetch client: ``(settings, logger) -> client``.
new_fetch_client: Callable[[Mapping[str, str], LogSink], Any]

if NO_EXTENSIONS:
    new_fetch_client = PyFetchClient
    FETCH_IMPL = "python"
else:
    try:
        from ..._kernels.kafka_fetch_c import FetchClient as _CFetchClient  # type: ignore[import-not-found]

        new_fetch_client = functools.partial(
            _CFetchClient, library=librdkafka_path(), record_type=ReadRecord, slow=decode_rest
        )
        FETCH_IMPL = "cython"
    except (ImportError, FileNotFoundError):
        new_fetch_client = PyFetchClient
        FETCH_IMPL = "python"

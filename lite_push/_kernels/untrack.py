"""Selects :func:`untrack_all`: the compiled twin when built (it takes a
batch of messages out of the cyclic garbage collector's lists), else the
pure-Python one (leaves them tracked).  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure
Python; ``UNTRACK_IMPL`` tells.  Why: ``_kernels.untrack_py``."""

from __future__ import annotations

from .router import NO_EXTENSIONS

__all__ = ["UNTRACK_IMPL", "untrack_all"]

if NO_EXTENSIONS:
    from .untrack_py import untrack_all

    UNTRACK_IMPL = "python"
else:
    try:
        from .untrack_c import untrack_all  # type: ignore[no-redef,import-not-found]

        UNTRACK_IMPL = "cython"
    except ImportError:
        from .untrack_py import untrack_all

        UNTRACK_IMPL = "python"

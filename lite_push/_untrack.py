"""Selects :func:`untracked`: the compiled twin when built (it takes a
message out of the cyclic garbage collector's lists), else the pure-Python
one (returns it unchanged).  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure
Python; ``UNTRACK_IMPL`` tells.  Why: ``_untrack_py``."""

from __future__ import annotations

from ._router import NO_EXTENSIONS

__all__ = ["UNTRACK_IMPL", "untracked"]

if NO_EXTENSIONS:
    from ._untrack_py import untracked

    UNTRACK_IMPL = "python"
else:
    try:
        from ._untrack_c import untracked  # type: ignore[no-redef,import-not-found]

        UNTRACK_IMPL = "cython"
    except ImportError:
        from ._untrack_py import untracked

        UNTRACK_IMPL = "python"

"""Selects the router: the compiled twin when it is built, else the
pure-Python one.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python.

``ROUTER_IMPL`` says which one is in use (``"cython"`` or ``"python"``).
The design -- Java's hash for the producer's queue choice, and
:class:`KeyRouter`'s placement of keys on lanes -- is described in
``_kernels/router_py.py``.
"""

from __future__ import annotations

import os

from .router_py import PLACEMENTS

__all__ = ["PLACEMENTS", "ROUTER_IMPL", "KeyRouter", "java_hash", "lane_of", "mixed_hash"]

NO_EXTENSIONS: bool = bool(os.environ.get("LITE_PUSH_NO_EXTENSIONS"))

if NO_EXTENSIONS:
    from .router_py import KeyRouter, java_hash, lane_of, mixed_hash

    ROUTER_IMPL = "python"
else:
    try:
        from .router_c import KeyRouter, java_hash, lane_of, mixed_hash  # type: ignore[import-not-found,no-redef]

        ROUTER_IMPL = "cython"
    except ImportError:
        from .router_py import KeyRouter, java_hash, lane_of, mixed_hash

        ROUTER_IMPL = "python"

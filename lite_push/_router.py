"""Selects the router: the compiled twin when it is built, else the
pure-Python one.  ``LITE_PUSH_NO_EXTENSIONS=1`` forces pure Python.

``ROUTER_IMPL`` says which one is in use (``"cython"`` or ``"python"``).
The design -- Java's hash for the producer's queue choice, and
:class:`KeyRouter`'s placement of keys on lanes -- is described in
``_router_py.py``.
"""

from __future__ import annotations

import os

from . import _router_py

__all__ = ["PLACEMENTS", "ROUTER_IMPL", "KeyRouter", "java_hash", "lane_of", "mixed_hash"]

NO_EXTENSIONS: bool = bool(os.environ.get("LITE_PUSH_NO_EXTENSIONS"))

if NO_EXTENSIONS:
    _impl = _router_py
    ROUTER_IMPL = "python"
else:
    try:
        from . import _router_c as _impl  # type: ignore[attr-defined,no-redef]

        ROUTER_IMPL = "cython"
    except ImportError:
        _impl = _router_py
        ROUTER_IMPL = "python"

java_hash = _impl.java_hash
lane_of = _impl.lane_of
mixed_hash = _impl.mixed_hash
KeyRouter: type[_router_py.KeyRouter] = _impl.KeyRouter
PLACEMENTS = _router_py.PLACEMENTS

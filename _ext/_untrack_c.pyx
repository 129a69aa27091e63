# cython: language_level=3
"""Compiled twin of ``lite_push._untrack_py``: :func:`untracked` takes a
message out of the cyclic garbage collector's lists."""

cdef extern from "Python.h":
    int PyObject_GC_IsTracked(object)
    void PyObject_GC_UnTrack(void*)


def untracked(obj):
    """``obj``, no longer tracked by the cyclic garbage collector (a no-op
    for an object that is not tracked).  Only for objects that cannot be
    part of a reference cycle: a message's fields are strings, numbers,
    bytes and a dict of strings.  Freed by its reference count as before."""
    if PyObject_GC_IsTracked(obj):
        PyObject_GC_UnTrack(<void*>obj)
    return obj

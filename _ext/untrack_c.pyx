# cython: language_level=3
"""Compiled twin of ``lite_push._kernels.untrack_py``: :func:`untrack_all` takes a
batch of messages out of the cyclic garbage collector's lists."""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject

cdef extern from "Python.h":
    int PyObject_GC_IsTracked(object)
    void PyObject_GC_UnTrack(void*)


def untrack_all(list objs):
    """Leave every object of ``objs`` untracked by the cyclic garbage
    collector (one that is not tracked is left as it is), in one pass.  Only
    for objects that cannot be part of a reference cycle: a message's fields
    are strings, numbers, bytes and a dict of strings.  Each is freed by its
    reference count as before."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(objs)
    cdef PyObject* o
    for i in range(n):
        o = PyList_GET_ITEM(objs, i)
        if PyObject_GC_IsTracked(<object>o):
            PyObject_GC_UnTrack(<void*>o)

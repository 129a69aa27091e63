# cython: language_level=3, embedsignature=True
"""Compiled twin of ``lite_push._kernels.redis_decode_py``: :func:`decode_plain`
turns a run of plain Redis stream entries into their messages in one C pass.

Each message is built without the dataclass ``__init__``: a new instance of
:class:`MessageExt` gets each of its slots written at the offset its member
descriptor gives (``_slots.h``), and is left untracked by the cyclic garbage
collector as the sources leave every batch (``lite_push._kernels.untrack_py`` says
why).  The offsets are read, and the fields checked, at import: a
:class:`MessageExt` with other fields fails the import, and the selector
(``lite_push._kernels.redis_decode``) says so.  The metadata is parsed by orjson, as
the Python twin does.
"""

import dataclasses

import orjson

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject

from lite_push._types import MessageExt

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)
    object PyUnicode_FromFormat(const char*, ...)

cdef extern from "_slots.h":
    Py_ssize_t _slot_offset "lite_push_slot_offset"(PyObject*)
    object _alloc "lite_push_alloc"(PyTypeObject*)
    void _put "lite_push_slot_put"(object, Py_ssize_t, object)

__all__ = ["FIELDS", "decode_plain"]

#: :class:`MessageExt`'s fields, in the order this module writes them.
FIELDS = (
    "topic", "queue_id", "queue_offset", "body", "keys", "tags", "properties", "born_timestamp",
    "store_timestamp", "reconsume_times", "msg_id", "broker_name",
)

cdef PyTypeObject* _cls = <PyTypeObject*>MessageExt
cdef Py_ssize_t _topic, _queue_id, _queue_offset, _body, _keys, _tags, _properties
cdef Py_ssize_t _born, _store, _times, _msg_id, _broker
cdef object _loads = orjson.loads
cdef object _json_error = orjson.JSONDecodeError


cdef Py_ssize_t _offset(str name) except -1:
    descr = MessageExt.__dict__.get(name)
    off = _slot_offset(<PyObject*>descr)
    if off < 0:
        raise ImportError(f"lite_push._kernels.redis_decode_c: MessageExt.{name} is not a __slots__ member")
    return off


if tuple(f.name for f in dataclasses.fields(MessageExt)) != FIELDS:
    raise ImportError(f"lite_push._kernels.redis_decode_c: MessageExt's fields are not {FIELDS}")
_topic, _queue_id, _queue_offset, _body = _offset("topic"), _offset("queue_id"), _offset("queue_offset"), _offset("body")
_keys, _tags, _properties = _offset("keys"), _offset("tags"), _offset("properties")
_born, _store, _times = _offset("born_timestamp"), _offset("store_timestamp"), _offset("reconsume_times")
_msg_id, _broker = _offset("msg_id"), _offset("broker_name")


cdef inline bint _is(object o, const char* c):
    """Whether ``o`` is the one-byte bytes ``c``."""
    return type(o) is bytes and PyBytes_GET_SIZE(o) == 1 and PyBytes_AS_STRING(o)[0] == c[0]


def decode_plain(str namespace, str topic, int qid, str prefix, entries, long long first):
    """The messages of ``entries``, a read of queue ``qid`` of ``topic``
    whose offsets run from ``first`` one by one, when every entry is plain
    (see the Python twin); ``None`` for anything else."""
    cdef list out = []
    cdef long long off = first
    cdef Py_ssize_t size
    cdef const char* raw_id
    for entry in entries:
        eid, f = entry
        if type(eid) is not bytes:
            return None
        size = PyBytes_GET_SIZE(eid)
        raw_id = PyBytes_AS_STRING(eid)
        if size < 3 or raw_id[size - 2] != b"-"[0] or raw_id[size - 1] != b"0"[0]:
            return None
        if type(f) is not list or len(<list>f) != 6:
            return None
        if not (_is((<list>f)[0], b"b") and _is((<list>f)[2], b"m") and _is((<list>f)[4], b"s")):
            return None
        body = (<list>f)[1]
        if type(body) is not bytes:
            return None
        try:
            meta = _loads((<list>f)[3])
        except _json_error:
            return None
        if type(meta) is not dict or (<dict>meta).get("p"):
            return None
        try:
            store = int((<list>f)[5])
        except (TypeError, ValueError):
            return None
        m = _alloc(_cls)
        PyObject_GC_UnTrack(<void*>m)
        _put(m, _topic, topic)
        _put(m, _queue_id, qid)
        _put(m, _queue_offset, off)
        _put(m, _body, body)
        _put(m, _keys, (<dict>meta).get("k"))
        _put(m, _tags, (<dict>meta).get("t"))
        _put(m, _properties, {})
        _put(m, _born, (<dict>meta).get("bt", 0))
        _put(m, _store, store)
        _put(m, _times, 0)
        _put(m, _msg_id, PyUnicode_FromFormat("%U%lld", <PyObject*>prefix, off))
        _put(m, _broker, namespace)
        out.append(m)
        off += 1
    return out

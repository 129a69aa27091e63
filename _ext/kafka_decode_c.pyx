# cython: language_level=3
"""Compiled twin of ``lite_push._kernels.kafka_decode_py``: :func:`decode_plain`
turns a Kafka record without headers into its message in one C pass.

The message is built without its dataclass ``__init__`` (a Python call, a
third of a record's decoding): a new instance of :class:`MessageExt` gets
each of its slots written at the offset its member descriptor gives
(``_slots.h``), and is left untracked by the cyclic garbage collector as
the sources leave every batch (``lite_push._kernels.untrack_py`` says why).  The
offsets are read, and the fields checked, at import: a :class:`MessageExt`
with other fields fails the import, and the selector
(``lite_push._kernels.kafka_decode``) says so.
"""

import dataclasses

from cpython.object cimport PyObject, PyTypeObject

from lite_push._types import MessageExt

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)

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


cdef Py_ssize_t _offset(str name) except -1:
    descr = MessageExt.__dict__.get(name)
    off = _slot_offset(<PyObject*>descr)
    if off < 0:
        raise ImportError(f"lite_push._kernels.kafka_decode_c: MessageExt.{name} is not a __slots__ member")
    return off


if tuple(f.name for f in dataclasses.fields(MessageExt)) != FIELDS:
    raise ImportError(f"lite_push._kernels.kafka_decode_c: MessageExt's fields are not {FIELDS}")
_topic, _queue_id, _queue_offset, _body = _offset("topic"), _offset("queue_id"), _offset("queue_offset"), _offset("body")
_keys, _tags, _properties = _offset("keys"), _offset("tags"), _offset("properties")
_born, _store, _times = _offset("born_timestamp"), _offset("store_timestamp"), _offset("reconsume_times")
_msg_id, _broker = _offset("msg_id"), _offset("broker_name")


def decode_plain(record, topic, decode_key, broker_name):
    """The message of a confluent-kafka record that has no headers (``topic``:
    its lite_push name, ``decode_key`` the broker's key decoder); ``None``
    when it has headers or its key does not decode: then the full decoder
    (``lite_push.sources.kafka.codec.decode``) decides, and names what is
    malformed."""
    if record.headers():
        return None
    raw_key = record.key()
    keys = None
    if raw_key is not None:
        try:
            keys = decode_key(raw_key)
        except (UnicodeDecodeError, ValueError):
            return None
    value = record.value()
    if value is None:
        value = b""
    ts = record.timestamp()[1]
    partition = record.partition()
    offset = record.offset()
    msg_id = f"{record.topic()}-{partition}-{offset}"
    m = _alloc(_cls)
    PyObject_GC_UnTrack(<void*>m)
    _put(m, _topic, topic)
    _put(m, _queue_id, partition)
    _put(m, _queue_offset, offset)
    _put(m, _body, value)
    _put(m, _keys, keys)
    _put(m, _tags, None)
    _put(m, _properties, {})
    _put(m, _born, ts)
    _put(m, _store, ts)
    _put(m, _times, 0)
    _put(m, _msg_id, msg_id)
    _put(m, _broker, broker_name)
    return m

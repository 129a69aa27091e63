# cython: language_level=3, embedsignature=True
"""Compiled twin of ``lite_push.sources.kafka.fetch_client_py``: a Kafka
member's fetcher client on librdkafka's C API, so a record becomes its message
in one C pass, with no confluent-kafka ``Message`` object between them.

The library is the one the confluent-kafka wheel ships (the selector,
``lite_push.sources.kafka.fetch_client``, passes its path): opened with
``dlopen`` at the first client (already loaded by ``confluent_kafka``, so
the same copy), its functions found with ``dlsym``.  Only its public,
stable C API is used: ``rd_kafka_message_t`` and the topic-partition list
are public structs.

The client is a consumer with manual assignment (``incremental_assign``),
no group callbacks, and one queue: ``rd_kafka_poll_set_consumer`` forwards
the main queue to the consumer queue, so :meth:`FetchClient.read` serves
everything the client has to say.  Its log lines (``log.queue``: never
from librdkafka's own threads) go to the ``logger`` given, as confluent-kafka
sends them, from the thread that reads.  A read waits without the GIL.

What :meth:`FetchClient.read` does with each record is what
``fetch_client_py.file_records`` does (the twins are held equal by
``tests/test_kafka_fetch.py``): a record without headers whose key decodes
becomes its :class:`~lite_push.MessageExt` here (written slot by slot,
untracked by the cyclic GC, as ``_kafka_decode_c`` does), any other is
handed on as a ``record_type`` for the full decoder; each goes to the file of
its partition (``by_name``), skipping what was fetched again.
"""

import dataclasses
import logging

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyObject, PyTypeObject
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_FromString
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc

from confluent_kafka import KafkaError, KafkaException

from lite_push._types import MessageExt

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)
    object PyUnicode_FromFormat(const char*, ...)

cdef extern from *:
    """
    /* A message's id, "<topic>-<partition>-<offset>", as
     * PyUnicode_FromFormat("%U-%d-%lld") makes it, without parsing a format
     * per message: "<topic>-<partition>-" is written once per run of a
     * partition's records (lite_push_id_prefix: its length, or -1 when the
     * topic's name is not ASCII or too long, and the format is used), then
     * each offset's digits after it (lite_push_ascii_id, offset >= 0). */
    #include <stdio.h>
    static Py_ssize_t lite_push_id_prefix(char *buf, Py_ssize_t cap, const char *topic, int partition) {
        const unsigned char *t = (const unsigned char *)topic;
        for (; *t; t++) if (*t >= 128) return -1;
        int n = snprintf(buf, (size_t)cap, "%s-%d-", topic, partition);
        return (n > 0 && n < cap) ? n : -1;
    }
    static PyObject *lite_push_ascii_id(const char *prefix, Py_ssize_t plen, long long off) {
        char digits[24];
        int nd = 0, i;
        unsigned long long v = (unsigned long long)off;
        do { digits[nd++] = (char)('0' + v % 10); v /= 10; } while (v);
        PyObject *s = PyUnicode_New(plen + nd, 127);
        if (s == NULL) return NULL;
        Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
        memcpy(d, prefix, (size_t)plen);
        for (i = 0; i < nd; i++) d[plen + i] = (Py_UCS1)digits[nd - 1 - i];
        return s;
    }
    """
    Py_ssize_t _id_prefix "lite_push_id_prefix"(char*, Py_ssize_t, const char*, int)
    object _ascii_id "lite_push_ascii_id"(const char*, Py_ssize_t, long long)

#: The room for "<topic>-<partition>-" (Kafka's topic names: 249 characters at most).
cdef enum:
    _PREFIX_MAX = 288

cdef extern from "_slots.h":
    Py_ssize_t _slot_offset "lite_push_slot_offset"(PyObject*)
    object _alloc "lite_push_alloc"(PyTypeObject*)
    void _put "lite_push_slot_put"(object, Py_ssize_t, object)

cdef extern from "dlfcn.h" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    char* dlerror()
    int RTLD_NOW
    int RTLD_GLOBAL

__all__ = ["FetchClient"]

# -- librdkafka's public types (rdkafka.h) -------------------------------------------

ctypedef struct rd_kafka_message_t:
    int err
    void* rkt
    int32_t partition
    char* payload
    size_t len
    char* key
    size_t key_len
    int64_t offset
    void* _private

ctypedef struct rd_kafka_topic_partition_t:
    char* topic
    int32_t partition
    int64_t offset
    void* metadata
    size_t metadata_size
    void* opaque
    int err
    void* _private

ctypedef struct rd_kafka_topic_partition_list_t:
    int cnt
    int size
    rd_kafka_topic_partition_t* elems

ctypedef void (*log_cb_t)(const void* rk, int level, const char* fac, const char* buf) noexcept nogil

cdef enum:
    _CONSUMER = 1  # RD_KAFKA_CONSUMER
    _PARTITION_EOF = -191  # RD_KAFKA_RESP_ERR__PARTITION_EOF
    _NO_ERROR = 0
    _ERRSTR = 512
    _OFFSET_INVALID = -1001  # RD_KAFKA_OFFSET_INVALID
    _IN_PROGRESS = -178  # RD_KAFKA_RESP_ERR__IN_PROGRESS: an asynchronous operation started

# -- librdkafka's functions, found at run time ---------------------------------------

cdef void* (*_conf_new)() noexcept nogil
cdef void (*_conf_destroy)(void*) noexcept nogil
cdef int (*_conf_set)(void*, const char*, const char*, char*, size_t) noexcept nogil
cdef void (*_conf_set_log_cb)(void*, log_cb_t) noexcept nogil
cdef void (*_conf_set_opaque)(void*, void*) noexcept nogil
cdef void* (*_new)(int, void*, char*, size_t) noexcept nogil
cdef void* (*_opaque)(const void*) noexcept nogil
cdef const char* (*_name)(const void*) noexcept nogil
cdef int (*_poll_set_consumer)(void*) noexcept nogil
cdef int (*_set_log_queue)(void*, void*) noexcept nogil
cdef void* (*_queue_get_consumer)(void*) noexcept nogil
cdef void (*_queue_destroy)(void*) noexcept nogil
cdef Py_ssize_t (*_consume_batch_queue)(void*, int, rd_kafka_message_t**, size_t) noexcept nogil
cdef void (*_message_destroy)(rd_kafka_message_t*) noexcept nogil
cdef int64_t (*_message_timestamp)(const rd_kafka_message_t*, int*) noexcept nogil
cdef int (*_message_headers)(const rd_kafka_message_t*, void**) noexcept nogil
cdef int (*_header_get_all)(const void*, size_t, const char**, const void**, size_t*) noexcept nogil
cdef const char* (*_topic_name)(const void*) noexcept nogil
cdef const char* (*_err2str)(int) noexcept nogil
cdef int (*_fatal_error)(void*, char*, size_t) noexcept nogil
cdef rd_kafka_topic_partition_list_t* (*_tpl_new)(int) noexcept nogil
cdef rd_kafka_topic_partition_t* (*_tpl_add)(rd_kafka_topic_partition_list_t*, const char*, int32_t) noexcept nogil
cdef void (*_tpl_destroy)(rd_kafka_topic_partition_list_t*) noexcept nogil
cdef void* (*_incremental_assign)(void*, const rd_kafka_topic_partition_list_t*) noexcept nogil
cdef void* (*_incremental_unassign)(void*, const rd_kafka_topic_partition_list_t*) noexcept nogil
cdef const char* (*_error_string)(const void*) noexcept nogil
cdef int (*_error_code)(const void*) noexcept nogil
cdef void (*_error_destroy)(void*) noexcept nogil
cdef int (*_pause_partitions)(void*, rd_kafka_topic_partition_list_t*) noexcept nogil
cdef int (*_resume_partitions)(void*, rd_kafka_topic_partition_list_t*) noexcept nogil
cdef void* (*_seek_partitions)(void*, rd_kafka_topic_partition_list_t*, int) noexcept nogil
cdef int (*_query_watermark_offsets)(void*, const char*, int32_t, int64_t*, int64_t*, int) noexcept nogil
cdef int (*_get_watermark_offsets)(void*, const char*, int32_t, int64_t*, int64_t*) noexcept nogil
cdef void* (*_topic_new)(void*, const char*, void*) noexcept nogil
cdef void (*_topic_destroy)(void*) noexcept nogil
cdef int (*_metadata)(void*, int, void*, const void**, int) noexcept nogil
cdef void (*_metadata_destroy)(const void*) noexcept nogil
cdef int (*_consumer_close)(void*) noexcept nogil
cdef void (*_destroy)(void*) noexcept nogil

cdef bint _loaded = False


cdef void* _sym(void* lib, const char* name) except NULL:
    cdef void* f = dlsym(lib, name)
    if f == NULL:
        raise ImportError(f"librdkafka has no {name.decode()}")
    return f


cdef int _load(bytes path) except -1:
    """Open librdkafka and find every function used (once)."""
    global _loaded
    global _conf_new, _conf_destroy, _conf_set, _conf_set_log_cb, _conf_set_opaque, _new, _opaque, _name
    global _poll_set_consumer, _set_log_queue, _queue_get_consumer, _queue_destroy, _consume_batch_queue, _message_destroy
    global _message_timestamp, _message_headers, _header_get_all, _topic_name, _err2str, _fatal_error
    global _tpl_new, _tpl_add, _tpl_destroy, _incremental_assign, _incremental_unassign
    global _error_string, _error_code, _error_destroy, _pause_partitions, _resume_partitions, _seek_partitions
    global _query_watermark_offsets, _get_watermark_offsets, _topic_new, _topic_destroy, _metadata
    global _metadata_destroy, _consumer_close, _destroy
    if _loaded:
        return 0
    cdef void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL)
    if lib == NULL:
        raise ImportError(f"cannot open {path.decode()}: {dlerror().decode()}")
    _conf_new = <void* (*)() noexcept nogil>_sym(lib, b"rd_kafka_conf_new")
    _conf_destroy = <void (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_conf_destroy")
    _conf_set = <int (*)(void*, const char*, const char*, char*, size_t) noexcept nogil>_sym(lib, b"rd_kafka_conf_set")
    _conf_set_log_cb = <void (*)(void*, log_cb_t) noexcept nogil>_sym(lib, b"rd_kafka_conf_set_log_cb")
    _conf_set_opaque = <void (*)(void*, void*) noexcept nogil>_sym(lib, b"rd_kafka_conf_set_opaque")
    _new = <void* (*)(int, void*, char*, size_t) noexcept nogil>_sym(lib, b"rd_kafka_new")
    _opaque = <void* (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_opaque")
    _name = <const char* (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_name")
    _poll_set_consumer = <int (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_poll_set_consumer")
    _set_log_queue = <int (*)(void*, void*) noexcept nogil>_sym(lib, b"rd_kafka_set_log_queue")
    _queue_get_consumer = <void* (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_queue_get_consumer")
    _queue_destroy = <void (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_queue_destroy")
    _consume_batch_queue = <Py_ssize_t (*)(void*, int, rd_kafka_message_t**, size_t) noexcept nogil>_sym(
        lib, b"rd_kafka_consume_batch_queue")
    _message_destroy = <void (*)(rd_kafka_message_t*) noexcept nogil>_sym(lib, b"rd_kafka_message_destroy")
    _message_timestamp = <int64_t (*)(const rd_kafka_message_t*, int*) noexcept nogil>_sym(
        lib, b"rd_kafka_message_timestamp")
    _message_headers = <int (*)(const rd_kafka_message_t*, void**) noexcept nogil>_sym(
        lib, b"rd_kafka_message_headers")
    _header_get_all = <int (*)(const void*, size_t, const char**, const void**, size_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_header_get_all")
    _topic_name = <const char* (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_topic_name")
    _err2str = <const char* (*)(int) noexcept nogil>_sym(lib, b"rd_kafka_err2str")
    _fatal_error = <int (*)(void*, char*, size_t) noexcept nogil>_sym(lib, b"rd_kafka_fatal_error")
    _tpl_new = <rd_kafka_topic_partition_list_t* (*)(int) noexcept nogil>_sym(
        lib, b"rd_kafka_topic_partition_list_new")
    _tpl_add = <rd_kafka_topic_partition_t* (*)(rd_kafka_topic_partition_list_t*, const char*, int32_t) noexcept nogil>_sym(
        lib, b"rd_kafka_topic_partition_list_add")
    _tpl_destroy = <void (*)(rd_kafka_topic_partition_list_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_topic_partition_list_destroy")
    _incremental_assign = <void* (*)(void*, const rd_kafka_topic_partition_list_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_incremental_assign")
    _incremental_unassign = <void* (*)(void*, const rd_kafka_topic_partition_list_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_incremental_unassign")
    _error_string = <const char* (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_error_string")
    _error_code = <int (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_error_code")
    _error_destroy = <void (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_error_destroy")
    _pause_partitions = <int (*)(void*, rd_kafka_topic_partition_list_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_pause_partitions")
    _resume_partitions = <int (*)(void*, rd_kafka_topic_partition_list_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_resume_partitions")
    _seek_partitions = <void* (*)(void*, rd_kafka_topic_partition_list_t*, int) noexcept nogil>_sym(
        lib, b"rd_kafka_seek_partitions")
    _query_watermark_offsets = <int (*)(void*, const char*, int32_t, int64_t*, int64_t*, int) noexcept nogil>_sym(
        lib, b"rd_kafka_query_watermark_offsets")
    _get_watermark_offsets = <int (*)(void*, const char*, int32_t, int64_t*, int64_t*) noexcept nogil>_sym(
        lib, b"rd_kafka_get_watermark_offsets")
    _topic_new = <void* (*)(void*, const char*, void*) noexcept nogil>_sym(lib, b"rd_kafka_topic_new")
    _topic_destroy = <void (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_topic_destroy")
    _metadata = <int (*)(void*, int, void*, const void**, int) noexcept nogil>_sym(lib, b"rd_kafka_metadata")
    _metadata_destroy = <void (*)(const void*) noexcept nogil>_sym(lib, b"rd_kafka_metadata_destroy")
    _consumer_close = <int (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_consumer_close")
    _destroy = <void (*)(void*) noexcept nogil>_sym(lib, b"rd_kafka_destroy")
    _loaded = True
    return 0


# -- MessageExt's slots (as _kafka_decode_c) ------------------------------------------

cdef PyTypeObject* _cls = <PyTypeObject*>MessageExt
cdef Py_ssize_t _topic, _queue_id, _queue_offset, _body, _keys, _tags, _properties
cdef Py_ssize_t _born, _store, _times, _msg_id, _broker

#: :class:`MessageExt`'s fields, in the order this module writes them.
FIELDS = (
    "topic", "queue_id", "queue_offset", "body", "keys", "tags", "properties", "born_timestamp",
    "store_timestamp", "reconsume_times", "msg_id", "broker_name",
)


cdef Py_ssize_t _offset(str name) except -1:
    descr = MessageExt.__dict__.get(name)
    off = _slot_offset(<PyObject*>descr)
    if off < 0:
        raise ImportError(f"lite_push._kernels.kafka_fetch_c: MessageExt.{name} is not a __slots__ member")
    return off


if tuple(f.name for f in dataclasses.fields(MessageExt)) != FIELDS:
    raise ImportError(f"lite_push._kernels.kafka_fetch_c: MessageExt's fields are not {FIELDS}")
_topic, _queue_id, _queue_offset, _body = _offset("topic"), _offset("queue_id"), _offset("queue_offset"), _offset("body")
_keys, _tags, _properties = _offset("keys"), _offset("tags"), _offset("properties")
_born, _store, _times = _offset("born_timestamp"), _offset("store_timestamp"), _offset("reconsume_times")
_msg_id, _broker = _offset("msg_id"), _offset("broker_name")

#: Python's logging levels for librdkafka's (syslog's), as confluent-kafka maps them.
cdef int _LEVELS[8]
_LEVELS[0], _LEVELS[1], _LEVELS[2], _LEVELS[3] = 50, 50, 50, 40
_LEVELS[4], _LEVELS[5], _LEVELS[6], _LEVELS[7] = 30, 20, 20, 10

#: Record-level errors go here, as the Python twin logs them.
_errors = logging.getLogger("lite_push.sources.kafka.fetch_client")


# -- the log callback -------------------------------------------------------------------

ctypedef struct _Sink:
    int enabled
    PyObject* logger


cdef void _log_cb(const void* rk, int level, const char* fac, const char* buf) noexcept nogil:
    # Called while the client's queue is served: by read() or close(), on
    # the thread that called them (log.queue), never by librdkafka's own.
    cdef _Sink* sink = <_Sink*>_opaque(rk)
    if sink == NULL or not sink.enabled:
        return
    with gil:
        try:
            (<object>sink.logger).log(_LEVELS[level if 0 <= level < 8 else 7], "%s [%s] %s",
                                      fac.decode("utf-8", "replace"), _name(rk).decode("utf-8", "replace"),
                                      buf.decode("utf-8", "replace"))
        except Exception:
            pass  # a log line must not break a read


cdef object _failed(int err, str doing):
    return KafkaException(KafkaError(err, f"{doing}: {_err2str(err).decode('utf-8', 'replace')}"))


cdef object _error_of(void* error, str doing):
    """The KafkaException of an ``rd_kafka_error_t`` (destroyed here)."""
    code = _error_code(error)
    text = _error_string(error).decode("utf-8", "replace")
    _error_destroy(error)
    return KafkaException(KafkaError(code, f"{doing}: {text}"))


cdef inline object _raw_key(rd_kafka_message_t* m):
    """The record's key as bytes (``None``: no key)."""
    return PyBytes_FromStringAndSize(m.key, m.key_len) if m.key != NULL else None


cdef class FetchClient:
    """A consumer client that reads by manual assignment (see the module
    docstring): ``settings`` are librdkafka properties (strings), its log
    lines go to ``logger``; ``library`` is librdkafka's path.  A record
    the fast path leaves becomes a ``record_type(topic, partition, offset,
    key, value, headers, timestamp_type, timestamp)`` and goes through
    ``slow(record, topic, fmt)`` (the full decoder: its message, or the
    record itself when it is malformed).  One thread at a time."""

    cdef void* _rk
    cdef void* _queue
    cdef _Sink* _sink
    cdef object _logger
    cdef object _record_type
    cdef object _slow
    cdef bint _closed

    def __cinit__(self, settings, logger, *, str library, record_type, slow):
        self._rk = NULL
        self._queue = NULL
        self._sink = NULL
        self._closed = True
        _load(library.encode())
        self._record_type = record_type
        self._slow = slow
        cdef char errstr[_ERRSTR]
        cdef void* conf = _conf_new()
        cdef bytes k, v
        for key, value in settings.items():
            k = str(key).encode()
            v = str(value).encode()
            if _conf_set(conf, k, v, errstr, _ERRSTR) != 0:
                _conf_destroy(conf)
                raise ValueError(f"librdkafka property {key!r}: {errstr.decode('utf-8', 'replace')}")
        if _conf_set(conf, b"log.queue", b"true", errstr, _ERRSTR) != 0:
            _conf_destroy(conf)
            raise ValueError(errstr.decode("utf-8", "replace"))
        self._logger = logger
        self._sink = <_Sink*>malloc(sizeof(_Sink))
        if self._sink == NULL:
            _conf_destroy(conf)
            raise MemoryError()
        self._sink.enabled = 1
        self._sink.logger = <PyObject*>logger
        _conf_set_log_cb(conf, _log_cb)
        _conf_set_opaque(conf, <void*>self._sink)
        self._rk = _new(_CONSUMER, conf, errstr, _ERRSTR)  # takes the conf, if it succeeds
        if self._rk == NULL:
            _conf_destroy(conf)
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, errstr.decode("utf-8", "replace")))
        _set_log_queue(self._rk, NULL)  # log lines to the main queue, and
        _poll_set_consumer(self._rk)  # the main queue (logs, errors) to the consumer queue: served with the records
        self._queue = _queue_get_consumer(self._rk)
        self._closed = False

    def __dealloc__(self):
        if self._sink != NULL:
            self._sink.enabled = 0
        if self._queue != NULL:
            _queue_destroy(self._queue)
            self._queue = NULL
        if self._rk != NULL:
            with nogil:
                _destroy(self._rk)
            self._rk = NULL
        if self._sink != NULL:
            free(self._sink)
            self._sink = NULL

    cdef int _open(self) except -1:
        if self._closed:
            raise RuntimeError("the fetch client is closed")
        return 0

    # -- reading ------------------------------------------------------------------------

    def read(self, dict by_name, int count, double timeout, fmt, owner):
        """Fetch up to ``count`` records (waiting up to ``timeout`` seconds
        for the first) and file each in its partition's state of ``by_name``
        (keyed ``(topic, partition)``), decoded in ``fmt`` (see the module
        docstring); return how many records came.  A record-level error is
        logged (``owner`` names the member), a fatal one raised."""
        self._open()
        if count <= 0:
            return 0
        cdef rd_kafka_message_t** msgs = <rd_kafka_message_t**>malloc(count * sizeof(rd_kafka_message_t*))
        if msgs == NULL:
            raise MemoryError()
        cdef int timeout_ms = <int>(timeout * 1000.0) if timeout > 0 else 0
        cdef Py_ssize_t n, i
        with nogil:
            n = _consume_batch_queue(self._queue, timeout_ms, msgs, count)
        if n < 0:
            free(msgs)
            raise KafkaException(KafkaError(KafkaError._FAIL, "consume failed"))
        try:
            self._file(msgs, n, by_name, fmt, owner)
        finally:
            for i in range(n):
                _message_destroy(msgs[i])
            free(msgs)
        return n

    cdef int _file(self, rd_kafka_message_t** msgs, Py_ssize_t n, dict by_name, fmt, owner) except -1:
        cdef rd_kafka_message_t* m
        cdef void* last_rkt = NULL
        cdef int32_t last_part = -1
        cdef int64_t fetched = 0
        cdef char errstr[_ERRSTR]
        cdef Py_ssize_t i
        cdef bint utf8_keys = fmt.utf8_keys
        cdef object decode_key = fmt.decode_key
        cdef object broker_name = fmt.broker_name
        cdef object st = None
        cdef object name = None
        cdef object topic = None
        cdef list run = None
        cdef const char* tname
        cdef char prefix[_PREFIX_MAX]
        cdef Py_ssize_t plen = -1
        for i in range(n):
            m = msgs[i]
            if m.err != _NO_ERROR:
                if m.err == _PARTITION_EOF:
                    continue
                if _fatal_error(self._rk, errstr, _ERRSTR) != 0:
                    raise KafkaException(KafkaError(KafkaError._FATAL, errstr.decode("utf-8", "replace"), fatal=True))
                text = m.payload[:m.len].decode("utf-8", "replace") if m.payload != NULL else ""
                reason = _err2str(m.err).decode("utf-8", "replace")
                _errors.warning("%r: %s", owner, f"{reason}: {text}" if text else reason)
                continue
            if m.rkt != last_rkt or m.partition != last_part:
                if run:  # records come in runs of one partition
                    st.file.extend(run)
                    st.fetched = fetched
                run = []
                last_rkt = m.rkt
                last_part = m.partition
                tname = _topic_name(m.rkt)
                name = PyUnicode_FromString(tname)
                plen = _id_prefix(prefix, _PREFIX_MAX, tname, m.partition)
                st = by_name.get((name, m.partition))
                if st is not None:
                    fetched = st.fetched
                    topic = st.mq.topic
            if st is None:  # revoked meanwhile
                continue
            if m.offset < fetched:  # fetched again (after a pause or a seek)
                continue
            run.append(self._decode(m, name, topic, decode_key, utf8_keys, broker_name, fmt, prefix, plen))
            fetched = m.offset + 1
        if run:
            st.file.extend(run)
            st.fetched = fetched
        return 0

    cdef object _decode(self, rd_kafka_message_t* m, object name, object topic, decode_key, bint utf8_keys,
                        object broker_name, fmt, const char* prefix, Py_ssize_t plen):
        cdef void* hdrs = NULL
        cdef int tstype = 0
        cdef int64_t ts = _message_timestamp(m, &tstype)
        cdef object keys = None
        value = PyBytes_FromStringAndSize(m.payload, m.len) if m.payload != NULL else None
        if _message_headers(m, &hdrs) == _NO_ERROR and hdrs != NULL:
            return self._slow(self._record_type(name, m.partition, m.offset, _raw_key(m), value, _headers(hdrs),
                                                tstype, ts), topic, fmt)
        if m.key != NULL:
            try:  # UTF-8 keys straight from the record: no bytes object between
                keys = PyUnicode_DecodeUTF8(m.key, m.key_len, "strict") if utf8_keys else decode_key(_raw_key(m))
            except (UnicodeDecodeError, ValueError):
                return self._slow(self._record_type(name, m.partition, m.offset, _raw_key(m), value, None, tstype, ts),
                                  topic, fmt)
        msg = _alloc(_cls)
        PyObject_GC_UnTrack(<void*>msg)
        _put(msg, _topic, topic)
        _put(msg, _queue_id, m.partition)
        _put(msg, _queue_offset, m.offset)
        _put(msg, _body, b"" if value is None else value)
        _put(msg, _keys, keys)
        _put(msg, _tags, None)
        _put(msg, _properties, {})
        _put(msg, _born, ts)
        _put(msg, _store, ts)
        _put(msg, _times, 0)
        if plen >= 0 and m.offset >= 0:
            _put(msg, _msg_id, _ascii_id(prefix, plen, m.offset))
        else:
            _put(msg, _msg_id, PyUnicode_FromFormat("%U-%d-%lld", <PyObject*>name, <int>m.partition,
                                                    <long long>m.offset))
        _put(msg, _broker, broker_name)
        return msg

    # -- the assignment -----------------------------------------------------------------

    def load_metadata(self, str topic, double timeout):
        """Ask for ``topic``'s metadata (a client starts fetching a topic it
        knows at once); ``KafkaException`` when none came."""
        self._open()
        cdef bytes t = topic.encode()
        cdef void* rkt = _topic_new(self._rk, t, NULL)
        cdef const void* md = NULL
        cdef int err
        if rkt == NULL:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"topic {topic!r}"))
        with nogil:
            err = _metadata(self._rk, 0, rkt, &md, <int>(timeout * 1000.0))
        _topic_destroy(rkt)
        if md != NULL:
            _metadata_destroy(md)
        if err != _NO_ERROR:
            raise _failed(err, f"metadata of {topic!r}")

    def assign(self, partitions):
        """Read ``(topic, partition, offset)``s from their offsets."""
        self._open()
        cdef rd_kafka_topic_partition_list_t* tpl = _list(partitions, True)
        cdef void* error
        with nogil:
            error = _incremental_assign(self._rk, tpl)
        _tpl_destroy(tpl)
        if error != NULL:
            raise _error_of(error, "incremental_assign")

    def unassign(self, partitions):
        """Stop reading ``(topic, partition)``s."""
        self._open()
        cdef rd_kafka_topic_partition_list_t* tpl = _list(partitions, False)
        cdef void* error
        with nogil:
            error = _incremental_unassign(self._rk, tpl)
        _tpl_destroy(tpl)
        if error != NULL:
            raise _error_of(error, "incremental_unassign")

    def pause(self, partitions):
        """Stop fetching ``(topic, partition)``s."""
        self._open()
        cdef rd_kafka_topic_partition_list_t* tpl = _list(partitions, False)
        cdef int err = _pause_partitions(self._rk, tpl)
        _tpl_destroy(tpl)
        if err != _NO_ERROR:
            raise _failed(err, "pause")

    def resume(self, partitions):
        """Fetch ``(topic, partition)``s again."""
        self._open()
        cdef rd_kafka_topic_partition_list_t* tpl = _list(partitions, False)
        cdef int err = _resume_partitions(self._rk, tpl)
        _tpl_destroy(tpl)
        if err != _NO_ERROR:
            raise _failed(err, "resume")

    def seek(self, str topic, int partition, long long offset):
        """Fetch ``topic``'s ``partition`` from ``offset`` (no wait)."""
        self._open()
        cdef rd_kafka_topic_partition_list_t* tpl = _list([(topic, partition, offset)], True)
        cdef void* error
        with nogil:
            error = _seek_partitions(self._rk, tpl, 0)  # 0: started, not waited for
        cdef int err = tpl.elems[0].err
        _tpl_destroy(tpl)
        if error != NULL:
            if _error_code(error) == _IN_PROGRESS:
                _error_destroy(error)
            else:
                raise _error_of(error, "seek")
        if err != _NO_ERROR and err != _IN_PROGRESS:
            raise _failed(err, "seek")

    def watermarks(self, str topic, int partition, double timeout):
        """``(low, high)`` of a partition, asked of its broker."""
        self._open()
        cdef bytes t = topic.encode()
        cdef const char* ct = t
        cdef int64_t low = 0, high = 0
        cdef int err
        cdef int32_t part = partition
        cdef int timeout_ms = <int>(timeout * 1000.0)
        with nogil:
            err = _query_watermark_offsets(self._rk, ct, part, &low, &high, timeout_ms)
        if err != _NO_ERROR:
            raise _failed(err, f"watermarks of {topic!r} [{partition}]")
        return low, high

    def cached_high(self, str topic, int partition):
        """The high watermark of a partition as last fetched (no request);
        ``None`` when it was not fetched yet."""
        self._open()
        cdef bytes t = topic.encode()
        cdef int64_t low = _OFFSET_INVALID, high = _OFFSET_INVALID
        if _get_watermark_offsets(self._rk, t, partition, &low, &high) != _NO_ERROR or high < 0:
            return None
        return high

    def close(self):
        """Stop fetching and let go of the client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with nogil:
            _consumer_close(self._rk)
        self._sink.enabled = 0
        _queue_destroy(self._queue)
        self._queue = NULL
        with nogil:
            _destroy(self._rk)
        self._rk = NULL


cdef rd_kafka_topic_partition_list_t* _list(partitions, bint offsets) except NULL:
    """A topic-partition list of ``(topic, partition[, offset])``s."""
    cdef rd_kafka_topic_partition_list_t* tpl = _tpl_new(len(partitions))
    cdef rd_kafka_topic_partition_t* p
    cdef bytes t
    for item in partitions:
        t = item[0].encode()
        p = _tpl_add(tpl, t, item[1])
        if offsets:
            p.offset = item[2]
    return tpl


cdef list _headers(const void* hdrs):
    """The ``(name, value)`` pairs of a record's headers (``None`` for a null value)."""
    cdef list out = []
    cdef size_t idx = 0, size
    cdef const char* hname
    cdef const void* value
    while _header_get_all(hdrs, idx, &hname, &value, &size) == _NO_ERROR:
        out.append((hname.decode("utf-8", "replace"),
                    None if value == NULL else PyBytes_FromStringAndSize(<const char*>value, size)))
        idx += 1
    return out

# cython: language_level=3, embedsignature=True
"""Compiled twin of the key-hash router (see ``lite_push/_router.py``).

Same three functions, same signatures and the same results as
``lite_push/_router_py.py``; the tests run every case against both.

``java_hash`` walks the str's internal buffer (PEP 393: one, two or four bytes
per code point) instead of encoding it to UTF-16 first.  Java hashes UTF-16
code units, so a code point above U+FFFF counts as its surrogate pair; a
one- or two-byte str has no such code points, so only the four-byte loop
splits them.  The arithmetic is unsigned 32-bit, which wraps like Java's
``int``; the result is then read back as signed.
"""

from cpython.unicode cimport (
    PyUnicode_CheckExact,
    Py_UCS1,
    Py_UCS2,
    PyUnicode_1BYTE_DATA,
    PyUnicode_1BYTE_KIND,
    PyUnicode_2BYTE_DATA,
    PyUnicode_2BYTE_KIND,
    PyUnicode_4BYTE_DATA,
    PyUnicode_GET_LENGTH,
    PyUnicode_KIND,
)
from cpython.dict cimport PyDict_GetItemWithError
from cpython.exc cimport PyErr_Occurred
from cpython.long cimport PyLong_AsSsize_t
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from libc.stdint cimport int64_t, uint32_t

cdef extern from *:
    # A str made by the legacy C API before 3.12 may not be "ready" (no PEP 393
    # buffer yet); since 3.12 every str is.
    """
    #if PY_VERSION_HEX < 0x030C0000
    #define __lite_push_str_ready(o) PyUnicode_READY(o)
    #else
    #define __lite_push_str_ready(o) 0
    #endif
    """
    int _str_ready "__lite_push_str_ready"(object) except -1

cdef extern from "_slots.h":
    Py_ssize_t _slot_offset "lite_push_slot_offset"(PyObject*)
    PyObject* _slot "lite_push_slot"(object, Py_ssize_t)

__all__ = ["bucket", "java_hash", "lane_of", "route"]


cdef inline int64_t _java_hash(object key) except? -1:
    # ``key`` is untyped because a ``str`` argument would reject str
    # subclasses, which the Python twin accepts; isinstance() lets them in.
    if not isinstance(key, str):
        raise TypeError(f"key must be str, not {type(key).__name__}")
    cdef Py_ssize_t i, n
    cdef unsigned int kind
    cdef uint32_t h = 0, cp
    cdef const Py_UCS1 *d1
    cdef const Py_UCS2 *d2
    cdef const Py_UCS4 *d4
    _str_ready(key)
    n = PyUnicode_GET_LENGTH(key)
    kind = PyUnicode_KIND(key)
    if kind == PyUnicode_1BYTE_KIND:
        d1 = PyUnicode_1BYTE_DATA(key)
        for i in range(n):
            h = 31 * h + d1[i]
    elif kind == PyUnicode_2BYTE_KIND:
        # Lone surrogates are stored as themselves, which is what Java hashes.
        d2 = PyUnicode_2BYTE_DATA(key)
        for i in range(n):
            h = 31 * h + d2[i]
    else:
        d4 = PyUnicode_4BYTE_DATA(key)
        for i in range(n):
            cp = d4[i]
            if cp > 0xFFFF:
                cp -= 0x10000
                h = 31 * h + (0xD800 + (cp >> 10))
                h = 31 * h + (0xDC00 + (cp & 0x3FF))
            else:
                h = 31 * h + cp
    if h & 0x80000000u:
        return <int64_t>h - 0x100000000
    return <int64_t>h


def java_hash(key):
    """Java's ``String.hashCode`` of ``key`` (a signed 32-bit int)."""
    return _java_hash(key)


def lane_of(key, n):
    """The lane of ``key`` among ``n``: ``floorMod(hashCode, n)``, never
    negative (Java's ``Math.abs(h) % n`` is negative for ``Integer.MIN_VALUE``)."""
    # ``n`` stays a Python object so that the comparison and the modulo behave
    # exactly as in the Python twin for any ``n`` a caller passes.
    if n <= 0:
        raise ValueError(f"lane count must be positive, got {n}")
    return _java_hash(key) % n  # Python's % on objects: floorMod


def bucket(items, Py_ssize_t n, key_of, Py_ssize_t keyless_lane, cache):
    """Route ``items`` into ``n`` lists by ``lane_of(key_of(item), n)``.

    Items whose key is ``None`` or empty go to ``keyless_lane``.  ``cache``
    maps keys to lanes for this ``n``; the caller owns it and bounds its size.
    Order within each list is the order of ``items``.
    """
    # List indexing keeps Cython's default bounds checks and wraparound, so a
    # bad lane fails (or a negative one wraps) exactly as in the Python twin.
    cdef list out = [[] for _ in range(n)]
    cdef list lst
    cdef Py_ssize_t lane
    cdef bint is_dict = type(cache) is dict
    get = None if is_dict else cache.get
    for item in items:
        key = key_of(item)
        if not key:
            lst = out[keyless_lane]
            lst.append(item)
            continue
        if is_dict:
            cached = (<dict>cache).get(key)
        else:
            cached = get(key)
        if cached is None:
            # ``%`` on C integers keeps Python's floorMod semantics here
            # (cdivision is off), and raises ZeroDivisionError for n == 0.
            lane = _java_hash(key) % n
            cache[key] = lane
            lst = out[lane]
        else:
            lst = out[cached]
        lst.append(item)
    return out


#: key -> lane caches of :func:`route`, one per lane count.
_ROUTE_CACHES = {}
#: A route cache is cleared when it grows past this many keys.
ROUTE_CACHE_LIMIT = 1 << 17


def route(groups, Py_ssize_t n, key_of):
    """Route several batches into per-lane *segments* in one call.

    ``groups`` holds ``(tag, items, keyless_lane)`` per batch (lite_push passes
    one per polled queue, tagged with its ProcessQueue).  Returns
    ``(segments, counts)``: ``segments[i]`` is ``None`` when lane ``i`` got
    nothing, else the list of ``(tag, sub_items)`` routed to it, one per group
    in group order, items in their order; ``counts[i]`` is the number of items
    lane ``i`` got.  ``key_of=None`` reads ``item.keys``.  Lanes are
    ``lane_of(key, n)``; empty or ``None`` keys go to the group's
    ``keyless_lane``.  Lanes are cached per key (one cache per lane count,
    cleared past ``ROUTE_CACHE_LIMIT`` keys), as in the Python twin.
    """
    if n <= 0:
        raise ValueError(f"lane count must be positive, got {n}")
    cdef dict cache = _ROUTE_CACHES.get(n)
    if cache is None or len(cache) > ROUTE_CACHE_LIMIT:
        cache = _ROUTE_CACHES[n] = {}
    cdef PyObject* hit
    cdef list segments = [None] * n
    cdef list counts = [0] * n
    # lane -> this group's sub-list (a borrowed reference: ``segments`` owns
    # it) and its length; reset after each group.
    cdef PyObject** cur = <PyObject**> PyMem_Malloc(n * sizeof(PyObject*))
    cdef Py_ssize_t* touched = <Py_ssize_t*> PyMem_Malloc(n * sizeof(Py_ssize_t))
    cdef Py_ssize_t* totals = <Py_ssize_t*> PyMem_Malloc(n * sizeof(Py_ssize_t))
    if cur == NULL or touched == NULL or totals == NULL:
        PyMem_Free(cur); PyMem_Free(touched); PyMem_Free(totals)
        raise MemoryError()
    cdef Py_ssize_t lane, keyless, ntouched = 0, i, j, nitems
    cdef list sub
    cdef bint by_attr = key_of is None
    # ``item.keys`` straight from the slot while items are of the slotted
    # class seen first (MessageExt); anything else goes through getattr.
    cdef PyTypeObject* fast_type = NULL
    cdef Py_ssize_t keys_offset = -1
    cdef PyObject* raw
    for i in range(n):
        cur[i] = NULL
        totals[i] = 0
    try:
        for group in groups:
            tag, items, keyless_obj = group
            keyless = keyless_obj
            if keyless < 0 or keyless >= n:
                raise IndexError(f"keyless lane {keyless} out of range for {n} lanes")
            if type(items) is not list:
                items = list(items)
            nitems = PyList_GET_SIZE(items)
            for j in range(nitems):
                item = <object>PyList_GET_ITEM(items, j)
                if by_attr:
                    if Py_TYPE(item) != fast_type:
                        fast_type = NULL
                        t = type(item)
                        if t.__getattribute__ is object.__getattribute__:
                            d = t.__dict__.get("keys")
                            if d is not None:
                                keys_offset = _slot_offset(<PyObject*>d)
                                if keys_offset >= 0:
                                    fast_type = Py_TYPE(item)
                    raw = _slot(item, keys_offset) if fast_type != NULL else NULL
                    if raw != NULL:
                        key = <object>raw
                    else:
                        key = item.keys
                else:
                    key = key_of(item)
                if key is None or (PyUnicode_CheckExact(key) and PyUnicode_GET_LENGTH(key) == 0) or not key:
                    lane = keyless
                else:
                    hit = PyDict_GetItemWithError(cache, key)
                    if hit != NULL:
                        lane = PyLong_AsSsize_t(<object>hit)
                    else:
                        if PyErr_Occurred():
                            raise
                        lane = _java_hash(key) % n
                        cache[key] = lane
                if cur[lane] == NULL:
                    sub = []
                    cur[lane] = <PyObject*>sub
                    touched[ntouched] = lane
                    ntouched += 1
                    segs_obj = segments[lane]
                    if segs_obj is None:
                        segments[lane] = [(tag, sub)]
                    else:
                        (<list>segs_obj).append((tag, sub))
                    sub.append(item)
                else:
                    PyList_Append(<object>cur[lane], item)
            for i in range(ntouched):
                lane = touched[i]
                totals[lane] += PyList_GET_SIZE(<object>cur[lane])
                cur[lane] = NULL
            ntouched = 0
        for i in range(n):
            if totals[i]:
                counts[i] = totals[i]
    finally:
        PyMem_Free(cur)
        PyMem_Free(touched)
        PyMem_Free(totals)
    return segments, counts

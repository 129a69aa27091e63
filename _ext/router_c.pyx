# cython: language_level=3, embedsignature=True
"""Compiled twin of the router (see ``lite_push/_kernels/router.py``).

Same functions and the same :class:`KeyRouter`, with the same results, as
``lite_push/_kernels/router_py.py`` (whose docstring explains the design); the tests
run every case against both, and check that the two place keys identically
for the same sequence of routes and releases.

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
cimport cython
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetItem, PyDict_Size
from cpython.exc cimport PyErr_Occurred
from cpython.long cimport PyLong_AsSsize_t
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from cpython.pyport cimport PY_SSIZE_T_MAX

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

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)

cdef extern from "_slots.h":
    Py_ssize_t _slot_offset "lite_push_slot_offset"(PyObject*)
    PyObject* _slot "lite_push_slot"(object, Py_ssize_t)
    void _prefetch_keys "lite_push_prefetch_keys"(object, Py_ssize_t, Py_ssize_t, PyTypeObject*, Py_ssize_t)
    void _prefetch_releases "lite_push_prefetch_releases"(object, PyTypeObject*, Py_ssize_t)

__all__ = [
    "HEAP_SLACK", "PLACEMENTS", "ROUTE_CACHE_LIMIT", "SWEEP_SLACK", "KeyRouter", "java_hash", "lane_of", "mixed_hash",
]

#: The values of ``KeyRouter(placement=...)``.
PLACEMENTS = ("load", "hash", "java")
#: Fixed placements cache a key's lane; the cache is cleared past this many keys.
cdef enum:
    _ROUTE_CACHE_LIMIT = 131072
    _HEAP_SLACK = 64
    _SWEEP_SLACK = 16384
ROUTE_CACHE_LIMIT = _ROUTE_CACHE_LIMIT
#: Load placement: the heap is rebuilt once it holds ``2 * lanes`` plus this
#: many entries.
HEAP_SLACK = _HEAP_SLACK
#: Load placement: keys with no work are kept (so a key that comes back
#: costs no allocation) until they outnumber those with work and this many.
SWEEP_SLACK = _SWEEP_SLACK


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




cdef inline uint32_t _fmix32(uint32_t h) noexcept nogil:
    h ^= h >> 16
    h *= 0x85EBCA6Bu
    h ^= h >> 13
    h *= 0xC2B2AE35u
    h ^= h >> 16
    return h


def mixed_hash(key):
    """MurmurHash3's 32-bit finaliser (``fmix32``) applied to Java's hash of
    ``key``: an unsigned 32-bit int whose every bit depends on every bit of
    the hash (``placement="hash"`` uses it modulo the lane count)."""
    return _fmix32(<uint32_t>(_java_hash(key) & 0xFFFFFFFF))


@cython.freelist(256)
cdef class _Placed:
    """A key's lane and its messages routed there and not yet released
    (``count`` 0: the key has no work, and its lane means nothing)."""
    cdef Py_ssize_t lane
    cdef Py_ssize_t count


cdef struct _Entry:
    int64_t load
    Py_ssize_t lane


cdef inline bint _less(_Entry a, _Entry b) noexcept nogil:
    return a.load < b.load or (a.load == b.load and a.lane < b.lane)


cdef class KeyRouter:
    """Routes each dispatch to lanes by key (see the Python twin's module
    docstring for the placements and the lazy heap).

    ``key_of`` reads a message's key (``None``: ``message.keys``); a key that
    is ``None`` or empty routes the message to its group's keyless lane.
    Not thread-safe: the pull thread is its only caller.  ``ValueError`` for
    a bad lane count or placement.
    """

    cdef readonly Py_ssize_t lanes
    cdef readonly str placement
    cdef readonly Py_ssize_t max_segment
    cdef Py_ssize_t _live
    cdef object _key_of
    cdef bint _fixed
    cdef bint _mixed
    cdef dict _table
    cdef dict _cache
    cdef int64_t* _loads
    cdef _Entry* _heap
    cdef Py_ssize_t _heap_size
    cdef Py_ssize_t _heap_cap
    cdef Py_ssize_t _limit
    cdef unsigned char* _stalled  # per lane: 1 while it takes no new key
    # ``item.keys`` straight from the slot while items are of the slotted
    # class seen last (MessageExt); anything else goes through getattr.
    cdef PyTypeObject* _fast_type
    cdef Py_ssize_t _keys_offset

    def __cinit__(self, lanes, placement="load", key_of=None, max_segment=0):
        if type(lanes) is not int or lanes <= 0:
            raise ValueError(f"lane count must be a positive int, got {lanes!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if type(max_segment) is not int or max_segment < 0:
            raise ValueError(f"max_segment must be an int >= 0, got {max_segment!r}")
        cdef Py_ssize_t n = lanes, i
        self.lanes = n
        self.placement = placement
        self.max_segment = max_segment
        self._live = 0
        self._key_of = key_of
        self._fixed = placement != "load"
        self._mixed = placement == "hash"
        self._table = {}
        self._cache = {}
        self._fast_type = NULL
        self._keys_offset = -1
        self._heap_cap = 2 * n + _HEAP_SLACK
        self._loads = <int64_t*> PyMem_Malloc(n * sizeof(int64_t))
        self._heap = <_Entry*> PyMem_Malloc(self._heap_cap * sizeof(_Entry))
        self._stalled = <unsigned char*> PyMem_Malloc(n * sizeof(unsigned char))
        if self._loads == NULL or self._heap == NULL or self._stalled == NULL:
            raise MemoryError()
        for i in range(n):  # sorted by (load, lane): already a heap
            self._stalled[i] = 0
            self._loads[i] = 0
            self._heap[i].load = 0
            self._heap[i].lane = i
        self._heap_size = n
        self._limit = n

    def __dealloc__(self):
        PyMem_Free(self._loads)
        PyMem_Free(self._heap)
        PyMem_Free(self._stalled)

    @property
    def limit(self):
        """Load placement: a key with no work goes to the least-loaded of
        lanes ``0 .. limit - 1`` (keys with work stay where they are)."""
        return self._limit

    @limit.setter
    def limit(self, value):
        cdef Py_ssize_t v = value, i, old = self._limit
        if v < 1:
            v = 1
        if v > self.lanes:
            v = self.lanes
        self._limit = v
        if v > old and not self._fixed:
            for i in range(old, v):  # their entries may have been dropped meanwhile
                if not self._stalled[i]:
                    self._push(self._loads[i], i)

    def stall(self, lane):
        """Load placement: place no new key on ``lane`` until
        :meth:`unstall` (keys with work there stay).  ``IndexError`` out of
        range; fixed placements ignore it."""
        cdef Py_ssize_t ln = self._lane_index(lane)
        if not self._fixed:
            self._stalled[ln] = 1

    def unstall(self, lane):
        """``lane`` takes new keys again."""
        cdef Py_ssize_t ln = self._lane_index(lane)
        if not self._fixed and self._stalled[ln]:
            self._stalled[ln] = 0
            if ln < self._limit:
                self._push(self._loads[ln], ln)

    @property
    def stalled(self):
        """The lanes that take no new key (see :meth:`stall`)."""
        return frozenset([i for i in range(self.lanes) if self._stalled[i]])

    cdef Py_ssize_t _lane_index(self, object lane) except -1:
        if not 0 <= lane < self.lanes:
            raise IndexError(f"lane {lane} out of range for {self.lanes} lanes")
        return lane

    @property
    def tracks_load(self):
        """Whether releases matter (``placement="load"``)."""
        return not self._fixed

    # -- the key of an item -----------------------------------------------------------

    cdef inline object _key(self, object item):
        cdef PyObject* raw
        if self._key_of is not None:
            return self._key_of(item)
        if Py_TYPE(item) != self._fast_type:
            self._fast_type = NULL
            t = type(item)
            if t.__getattribute__ is object.__getattribute__:
                d = t.__dict__.get("keys")
                if d is not None:
                    self._keys_offset = _slot_offset(<PyObject*>d)
                    if self._keys_offset >= 0:
                        self._fast_type = Py_TYPE(item)
        if self._fast_type != NULL:
            raw = _slot(item, self._keys_offset)
            if raw != NULL:
                return <object>raw
        return item.keys

    # -- the lazy heap ----------------------------------------------------------------

    cdef void _sift_down(self, Py_ssize_t i) noexcept nogil:
        cdef _Entry* h = self._heap
        cdef Py_ssize_t size = self._heap_size, c
        cdef _Entry e = h[i]
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and _less(h[c + 1], h[c]):
                c += 1
            if not _less(h[c], e):
                break
            h[i] = h[c]
            i = c
        h[i] = e

    cdef void _push(self, int64_t load, Py_ssize_t lane) noexcept nogil:
        cdef _Entry* h = self._heap
        cdef Py_ssize_t i, p, n = self.lanes
        cdef _Entry e
        if self._heap_size >= self._heap_cap:  # rebuild: one exact entry per lane in use
            n = self._limit
            for i in range(n):
                h[i].load = self._loads[i]
                h[i].lane = i
            self._heap_size = n
            i = n // 2
            while i > 0:
                i -= 1
                self._sift_down(i)
            return
        e.load = load
        e.lane = lane
        i = self._heap_size
        self._heap_size += 1
        while i > 0:
            p = (i - 1) >> 1
            if not _less(e, h[p]):
                break
            h[i] = h[p]
            i = p
        h[i] = e

    cdef Py_ssize_t _least_loaded(self) noexcept nogil:
        """The lane with the fewest messages among the first ``limit`` not
        stalled, ties to the lowest index."""
        cdef _Entry* h = self._heap
        cdef Py_ssize_t lane, best
        cdef int64_t now
        cdef bint open_
        while self._heap_size > 0:
            lane = h[0].lane
            now = self._loads[lane]
            open_ = lane < self._limit and not self._stalled[lane]
            if h[0].load == now and open_:
                return lane
            if h[0].load < now and open_:
                h[0].load = now
            else:  # stale, a lane past the limit, or a stalled one
                self._heap_size -= 1
                h[0] = h[self._heap_size]
            if self._heap_size > 0:
                self._sift_down(0)
        # Every lane under the limit is stalled: the least-loaded of them.
        best = 0
        for lane in range(1, self._limit):
            if self._loads[lane] < self._loads[best]:
                best = lane
        return best

    # -- routing ----------------------------------------------------------------------

    cdef Py_ssize_t _fixed_lane(self, object key) except -1:
        cdef PyObject* hit = PyDict_GetItemWithError(self._cache, key)
        cdef Py_ssize_t lane
        cdef int64_t h
        if hit != NULL:
            return PyLong_AsSsize_t(<object>hit)
        if PyErr_Occurred():
            raise
        h = _java_hash(key)
        if self._mixed:
            lane = <Py_ssize_t>(<uint64_t>_fmix32(<uint32_t>(h & 0xFFFFFFFF)) % <uint64_t>self.lanes)
        else:
            lane = h % self.lanes  # cdivision off: floorMod
        if len(self._cache) >= _ROUTE_CACHE_LIMIT:
            self._cache.clear()
        PyDict_SetItem(self._cache, key, lane)
        return lane

    def route(self, groups):
        """Route a dispatch into per-lane *segments* in one call.

        ``groups`` holds ``(tag, items, keyless_lane)`` per batch (lite_push
        passes one per polled queue, tagged with its ProcessQueue).  Returns
        ``(segments, counts)``: ``segments[i]`` is ``None`` when lane ``i``
        got nothing, else the list of ``(tag, sub_items)`` routed to it, one
        per group in group order, items in their order; ``counts[i]`` is the
        number of items lane ``i`` got.  ``IndexError`` for a keyless lane
        out of range (nothing of that group is routed)."""
        cdef Py_ssize_t n = self.lanes
        cdef list segments = [None] * n
        cdef list counts = [0] * n
        # lane -> this group's sub-list (a borrowed reference: ``segments``
        # owns it); reset after each group.
        cdef PyObject** cur = <PyObject**> PyMem_Malloc(n * sizeof(PyObject*))
        cdef Py_ssize_t* touched = <Py_ssize_t*> PyMem_Malloc(n * sizeof(Py_ssize_t))
        cdef Py_ssize_t* totals = <Py_ssize_t*> PyMem_Malloc(n * sizeof(Py_ssize_t))
        if cur == NULL or touched == NULL or totals == NULL:
            PyMem_Free(cur); PyMem_Free(touched); PyMem_Free(totals)
            raise MemoryError()
        cdef Py_ssize_t lane, keyless, ntouched = 0, i, j, nitems
        cdef list sub
        cdef tuple seg
        cdef PyObject* hit
        cdef _Placed placed
        cdef dict table = self._table
        cdef bint fixed = self._fixed
        cdef int64_t* loads = self._loads
        cdef Py_ssize_t cap = self.max_segment if self.max_segment > 0 else PY_SSIZE_T_MAX
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
                    if self._key_of is None:
                        _prefetch_keys(items, j, nitems, self._fast_type, self._keys_offset)
                    item = <object>PyList_GET_ITEM(items, j)
                    key = self._key(item)
                    if key is None or (PyUnicode_CheckExact(key) and PyUnicode_GET_LENGTH(key) == 0) or not key:
                        lane = keyless
                    elif fixed:
                        lane = self._fixed_lane(key)
                    else:
                        hit = PyDict_GetItemWithError(table, key)
                        if hit != NULL:
                            placed = <_Placed><object>hit
                            if placed.count == 0:  # back, with no work: placed anew
                                placed.lane = self._least_loaded()
                                self._live += 1
                            lane = placed.lane
                            placed.count += 1
                        else:
                            if PyErr_Occurred():
                                raise
                            lane = self._least_loaded()
                            placed = _Placed.__new__(_Placed)
                            placed.lane = lane
                            placed.count = 1
                            PyDict_SetItem(table, key, placed)
                            self._live += 1
                    if not fixed:
                        loads[lane] += 1
                    if cur[lane] == NULL or PyList_GET_SIZE(<object>cur[lane]) >= cap:
                        if cur[lane] != NULL:  # a full segment: it is counted now
                            totals[lane] += PyList_GET_SIZE(<object>cur[lane])
                        else:
                            touched[ntouched] = lane
                            ntouched += 1
                        # A segment and its (tag, sub) pair are held until the
                        # lane is done with them, thousands at once with a
                        # backlog: out of the cyclic collector's lists (they
                        # hold messages and the tag, nothing that holds them;
                        # see lite_push._kernels.untrack_py).
                        sub = [item]
                        PyObject_GC_UnTrack(<void*>sub)
                        seg = (tag, sub)
                        PyObject_GC_UnTrack(<void*>seg)
                        cur[lane] = <PyObject*>sub
                        segs_obj = segments[lane]
                        if segs_obj is None:
                            segments[lane] = [seg]
                        else:
                            (<list>segs_obj).append(seg)
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

    # -- releases ---------------------------------------------------------------------

    def release(self, lane, items):
        """Lane ``lane`` is done with ``items`` (messages it was routed):
        lower its load; a key whose last message this was has no work left
        and may be placed anew.  ``ValueError`` when an item's key is not
        placed on ``lane`` (a bug: the caller released something twice or on
        the wrong lane).  Fixed placements ignore releases."""
        if not self._fixed:
            self._release(lane, items)

    cdef int _release(self, object lane, object items) except -1:
        cdef Py_ssize_t n = self.lanes
        if not 0 <= lane < n:
            raise IndexError(f"lane {lane} out of range for {n} lanes")
        if not items:
            return 0
        cdef Py_ssize_t ln = lane, j, m
        cdef PyObject* hit
        cdef _Placed placed
        cdef dict table = self._table
        cdef int64_t load
        cdef object prev = None  # the str key released last, and its placed
        m = PyList_GET_SIZE(items)
        for j in range(m):
            if self._key_of is None:
                _prefetch_keys(items, j, m, self._fast_type, self._keys_offset)
            key = self._key(<object>PyList_GET_ITEM(items, j))
            if key is None or (PyUnicode_CheckExact(key) and PyUnicode_GET_LENGTH(key) == 0) or not key:
                continue
            if prev is None or not PyUnicode_CheckExact(key) or not (key is prev or <str>key == <str>prev):
                hit = PyDict_GetItemWithError(table, key)
                if hit == NULL:
                    if PyErr_Occurred():
                        raise
                    raise ValueError(f"release of key {key!r} on lane {ln}: the key is not placed")
                placed = <_Placed><object>hit
                if placed.count != 0 and placed.lane != ln:
                    raise ValueError(f"release of key {key!r} on lane {ln}: the key is placed on lane {placed.lane}")
                prev = key if PyUnicode_CheckExact(key) else None
            # else the key released last again (a segment's messages are
            # mostly one key's): its placed, already checked for this lane
            if placed.count == 0:
                raise ValueError(f"release of key {key!r} on lane {lane}: the key is not placed")
            placed.count -= 1
            if placed.count == 0:
                self._live -= 1
        load = self._loads[ln] - m
        if load < 0:
            raise ValueError(f"release of {m} message(s) on lane {ln}, which holds {self._loads[ln]}")
        self._loads[ln] = load
        self._push(load, ln)
        if PyDict_Size(table) - self._live > max(self._live, <Py_ssize_t>_SWEEP_SLACK):
            self._table = {k: v for k, v in table.items() if (<_Placed>v).count}
        return 0

    def release_from(self, box):
        """Release every ``(lane, items)`` in ``box`` (the lanes append to
        it, the pull thread drains it here); return how many items."""
        cdef Py_ssize_t released = 0
        cdef bint fixed = self._fixed
        cdef tuple entry
        pop = box.popleft
        if not fixed and self._key_of is None and box:
            _prefetch_releases(list(box), self._fast_type, self._keys_offset)
        while box:
            entry = pop()
            if not fixed:
                self._release(entry[0], entry[1])
            released += len(entry[1])
        return released

    # -- introspection ----------------------------------------------------------------

    def loads(self):
        """Per lane, the messages routed to it and not yet released (all 0
        with a fixed placement)."""
        return [self._loads[i] for i in range(self.lanes)]

    def placed_keys(self):
        """How many keys have work routed and not released (0 with a fixed
        placement)."""
        return self._live

    def table_size(self):
        """Keys in the table, with work or kept without (at most the keys
        with work, doubled, plus ``SWEEP_SLACK``)."""
        return len(self._table)

    def lane_of_key(self, key):
        """The lane ``key`` is placed on, or ``None`` when it has no work in
        the consumer (load placement); its fixed lane otherwise."""
        if self._fixed:
            return self._fixed_lane(key)
        placed = self._table.get(key)
        return None if placed is None or not (<_Placed>placed).count else (<_Placed>placed).lane

# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``lite_push._kernels.offsets_py``: the per-queue offset tracker.

A ring of one-byte states with a moving head.  Slot ``(head + off - base) &
mask`` holds the state of offset ``off`` for ``base <= off < next``; every
other slot is GAP.  ``base`` is the lowest offset that may still be in
flight: completing it moves the head over finished and skipped slots
(clearing them), so each offset is added, completed and passed once -- O(1)
amortised.  When nothing is in flight the ring is all GAP and the next add
re-anchors ``base`` at the added offset, so gaps between idle periods cost
nothing.  The ring grows (doubling) to the span of in-flight offsets.
``unfinished()`` scans it from the head: O(span).

Late offsets (see ``_kernels/offsets.py``): a call may start below ``next`` with
offsets not in flight.  The fast path's ordering check compares the first
offset with ``next`` anyway; only its failure takes the slow path
(``_add_late``).  A late offset in ``[base, next)`` turns its GAP or DONE
slot INFLIGHT (the two mean the same to every reader); one below ``base``
moves the window back: the ring is rebuilt with ``base`` there, the old
slots copied above it (``_regrow``); with nothing in flight the all-GAP ring
is re-anchored.  The ring is the span: a late offset far below the others
grows it to that distance at once (flow control pauses the queue after).

Every call validates all its input before it changes anything, as the pure
Python twin does: a ValueError leaves the tracker as it was.
"""

from cpython.bytes cimport PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from libc.string cimport memset

cdef extern from "_slots.h":
    Py_ssize_t _slot_offset "lite_push_slot_offset"(PyObject*)
    PyObject* _slot "lite_push_slot"(object, Py_ssize_t)


cdef class _Reader:
    """Reads ``queue_offset`` and ``len(body)`` of a message: straight from
    the slots when the message's class is the slotted one seen first (no
    custom ``__getattribute__``), else through ``getattr``."""
    cdef PyTypeObject* tp
    cdef Py_ssize_t off_offset
    cdef Py_ssize_t body_offset

    cdef int learn(self, object m) except -1:
        t = type(m)
        self.tp = NULL
        if t.__getattribute__ is not object.__getattribute__:
            return 0
        a = t.__dict__.get("queue_offset")
        b = t.__dict__.get("body")
        if a is None or b is None:
            return 0
        self.off_offset = _slot_offset(<PyObject*>a)
        self.body_offset = _slot_offset(<PyObject*>b)
        if self.off_offset >= 0 and self.body_offset >= 0:
            self.tp = Py_TYPE(m)
        return 0

    cdef inline long long offset(self, object m) except? -1:
        cdef PyObject* v
        if Py_TYPE(m) == self.tp:
            v = _slot(m, self.off_offset)
            if v != NULL and PyLong_CheckExact(<object>v):
                return PyLong_AsLongLong(<object>v)
        return m.queue_offset

    cdef inline Py_ssize_t size(self, object m) except -1:
        cdef PyObject* v
        if Py_TYPE(m) == self.tp:
            v = _slot(m, self.body_offset)
            if v != NULL and PyBytes_CheckExact(<object>v):
                return PyBytes_GET_SIZE(<object>v)
        return len(m.body)


cdef _Reader _READER = _Reader()

#: Offsets are Java longs (RocketMQ, Kafka): 0 <= offset <= MAX_OFFSET.
cdef long long _MAX = 9223372036854775806
MAX_OFFSET = _MAX

cdef enum:
    STACK_BATCH = 128  # batches up to this size need no heap buffer

cdef enum:
    GAP = 0        # not tracked: skipped, finished-and-passed, or outside
    INFLIGHT = 1
    DONE = 2
    MARK = 3       # an INFLIGHT slot named by the call being validated


cdef class OffsetTracker:
    """In-flight offsets of one queue and the lowest one not finished."""

    cdef unsigned char* _ring
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _head
    cdef long long _base
    cdef long long _next
    cdef Py_ssize_t _inflight

    def __cinit__(self, next_offset=0):
        if next_offset < 0:
            raise ValueError(f"next_offset must be >= 0, got {next_offset}")
        if next_offset > MAX_OFFSET + 1:
            raise OverflowError(f"next_offset {next_offset} above {MAX_OFFSET + 1}")
        self._cap = 64
        self._ring = <unsigned char*> PyMem_Malloc(self._cap)
        if self._ring == NULL:
            raise MemoryError()
        memset(self._ring, GAP, self._cap)
        self._head = 0
        self._base = next_offset
        self._next = next_offset
        self._inflight = 0

    def __dealloc__(self):
        PyMem_Free(self._ring)

    # -- internals ---------------------------------------------------------------

    cdef inline unsigned char* _slot(self, long long off) noexcept:
        return &self._ring[(self._head + <Py_ssize_t>(off - self._base)) & (self._cap - 1)]

    cdef int _reserve(self, long long last) except -1:
        """Make room for offsets up to ``last`` (inclusive)."""
        if last - self._base + 1 <= self._cap:
            return 0
        return self._regrow(self._base, last)

    cdef int _regrow(self, long long lo, long long last) except -1:
        """Rebuild the ring with ``base`` at ``lo`` (at most ``base``) and
        room for offsets up to ``last``, keeping the stored slots."""
        # slots above the last added offset may be a skipped gap never stored
        cdef Py_ssize_t used = <Py_ssize_t>min(self._next - self._base, <long long>self._cap)
        cdef Py_ssize_t shift = <Py_ssize_t>(self._base - lo)
        cdef long long need = max(last - lo + 1, <long long>(shift + used))
        cdef Py_ssize_t cap = self._cap, i
        cdef unsigned char* ring
        while cap < need:
            cap *= 2
        ring = <unsigned char*> PyMem_Malloc(cap)
        if ring == NULL:
            raise MemoryError()
        memset(ring, GAP, cap)
        for i in range(used):
            ring[shift + i] = self._ring[(self._head + i) & (self._cap - 1)]
        PyMem_Free(self._ring)
        self._ring = ring
        self._cap = cap
        self._head = 0
        self._base = lo
        return 0

    cdef inline bint _is_inflight(self, long long off) noexcept:
        # In-flight slots lie within the first ``cap`` slots from the head.
        if self._inflight == 0 or off < self._base or off - self._base >= self._cap:
            return False
        return self._slot(off)[0] == INFLIGHT

    cdef int _make_room(self, long long lo, long long last) except -1:
        """Room for late offsets ``lo`` to ``last`` (``lo < next``)."""
        cdef long long top
        if self._inflight == 0:
            # The ring is all GAP: re-anchor it at the lowest new offset.
            self._base = lo
            self._head = 0
            return self._reserve(last)
        if lo >= self._base:
            return self._reserve(last)
        # Below the window: move it back, keeping every slot that may be in
        # flight (the first ``min(next - base, cap)``).
        top = self._base + min(self._next - self._base, <long long>self._cap) - 1
        return self._regrow(lo, max(last, top))

    cdef int _add_late(self, long long* offs, Py_ssize_t n, long long nxt) except -1:
        """The slow path of an add whose first offset is below ``next``;
        ``nxt`` is the checked ``next_offset`` argument, or -1."""
        cdef Py_ssize_t i
        cdef long long prev = -1
        cdef long long off
        for i in range(n):
            off = offs[i]
            if off <= prev:
                if off < 0:
                    raise ValueError(f"offset {off} is negative")
                raise ValueError(f"offset {off} added after {prev}: offsets must increase")
            if off < self._next and self._is_inflight(off):
                raise ValueError(f"offset {off} is already in flight")
            prev = off
        if prev > _MAX:
            raise OverflowError(f"offset {prev} outside [0, {MAX_OFFSET}]")
        self._make_room(offs[0], prev)
        for i in range(n):
            self._slot(offs[i])[0] = INFLIGHT
        self._inflight += n
        if prev >= self._next:
            self._next = prev + 1
        if nxt > self._next:
            self._next = nxt
        return 0

    cdef inline int _put(self, long long off) except -1:
        # caller validated off >= _next
        if self._inflight == 0:
            self._base = off
            self._head = 0
        elif off - self._base >= self._cap:
            self._reserve(off)
        self._slot(off)[0] = INFLIGHT
        self._inflight += 1
        self._next = off + 1
        return 0

    cdef inline void _advance(self) noexcept:
        cdef Py_ssize_t mask = self._cap - 1
        cdef unsigned char* ring = self._ring
        cdef Py_ssize_t head = self._head
        cdef long long base = self._base
        cdef long long nxt = self._next
        cdef Py_ssize_t used
        if self._inflight == 0:
            # Everything is finished: clear what the ring holds and re-anchor
            # (the region above the last added offset may be a long skipped
            # gap that was never stored).
            used = <Py_ssize_t>min(nxt - base, <long long>self._cap)
            if used * 2 > self._cap:
                memset(ring, GAP, self._cap)
            else:
                while used > 0:
                    ring[head] = GAP
                    head = (head + 1) & mask
                    used -= 1
            self._head = 0
            self._base = nxt
            return
        # An in-flight offset lies ahead within the ring: the loop stops there.
        while ring[head] != INFLIGHT:
            ring[head] = GAP
            head = (head + 1) & mask
            base += 1
        self._head = head
        self._base = base

    cdef int _mark(self, long long off) except -1:
        cdef unsigned char* s
        if off < self._base or off >= self._next:
            raise ValueError(f"offset {off} is not in flight")
        s = self._slot(off)
        if s[0] == MARK:
            raise ValueError(f"offset {off} completed twice")
        if s[0] != INFLIGHT:
            raise ValueError(f"offset {off} is not in flight")
        s[0] = MARK
        return 0

    cdef void _unmark(self, long long* offs, Py_ssize_t n) noexcept:
        cdef Py_ssize_t i
        cdef unsigned char* s
        for i in range(n):
            s = self._slot(offs[i])
            if s[0] == MARK:
                s[0] = INFLIGHT

    cdef int _complete_array(self, long long* offs, Py_ssize_t n) except -1:
        cdef Py_ssize_t i
        for i in range(n):
            try:
                self._mark(offs[i])
            except ValueError:
                self._unmark(offs, i)
                raise
        for i in range(n):
            self._slot(offs[i])[0] = DONE
        self._inflight -= n
        self._advance()
        return 0

    cdef int _add_array(self, long long* offs, Py_ssize_t n, object next_offset) except -1:
        cdef Py_ssize_t i
        cdef long long prev = self._next - 1
        cdef long long nxt = -1
        if next_offset is not None:
            if next_offset > MAX_OFFSET + 1:
                raise OverflowError(f"next_offset {next_offset} above {MAX_OFFSET + 1}")
            nxt = next_offset
        for i in range(n):
            if offs[i] <= prev:
                if i == 0:  # the first offset is below next: late offsets
                    return self._add_late(offs, n, nxt)
                raise ValueError(f"offset {offs[i]} added after {prev}: offsets must increase")
            prev = offs[i]
        if n and prev > _MAX:
            raise OverflowError(f"offset {prev} outside [0, {MAX_OFFSET}]")
        if n:
            if self._inflight == 0:
                self._base = offs[0]
                self._head = 0
            self._reserve(offs[n - 1])
            for i in range(n):
                self._slot(offs[i])[0] = INFLIGHT
            self._inflight += n
            self._next = offs[n - 1] + 1
        if nxt > self._next:
            self._next = nxt
        return 0

    # -- adding -------------------------------------------------------------------

    def add(self, offset):
        """Track ``offset`` as in flight; it must not be in flight already.
        Below :attr:`next_offset` it is a late offset (see the module
        docstring)."""
        cdef long long late
        if offset < self._next:
            if offset < 0:
                raise ValueError(f"offset {offset} is negative")
            late = offset
            self._add_late(&late, 1, -1)
            return
        if offset > MAX_OFFSET:
            raise OverflowError(f"offset {offset} outside [0, {MAX_OFFSET}]")
        self._put(offset)

    def add_many(self, offsets, next_offset=None):
        """Track strictly increasing ``offsets``, none in flight already (the
        first may lie below :attr:`next_offset`: late offsets); then move the
        high-water mark to ``next_offset`` if that is higher (skipped
        offsets)."""
        self._many(offsets, True, next_offset)

    cdef int _many(self, offsets, bint add, object next_offset) except -1:
        """Copy ``offsets`` into a C buffer, then add or complete them."""
        cdef Py_ssize_t n, i = 0
        if not isinstance(offsets, (list, tuple)):
            offsets = list(offsets)
        n = len(offsets)
        cdef long long* buf = <long long*> PyMem_Malloc(max(n, 1) * sizeof(long long))
        if buf == NULL:
            raise MemoryError()
        try:
            for off in offsets:
                buf[i] = off
                i += 1
            if add:
                self._add_array(buf, n, next_offset)
            else:
                self._complete_array(buf, n)
        finally:
            PyMem_Free(buf)
        return 0

    def add_range(self, long long start, long long stop):
        """Track ``range(start, stop)``, none of it in flight already."""
        cdef long long off
        if stop <= start:
            return
        if start < self._next:  # late: the slow path, one offset at a time
            if start < 0:
                raise ValueError(f"offset {start} is negative")
            if stop - 1 > _MAX:
                raise OverflowError(f"offset {stop - 1} outside [0, {_MAX}]")
            self._many(range(start, stop), True, None)
            return
        if stop - 1 > _MAX:
            raise OverflowError(f"offset {stop - 1} outside [0, {_MAX}]")
        if self._inflight == 0:
            self._base = start
            self._head = 0
        self._reserve(stop - 1)
        for off in range(start, stop):
            self._slot(off)[0] = INFLIGHT
        self._inflight += <Py_ssize_t>(stop - start)
        self._next = stop

    def add_batch(self, messages, next_offset=None):
        """Track the ``queue_offset`` of each message (increasing, none in
        flight already; late ones first), move the high-water mark to
        ``next_offset``; return the sum of ``len(body)``."""
        return self._batch(messages, True, next_offset)

    cdef Py_ssize_t _batch(self, messages, bint add, object next_offset) except -1:
        """Read the messages' offsets and body sizes, then add or complete
        the offsets; return the body bytes."""
        cdef Py_ssize_t n = len(messages), i
        cdef Py_ssize_t size = 0
        cdef _Reader r = _READER
        cdef long long small[STACK_BATCH]
        cdef long long* buf = small
        if n > STACK_BATCH:
            buf = <long long*> PyMem_Malloc(n * sizeof(long long))
            if buf == NULL:
                raise MemoryError()
        try:
            for i in range(n):
                m = messages[i]
                if Py_TYPE(m) != r.tp:
                    r.learn(m)
                buf[i] = r.offset(m)
                size += r.size(m)
            if add:
                self._add_array(buf, n, next_offset)
            else:
                self._complete_array(buf, n)
        finally:
            if buf != small:
                PyMem_Free(buf)
        return size

    # -- completing ---------------------------------------------------------------

    def complete(self, long long offset):
        """Mark the in-flight ``offset`` finished."""
        self._complete_array(&offset, 1)

    def complete_many(self, offsets):
        """Mark several distinct in-flight offsets finished."""
        self._many(offsets, False, None)

    def complete_batch(self, messages):
        """Mark the messages' offsets finished; return the sum of their
        ``len(body)``."""
        return self._batch(messages, False, None)

    # -- reading ------------------------------------------------------------------

    def lowest_unfinished(self):
        """The committable offset: the lowest in-flight offset, or one past
        the highest added or skipped offset when nothing is in flight.  A
        late offset can move it down."""
        return self._base if self._inflight else self._next

    def unfinished(self):
        """The in-flight offsets (added, not finished), in increasing order."""
        cdef unsigned char* ring = self._ring
        cdef Py_ssize_t mask = self._cap - 1
        cdef Py_ssize_t head = self._head
        cdef Py_ssize_t left = self._inflight
        cdef long long off = self._base
        # Scan from the head to the last in-flight offset: O(span).  The
        # in-flight slots lie within the first ``min(next - base, cap)``
        # slots (above the last added offset the ring is GAP or not stored),
        # so the bound only guards the loop.
        cdef long long stop = self._base + min(self._next - self._base, <long long>self._cap)
        cdef list out = []
        while left > 0 and off < stop:
            if ring[head] == INFLIGHT:
                out.append(off)
                left -= 1
            head = (head + 1) & mask
            off += 1
        return out

    @property
    def in_flight(self):
        """Offsets added and not finished."""
        return self._inflight

    @property
    def span(self):
        """One past the highest added or skipped offset, minus the lowest
        unfinished (0 when nothing is in flight)."""
        return self._next - self._base if self._inflight else 0

    @property
    def next_offset(self):
        """One past the highest offset added or skipped."""
        return self._next

# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``lite_push._kernels.lanemetrics_py``: one lane's distributions
(listener time, time in the lane, end-to-end latency), recorded once per
segment by the lane's task.

The Python twin spends about a microsecond per segment on two clock reads
and two bucket searches, which is a measurable share of a segment of one or
two messages; here the clocks are read with ``clock_gettime`` and a bucket
is found by a scan of at most :data:`MAX_BOUNDS` doubles.  Every method
holds the GIL from start to end, so a scrape reading :meth:`snapshot`
never sees half an update.  Semantics (``le`` buckets, NaN in the first,
negative end-to-end latency counted as 0, input checks) are the twin's.
"""

from libc.string cimport memset
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from lite_push._kernels.lanemetrics_py import check_bounds

cdef enum:
    _MAX = 32

#: The most bucket bounds a distribution may have.
MAX_BOUNDS = _MAX


cdef struct Dist:
    Py_ssize_t nb
    double bounds[_MAX]
    long long counts[_MAX + 1]
    double total


cdef inline double _read(int which) noexcept nogil:
    cdef timespec ts
    clock_gettime(which, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


def clock():
    """The monotonic clock of ``t0`` and of put stamps, in seconds
    (``CLOCK_MONOTONIC``, the clock of ``time.perf_counter`` on Linux)."""
    return _read(CLOCK_MONOTONIC)


cdef inline void _observe(Dist* d, double v, long long n) noexcept nogil:
    # bisect_left over the bounds: the first bound >= v (NaN: none is <)
    cdef Py_ssize_t i = 0
    while i < d.nb and d.bounds[i] < v:
        i += 1
    d.counts[i] += n
    d.total += v * <double>n


cdef void _init(Dist* d, tuple bounds):
    cdef Py_ssize_t i
    memset(d, 0, sizeof(Dist))
    d.nb = len(bounds)
    for i in range(d.nb):
        d.bounds[i] = bounds[i]


cdef tuple _copy(Dist* d):
    return ([d.counts[i] for i in range(d.nb + 1)], d.total)


cdef class LaneMetrics:
    """One lane's three distributions; written by the lane's task only."""

    cdef Dist _listener
    cdef Dist _wait
    cdef Dist _e2e

    def __init__(self, listener_bounds, wait_bounds, e2e_bounds):
        _init(&self._listener, check_bounds("listener_bounds", listener_bounds))
        _init(&self._wait, check_bounds("wait_bounds", wait_bounds))
        _init(&self._e2e, check_bounds("e2e_bounds", e2e_bounds))

    cdef inline int _completed(self, object first, object last, Py_ssize_t n, double wall) except -1:
        cdef double stored = first.store_timestamp
        cdef double v
        if stored > 0:
            v = wall - (stored + <double>last.store_timestamp) / 2000.0
            _observe(&self._e2e, v if v > 0.0 else 0.0, n)
        return 0

    cdef inline int _segment(self, double t0, object msgs, double now, double wall) except -1:
        cdef Py_ssize_t n = len(msgs)
        if n == 0:
            raise ValueError("a segment of no messages")
        _observe(&self._listener, (now - t0) / n, n)
        return self._completed(msgs[0], msgs[n - 1], n, wall)

    def segment(self, double t0, msgs):
        """A segment processed from ``t0`` (:func:`clock`) to now, all of
        it successfully: :meth:`call` then :meth:`completed`."""
        self._segment(t0, msgs, _read(CLOCK_MONOTONIC), _read(CLOCK_REALTIME))

    def segment_at(self, double t0, msgs, double now, double wall):
        """:meth:`segment` with the clocks read as ``now`` and ``wall``."""
        self._segment(t0, msgs, now, wall)

    def call(self, double t0, Py_ssize_t n):
        """One listener call on ``n`` messages that started at ``t0``: the
        call's time divided over its messages."""
        self.call_at(t0, n, _read(CLOCK_MONOTONIC))

    def call_at(self, double t0, Py_ssize_t n, double now):
        """:meth:`call` with the clock read as ``now``."""
        if n < 1:
            raise ValueError(f"a call on {n} messages")
        _observe(&self._listener, (now - t0) / n, n)

    def completed(self, first, last, Py_ssize_t n):
        """``n`` messages from ``first`` to ``last`` finished now: the mean
        of their store timestamps stands for all (they were stored
        together).  Nothing when ``first`` has no store timestamp."""
        self._completed(first, last, n, _read(CLOCK_REALTIME))

    def completed_at(self, first, last, Py_ssize_t n, double wall):
        """:meth:`completed` with the wall clock read as ``wall``."""
        self._completed(first, last, n, wall)

    def waited(self, stamps):
        """Puts of ``(clock() when put, messages)`` taken now."""
        self.waited_at(stamps, _read(CLOCK_MONOTONIC))

    def waited_at(self, stamps, double now):
        """:meth:`waited` with the clock read as ``now``."""
        cdef double at
        cdef long long n
        for at, n in stamps:
            _observe(&self._wait, now - at, n)

    def snapshot(self):
        """``(counts, sum)`` of the listener, wait and end-to-end
        distributions (copies)."""
        return (_copy(&self._listener), _copy(&self._wait), _copy(&self._e2e))

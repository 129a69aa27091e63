"""The lane worker: what one lane does with the work it takes.

One :class:`LaneWorker` per lane, used only by the task that drains the lane
(a thread or a coroutine), so its parked keys need no lock.  It is written
once for both executors; an executor only takes work from the lane and calls
the listener (plainly, or with ``await``).  The worker hands it the messages
to call the listener with, as *steps*: a generator that yields each list of
messages and is sent back ``(exception, result)`` of that call.

* **Hot path** (no key parked in the lane, ``batch_size`` 1): the executor
  calls the listener per message inline, then :meth:`LaneWorker.completed`;
  on the first failure :meth:`LaneWorker.failed_at` takes over.
* **Slow path** (:meth:`LaneWorker.segment_steps`): while keys are parked in
  this lane, a message of a parked key queues up behind it instead of
  running; with ``batch_size`` > 1 messages go in chunks.
* **Failures** (:meth:`LaneWorker.fail`): per mode and attempt count a
  message is parked (KEY_ORDERLY: its key waits ``suspend_ms`` on the
  consumer's one timer while the lane goes on with other keys), sent back
  to the retry topic (CONCURRENTLY) or dead-lettered; sends are handed off to
  the pull thread, which completes the offsets once the source stored them.
* **Due keys** (:meth:`LaneWorker.due_steps`): the timer hands a parked key
  back to its lane; its head is retried, then what queued behind it, in
  order, until one fails again.
* **Rate limits** (``_rate_limit``): with ``max_rate`` every call first
  reserves its start, and the steps yield :data:`PAUSE` when it must wait
  (the executor waits until :attr:`LaneWorker.pause_until`); with
  ``key_min_interval`` a message whose key started less than the interval
  ago is held on the timer like a parked key, and the lane goes on with its
  other keys.  Either sends every segment the slow way.

Messages of a revoked queue, or any after the shutdown deadline, are
skipped: left unfinished, so they stay uncommitted and run again.

**Fencing**: before every listener call the lane checks that the queue's
ownership is still certain (``ProcessQueue.owned_until``, renewed by the pull
thread from the source's heartbeats).  Past it the steps yield
:data:`FENCED` instead of messages, and the executor waits
(:data:`FENCE_WAIT`) until the fence moves (a late heartbeat that still
found the queue ours) or the queue is dropped (the loss confirmed: its
messages are skipped, uncommitted, for the next owner).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Hashable
from dataclasses import replace

from ._failures import Parked, SendItem, classify
from ._lanemetrics import LaneMetrics
from ._lanes import Segment
from ._process_queue import ProcessQueue
from ._runtime import Runtime, per_queue
from ._types import ConsumeResult, MessageExt

__all__ = ["FENCED", "FENCE_WAIT", "PACED", "PAUSE", "PURGE", "LaneWorker", "Steps"]

logger = logging.getLogger(__name__)

#: Lane token: skip the parked messages of revoked queues.
PURGE = object()

#: Listener calls to make: yields the messages of each call, is sent back
#: ``(exception, result)`` of it.
Steps = Generator[list[MessageExt], tuple[BaseException | None, object], None]

#: Yielded by steps instead of messages: the queue's ownership is not
#: certain now; wait :data:`FENCE_WAIT` and send back anything.
FENCED: list[MessageExt] = []
#: Seconds a fenced lane waits before it looks again.
FENCE_WAIT = 0.01
#: Yielded by steps instead of messages: ``max_rate`` says the next call
#: starts at :attr:`LaneWorker.pause_until`; wait, send back anything.
PAUSE: list[MessageExt] = []
#: The reason of a key held for its minimum interval (not a failure).
PACED = "key interval"

_SUCCESS = ConsumeResult.SUCCESS


def _pace_key(rt: Runtime, msg: MessageExt) -> str | None:
    """The key ``key_min_interval`` paces (``None``: a keyless message, not
    paced)."""
    key_of = rt.key_of
    return (msg.keys if key_of is None else key_of(msg)) or None


def _no_steps() -> Steps:
    return
    yield  # a generator that yields nothing


class LaneWorker:
    """The lane logic of lane ``index`` (see the module docstring)."""

    __slots__ = ("_release", "_rt", "aborted", "hot", "index", "metrics", "monotonic", "parked", "pause_until")

    def __init__(self, runtime: Runtime, index: int) -> None:
        self._rt = runtime
        self.index = index
        #: The lane's histogram recorder (``None``: metrics off).
        self.metrics: LaneMetrics | None = None if runtime.lane_metrics is None else runtime.lane_metrics[index]
        #: Keys parked in this lane, owned by this lane's task alone (the
        #: executor's hot path reads it: empty, no segment waits behind one).
        self.parked: dict[Hashable, Parked] = {}
        #: The consumer's clock, which fences are on (read before every call).
        self.monotonic = runtime.clock.monotonic
        #: One listener call per message (``batch_size`` 1) and no rate
        #: limit: the hot path applies.
        self.hot = runtime.config.batch_size == 1 and runtime.limiter is None and runtime.pacer is None
        #: After steps yielded :data:`PAUSE`: when (the consumer clock's
        #: ``monotonic``) the call may start.
        self.pause_until = 0.0
        #: Whether the shutdown deadline passed (lanes skip what is left).
        self.aborted = runtime.abort.is_set
        # Load placement: hands the router what this lane is done with, so
        # a key with nothing left here may go to another lane (``None``:
        # a fixed placement, or not KEY_ORDERLY).
        released = runtime.released
        self._release = None if released is None else released.append

    def _done_with(self, msgs: list[MessageExt]) -> None:
        """This lane will not touch ``msgs`` again (completed, handed off
        to be stored elsewhere, or skipped): tell the router, per batch."""
        if self._release is not None and msgs:
            self._release((self.index, msgs))

    # -- taking work -----------------------------------------------------------------

    def idle(self) -> None:
        """The task is about to wait for work."""
        self._rt.counters.busy[self.index] = False

    def busy(self) -> None:
        """The task holds work it has not started (waiting for a slot)."""
        self._rt.counters.busy[self.index] = True

    def took(
        self, taken: tuple[list[Segment], list[object]], stamps: list[tuple[float, int]]
    ) -> tuple[list[Segment], list[object]]:
        """The task took ``taken`` from the lane (``stamps``: when it was
        put, for the lane-wait metric)."""
        self._rt.counters.busy[self.index] = True
        if self.metrics is not None and stamps:
            self.metrics.waited(stamps)
        return taken

    def wait_fenced(self) -> None:
        """Thread executor: wait :data:`FENCE_WAIT` (less at shutdown)
        after steps yielded :data:`FENCED`."""
        self._rt.clock.wait(self._rt.abort, FENCE_WAIT)

    def wait_paused(self) -> None:
        """Thread executor: wait until :attr:`pause_until` (less at shutdown)
        after steps yielded :data:`PAUSE`."""
        rt = self._rt
        while (left := self.pause_until - self.monotonic()) > 0.0 and not rt.clock.wait(rt.abort, left):
            pass

    def stop(self) -> None:
        """The task stops: parked messages stay unfinished (uncommitted;
        the offset map keeps what finished above them)."""
        counters = self._rt.counters
        counters.busy[self.index] = False
        items = [item for p in self.parked.values() for item in p.items]
        for pq, ms in per_queue(items).items():
            pq.skip(ms)
        self._done_with([m for _, m in items])
        self.parked.clear()
        counters.parked[self.index] = 0

    def crashed(self, exc: BaseException) -> None:
        """A bug in the lane itself (not the listener's failure, which is
        handled): logged; its messages stay unfinished."""
        logger.error(
            "consumer %r: lane %d failed; the consumer stops", self._rt.config.group, self.index, exc_info=exc
        )
        self._rt.fail(exc)

    # -- segments --------------------------------------------------------------------

    def segment_steps(self, pq: ProcessQueue, msgs: list[MessageExt]) -> Steps | None:
        """``None``: run ``msgs`` on the hot path (one listener call per
        message, then :meth:`completed`).  Otherwise the steps to drive
        instead: the slow path, or nothing (a revoked queue's messages, or
        after the shutdown deadline, are skipped)."""
        if pq.dropped or self._rt.abort.is_set():
            pq.skip(msgs)
            self._done_with(msgs)
            return _no_steps()
        if self.parked or not self.hot:
            return self._slow_steps(pq, msgs)
        return None

    def completed(self, pq: ProcessQueue, msgs: list[MessageExt], t0: float) -> None:
        """The hot path processed a whole segment (listener calls from
        ``t0`` on, the recorder's clock)."""
        pq.complete(msgs)
        self._rt.counters.consumed[self.index] += len(msgs)
        if self._release is not None:
            self._release((self.index, msgs))
        if self.metrics is not None:
            self.metrics.segment(t0, msgs)

    def failed_at(
        self, pq: ProcessQueue, msgs: list[MessageExt], j: int, exc: BaseException | None, result: object
    ) -> Steps:
        """The hot path stopped at ``msgs[j]``: complete what came before;
        then either the listener failed it (``exc`` set, or a result other
        than success: handle the failure) or the queue's fence was reached
        (it was not called).  The rest goes the slow way (the steps
        returned), which waits at the fence."""
        if j:
            head = msgs[:j]
            pq.complete(head)
            self._rt.counters.consumed[self.index] += j
            self._done_with(head)
        if exc is None and (result is None or result is _SUCCESS):
            return self._slow_steps(pq, msgs[j:])  # fenced before msgs[j]
        self.fail(pq, [msgs[j]], exc, result)
        rest = msgs[j + 1 :]
        return self._slow_steps(pq, rest) if rest else _no_steps()

    def _owner_steps(self, pq: ProcessQueue) -> Generator[list[MessageExt], object, bool]:
        """Past ``pq``'s fence: yield :data:`FENCED` until it moves (return
        True) or the queue is dropped or the shutdown deadline passed
        (return False: skip its messages)."""
        rt = self._rt
        said = False
        while True:
            if pq.dropped or rt.abort.is_set():
                return False
            if self.monotonic() < pq.owned_until:
                if said:
                    logger.info("consumer %r: lane %d goes on with %s", rt.config.group, self.index, pq.queue)
                return True
            if not said:
                said = True
                logger.warning(
                    "consumer %r: lane %d stops at %s: its ownership is not certain (no heartbeat for too long); "
                    "it waits until the source renews or revokes it",
                    rt.config.group, self.index, pq.queue,
                )  # fmt: skip
            yield FENCED

    def _slow_steps(self, pq: ProcessQueue, msgs: list[MessageExt]) -> Steps:
        """Yield the chunks (up to ``batch_size``) of a segment to process:
        a message of a parked key queues up behind it instead, and one whose
        key started less than ``key_min_interval`` ago is held for it.
        Failed chunks are parked, sent back or dead-lettered; the rest is
        completed at the end, at once."""
        rt = self._rt
        idx = self.index
        parked = self.parked
        size = rt.config.batch_size
        park_key = self._park_key
        pacer = rt.pacer
        done: list[MessageExt] = []
        chunk: list[MessageExt] = []
        keys: list[Hashable] = []  # pacing: the keys of the chunk
        last = len(msgs) - 1
        for i, m in enumerate(msgs):
            p = parked.get(park_key(pq, m)) if parked else None
            if p is not None:
                p.items.append((pq, m))
                rt.counters.parked[idx] += 1
            elif pacer is None:
                chunk.append(m)
            else:
                key = _pace_key(rt, m)
                at = 0.0
                if key is not None:
                    now = self.monotonic()
                    at = now + pacer.interval if key in keys else pacer.due(key, now)
                if at:
                    self._hold([(pq, m)], key, at, 1)
                else:
                    chunk.append(m)
                    if key is not None:
                        keys.append(key)
            if not chunk or (len(chunk) < size and i < last):
                continue
            if rt.limiter is not None:
                yield from self._rate(len(chunk))
            if rt.abort.is_set() or (self.monotonic() >= pq.owned_until and not (yield from self._owner_steps(pq))):
                pq.skip(chunk)
                self._done_with(chunk)
                chunk = []
                keys = []
                continue
            if keys:
                pacer.started_all(keys, self.monotonic())  # type: ignore[union-attr]
                keys = []
            exc, result = yield chunk
            if exc is None and (result is None or result is _SUCCESS):
                done += chunk
            else:
                self.fail(pq, chunk, exc, result)
            chunk = []
        if done:
            pq.complete(done)
            rt.counters.consumed[idx] += len(done)
            self._done_with(done)
            if self.metrics is not None:
                self.metrics.completed(done[0], done[-1], len(done))

    # -- rate limits -----------------------------------------------------------------

    def _rate(self, n: int) -> Generator[list[MessageExt], object, None]:
        """``max_rate``: reserve the start of a call of ``n`` messages;
        yield :data:`PAUSE` when it must wait."""
        now = self.monotonic()
        wait = self._rt.limiter.reserve(n, now)  # type: ignore[union-attr]
        if wait > 0.0:
            self.pause_until = now + wait
            yield PAUSE

    def _hold(self, items: list[tuple[ProcessQueue, MessageExt]], key: Hashable, at: float, new: int) -> None:
        """Park ``key`` until ``at`` for its minimum interval (not a failed
        attempt: its messages run as they are), with ``items`` waiting (the
        last ``new`` of them were not parked before)."""
        rt = self._rt
        p = self.parked[key] = Parked(next(rt.park_generations), PACED, "")
        p.items = items
        rt.counters.parked[self.index] += new
        rt.counters.paced[self.index] += 1
        if rt.timer.add(at, self.index, (key, p.gen)):
            rt.source.wakeup()  # the pull thread may be waiting past it

    # -- failures --------------------------------------------------------------------

    def _park_key(self, pq: ProcessQueue, msg: MessageExt) -> Hashable:
        """What a failure parks: the message's key, or its queue when it has
        none (keyless messages keep queue order, so they wait together)."""
        key_of = self._rt.key_of
        key = msg.keys if key_of is None else key_of(msg)
        return key if key else pq.queue

    def fail(self, pq: ProcessQueue, chunk: list[MessageExt], exc: BaseException | None, result: object) -> None:
        """The listener failed ``chunk``: park, send back or dead-letter
        each message, per mode and attempt count."""
        if pq.dropped:
            pq.skip(chunk)
            self._done_with(chunk)
            return
        rt = self._rt
        cfg = rt.config
        idx = self.index
        parked = self.parked
        dead_now, reason, text = classify(exc, result)
        rt.counters.retried[idx] += len(chunk)
        first = chunk[0]
        logger.warning(
            "consumer %r: %s for %d message(s) from %s offset %d (attempt %d)",
            cfg.group, reason, len(chunk), pq.queue, first.queue_offset, first.reconsume_times + 1,
            exc_info=exc if exc is not None and first.reconsume_times == 0 else None,
        )  # fmt: skip
        limit = cfg.max_reconsume_times
        out: list[SendItem] = []
        keyed = rt.keyed
        for m in chunk:
            p = parked.get(self._park_key(pq, m)) if keyed and parked else None
            if p is not None:
                # An earlier message of its key (same batch) parked it: wait behind.
                p.items.append((pq, m))
                rt.counters.parked[idx] += 1
            elif dead_now or 0 <= limit <= m.reconsume_times:
                out.append(SendItem(pq, m, True, reason, text))
            elif keyed:
                self._park(pq, replace(m, reconsume_times=m.reconsume_times + 1), reason, text)
            else:
                level = cfg.retry_start_level + m.reconsume_times
                out.append(SendItem(pq, m, False, reason, text, level))
        if out:
            rt.hand_off(out)
            self._done_with([item.message for item in out])

    def _park(self, pq: ProcessQueue, retry: MessageExt, reason: str, text: str) -> None:
        rt = self._rt
        key = self._park_key(pq, retry)
        p = self.parked[key] = Parked(next(rt.park_generations), reason, text)
        p.items.append((pq, retry))
        rt.counters.parked[self.index] += 1
        if rt.timer.add(rt.clock.monotonic() + rt.config.suspend_ms / 1000.0, self.index, (key, p.gen)):
            rt.source.wakeup()  # the pull thread may be waiting past the new due time

    # -- due keys --------------------------------------------------------------------

    def due_steps(self, due: list[object]) -> Steps:
        """Yield, one at a time, the messages of the parked keys whose time
        came: the head first, then the messages that queued behind it, in
        order, until one fails again (then the key is parked again with what
        still waits behind it) or, with ``key_min_interval``, until the next
        one must wait for its interval (then the key is held with the rest)."""
        rt = self._rt
        idx = self.index
        parked = self.parked
        counters = rt.counters
        limit = rt.config.max_reconsume_times
        pacer = rt.pacer
        for token in due:
            if token is PURGE:
                self._purge()
                continue
            key: Hashable
            gen: int
            key, gen = token  # type: ignore[misc]
            p = parked.get(key)
            if p is None or p.gen != gen:
                continue  # stale: the key was purged or parked again since
            items = p.items
            done: list[tuple[ProcessQueue, MessageExt]] = []
            out: list[SendItem] = []
            again = None
            held = 0.0  # pacing: the rest waits until then
            skipped = 0
            while items:
                pq, m = items[0]
                live = not (pq.dropped or rt.abort.is_set())
                pace = _pace_key(rt, m) if pacer is not None and live else None
                if pace is not None:
                    held = pacer.due(pace, self.monotonic())  # type: ignore[union-attr]
                    if held:
                        break
                if rt.limiter is not None and live:
                    yield from self._rate(1)
                if (
                    not live
                    or pq.dropped
                    or rt.abort.is_set()
                    or (self.monotonic() >= pq.owned_until and not (yield from self._owner_steps(pq)))
                ):
                    pq.skip([m])
                    items.pop(0)
                    skipped += 1
                    self._done_with([m])
                    continue
                if pace is not None:
                    pacer.started(pace, self.monotonic())  # type: ignore[union-attr]
                exc, result = yield [m]
                items.pop(0)
                if exc is None and (result is None or result is _SUCCESS):
                    done.append((pq, m))
                    continue
                dead_now, reason, text = classify(exc, result)
                counters.retried[idx] += 1
                logger.warning(
                    "consumer %r: %s for %s offset %d (attempt %d)",
                    rt.config.group, reason, pq.queue, m.queue_offset, m.reconsume_times + 1,
                )  # fmt: skip
                if dead_now or 0 <= limit <= m.reconsume_times:
                    out.append(SendItem(pq, m, True, reason, text))
                    continue  # the key moves on
                again = (pq, replace(m, reconsume_times=m.reconsume_times + 1), reason, text)
                break
            counters.parked[idx] -= skipped + len(done) + len(out) + (1 if again else 0)
            for pq, ms in per_queue(done).items():
                pq.complete(ms)
            counters.consumed[idx] += len(done)
            self._done_with([m for _, m in done])
            if done and self.metrics is not None:
                self.metrics.completed(done[0][1], done[-1][1], len(done))
            if out:
                rt.hand_off(out)
                self._done_with([item.message for item in out])
            del parked[key]
            if again is not None:  # parked again, with what still waits behind it
                pq, retry, reason, text = again
                self._park(pq, retry, reason, text)
                parked[key].items += items
            elif held:  # held for the key's interval, with what waits behind
                self._hold(items, key, held, 0)

    def _purge(self) -> None:
        """Skip the parked messages of revoked queues."""
        parked = self.parked
        dropped: list[tuple[ProcessQueue, MessageExt]] = []
        for key in list(parked):
            p = parked[key]
            keep = [(pq, m) for pq, m in p.items if not pq.dropped]
            dropped += [(pq, m) for pq, m in p.items if pq.dropped]
            if keep:
                p.items = keep
            else:
                del parked[key]
        self._rt.counters.parked[self.index] -= len(dropped)
        for pq, ms in per_queue(dropped).items():
            pq.skip(ms)
        self._done_with([m for _, m in dropped])

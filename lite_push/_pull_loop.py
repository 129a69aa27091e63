"""The pull loop: the one thread that talks to the source.

Each turn: ``poll`` (the source runs the rebalance callbacks inside it, see
``_assignment``), **track** each batch in its queue's ProcessQueue (offsets
in flight; the committed offset map's finished offsets dropped), keep
polling without waiting while more is ready (up to ``DISPATCH_BUDGET``; the
very first dispatch goes out with the first poll),
**route** what was gathered to the lanes with one put per lane
(KEY_ORDERLY: by key through the compiled router, which first takes back
what the lanes finished since the last dispatch, so a key with no work left
may move to the least-loaded lane; CONCURRENTLY: round robin;
QUEUE_ORDERLY: the baseline's per-queue service), then fire due
retries (and keys held for ``key_min_interval``, whose memory it also
trims), store handed-off failures (``_failure_sender``), apply flow control
(``_flow_control``), commit every ``commit_interval`` (``_committer``) and,
in QUEUE_ORDERLY, renew the broker locks.

It never blocks indefinitely: a full lane pauses the queues that feed it
instead of blocking a put, and waiting for a revoked queue to drain is
bounded by ``revoke_timeout``; so heartbeats and lock renewals keep flowing
while the consumer is saturated.  When it leaves the loop (shutdown, or the
source closed) it runs the consumer's shutdown sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from ._assignment import Assignment
from ._committer import Committer
from ._errors import SourceClosedError
from ._failure_sender import FailureSender
from ._failures import SendItem
from ._flow_control import FlowControl
from ._lanes import Segment, put_all
from ._process_queue import ProcessQueue
from ._queue_orderly import QueueOrderlyService
from ._runtime import Episode, Runtime, per_queue
from ._types import MessageExt, MessageQueue, PollBatch

__all__ = ["DISPATCH_BUDGET", "LOCK_RETRY_INTERVAL", "POLL_ERROR_BACKOFF", "PullLoop"]

logger = logging.getLogger(__name__)

#: After a poll returned messages, the pull thread polls again without
#: waiting, while more is ready, until it holds this many messages; then it
#: routes them all with one put per lane.
DISPATCH_BUDGET = 1024
#: Seconds between attempts to lock queues another member still holds
#: (QUEUE_ORDERLY).
LOCK_RETRY_INTERVAL = 1.0
#: Seconds the pull thread backs off after a failed poll.
POLL_ERROR_BACKOFF = 1.0

#: A queue's messages gathered for one dispatch, and its keyless lane.
Group = tuple[ProcessQueue, list[MessageExt], int]


class PullLoop:
    """The pull thread's work (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        committer: Committer,
        sender: FailureSender,
        orderly: QueueOrderlyService | None,
        stopping: threading.Event,
    ) -> None:
        self._rt = runtime
        self._committer = committer
        self._sender = sender
        self._orderly = orderly
        self._stopping = stopping
        self._flow = FlowControl(runtime)
        self._poll_episode = Episode("poll")
        #: Set by the consumer before the thread starts.
        self.assignment: Assignment | None = None
        # Batches tracked and not yet routed to lanes: one group per queue.
        self._pending: list[Group] = []
        self._pending_index: dict[ProcessQueue, int] = {}
        self._rr = 0  # CONCURRENTLY: the next lane of the round robin
        self._dispatched = False  # whether anything was routed yet

    def run(self, finish: Callable[[bool], None]) -> None:
        """Poll until ``stopping`` is set (or the source closed), then call
        ``finish(crashed)`` (the consumer's shutdown sequence)."""
        rt = self._rt
        cfg = rt.config
        source = rt.source
        clock = rt.clock
        assignment = self.assignment
        assert assignment is not None, "PullLoop.assignment is set before run()"
        next_commit = clock.monotonic() + cfg.commit_interval
        next_lock = clock.monotonic() + cfg.lock_renew_interval
        next_relock = clock.monotonic() + LOCK_RETRY_INTERVAL
        crashed = False
        try:
            while not self._stopping.is_set():
                timeout = cfg.poll_timeout
                due = rt.timer.next_due()
                if due is not None:  # never sleep past a parked key's retry
                    timeout = min(timeout, max(0.0, due - clock.monotonic()))
                try:
                    batches = source.poll(timeout, cfg.pull_batch_size)
                except SourceClosedError:
                    logger.error("source closed under consumer %r; stopping", cfg.group)
                    break
                except Exception:
                    self._poll_episode.failed(cfg.group)  # logged once per episode, not per poll
                    clock.wait(self._stopping, POLL_ERROR_BACKOFF)
                    continue
                self._poll_episode.ok(cfg.group)
                assignment.renew_fences()
                if batches:
                    self._gather(batches)
                now = clock.monotonic()
                if due is not None and due <= now:
                    self._fire_timers(now)
                if rt.pacer is not None:
                    rt.pacer.rotate(now)  # forget keys started longer ago than the interval
                if self._sender.pending:
                    self._sender.send(now)
                self._flow.apply()
                if now >= next_commit:
                    self._committer.commit_all()
                    next_commit = now + cfg.commit_interval
                if self._orderly is not None:
                    if now >= next_lock:
                        assignment.renew_locks()
                        next_lock = now + cfg.lock_renew_interval
                    elif now >= next_relock:
                        assignment.retry_locks()
                        next_relock = now + LOCK_RETRY_INTERVAL
        except BaseException as e:
            crashed = True
            logger.exception("pull thread of consumer %r died; shutting down", cfg.group)
            rt.fail(e)
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
                raise
        finally:
            finish(crashed)

    # -- poll -> track -> route ------------------------------------------------------

    def _gather(self, batches: list[PollBatch]) -> None:
        """Track a poll's batches, keep polling without waiting while more is
        ready (up to ``DISPATCH_BUDGET`` messages, and never past
        ``lane_capacity``, so one dispatch cannot overfill a lane by more than
        a capacity and a poll), then route it all at once: one put per lane
        per dispatch, so lanes wake once per dispatch rather than once per
        poll."""
        rt = self._rt
        first = not self._dispatched
        total = self._track(batches)
        cfg = rt.config
        # The first dispatch goes out with the first poll: at a start every
        # lane waits, and a full budget's polls would keep them waiting.
        budget = 0 if first else min(DISPATCH_BUDGET, cfg.lane_capacity)
        while total < budget:
            try:
                more = rt.source.poll(0.0, cfg.pull_batch_size)
            except Exception:
                break  # the next regular poll reports it
            if not more:
                break
            if self.assignment is not None:  # the poll may have assigned queues
                self.assignment.renew_fences()
            total += self._track(more)
        self.route_pending()
        self._dispatched = True
        # Give the GIL up once: the lanes just woken (the event loop, lane
        # threads) start their calls now instead of after a whole switch
        # interval (5 ms) of this thread decoding the next polls.
        time.sleep(0)

    def _track(self, batches: list[PollBatch]) -> int:
        """Add polled batches to their ProcessQueues and to the pending
        groups (one group per queue: a queue's batches are contiguous, so
        they are joined); pause at once every queue that crossed a threshold,
        so gathering more polls never overshoots one by more than a batch."""
        rt = self._rt
        pqs = rt.pqs
        groups = self._pending
        index = self._pending_index
        counters = rt.counters.queues
        over_threshold = self._flow.over_threshold
        to_pause: list[MessageQueue] = []
        total = 0
        for batch in batches:
            pq = pqs.get(batch.queue)
            if pq is None:
                logger.warning("poll returned messages of %s, which is not assigned; ignored", batch.queue)
                continue
            msgs = batch.messages
            st = counters[batch.queue]
            st.polled += len(msgs)
            skipped = batch.next_offset - pq.next_offset - len(msgs)  # offsets the source's tag filter passed over
            if skipped > 0:
                st.filtered += skipped
            if pq.finished is not None:
                msgs = pq.drop_finished(msgs, batch.next_offset)
            count, size, span, map_bytes = pq.add_batch(msgs, batch.next_offset)
            if msgs:
                at = index.get(pq)
                if at is None:
                    index[pq] = len(groups)
                    # a copy we own, so later batches of the queue extend it
                    # (linear, where concatenating would copy it each time)
                    groups.append((pq, list(msgs), pq.keyless_lane))
                else:
                    groups[at][1].extend(msgs)
                total += len(msgs)
            if not pq.paused and over_threshold(count, size, span, map_bytes):
                pq.pause()
                to_pause.append(batch.queue)
                st.pauses += 1
        if to_pause:
            rt.source.pause(to_pause)
        return total

    def route_pending(self) -> None:
        """Hand the gathered messages to the lanes: one put per lane."""
        groups = self._pending
        if not groups:
            return
        self._pending = []
        self._pending_index.clear()
        if self._orderly is not None:
            self._orderly.dispatch(groups)
            return
        rt = self._rt
        lanes = rt.lanes
        n = len(lanes)
        router = rt.router
        if router is not None:
            if rt.released:  # what the lanes finished since the last dispatch
                router.release_from(rt.released)
            if rt.lane_limit is not None and router.tracks_load:
                limit = rt.lane_limit()  # the lanes admission lets run (asyncio)
                if limit is not None:
                    router.limit = limit
            segments, counts = router.route(groups)
        else:
            segments, counts = self._round_robin(groups, n)
        for i in put_all(lanes, segments, counts, rt.config.lane_capacity):
            for pq, _ in segments[i]:  # type: ignore[union-attr]
                pq.block_lane(i)
        rt.flush()

    def _round_robin(self, groups: list[Group], n: int) -> tuple[list[list[Segment] | None], list[int]]:
        """CONCURRENTLY: message ``j`` of the dispatch goes to lane
        ``(start + j) % n``; one segment per queue batch per lane."""
        segments: list[list[Segment] | None] = [None] * n
        counts = [0] * n
        start = self._rr
        for pq, msgs, _ in groups:
            k = len(msgs)
            for j in range(min(n, k)):
                i = (start + j) % n
                sub = msgs[j::n]
                segs = segments[i]
                if segs is None:
                    segs = segments[i] = []
                segs.append((pq, sub))
                counts[i] += len(sub)
            start = (start + k) % n
        self._rr = start
        return segments, counts

    # -- the retry timer ---------------------------------------------------------------

    def _fire_timers(self, now: float) -> None:
        """Hand due parked keys to their lanes (one put per lane) and
        re-dispatch due local retries."""
        rt = self._rt
        per_lane: dict[int, list[object]] = {}
        local: list[tuple[ProcessQueue, MessageExt]] = []
        held: list[SendItem] = []
        for lane, token in rt.timer.pop_due(now):
            if lane >= 0:
                per_lane.setdefault(lane, []).append(token)
            elif isinstance(token, SendItem):
                held.append(token)  # a send-back held for its delay
            else:
                local.append(token)  # type: ignore[arg-type]
        for lane, tokens in per_lane.items():
            rt.lanes[lane].put_due(tokens)
        if local:
            self._retry_locally(local)
        if held:
            self._sender.send_held(held, now)
        rt.flush()

    def _retry_locally(self, local: list[tuple[ProcessQueue, MessageExt]]) -> None:
        """CONCURRENTLY messages whose send-back failed (or a BROADCASTING
        member's failures): run them again here (their offsets are still
        unfinished), spread over the lanes."""
        rt = self._rt
        n = len(rt.lanes)
        owned = rt.pqs

        def gone(pq: ProcessQueue) -> bool:
            return pq.dropped or pq.queue not in owned

        for pq, ms in per_queue([(pq, m) for pq, m in local if gone(pq)]).items():
            pq.skip(ms)
        puts: dict[int, list[Segment]] = {}
        for pq, msg in local:
            if not gone(pq):
                self._rr = (self._rr + 1) % n
                puts.setdefault(self._rr, []).append((pq, [replace(msg, reconsume_times=msg.reconsume_times + 1)]))
        for i, segs in puts.items():
            rt.lanes[i].put(segs, len(segs))

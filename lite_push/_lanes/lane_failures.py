"""What goes wrong in one lane: its listener's failures, and its own bugs.

* **A failed call** (:meth:`LaneFailures.fail`): the consumer's
  :class:`~lite_push._lanes.failures.FailurePolicy` classifies it once and
  decides per message: parked (KEY_ORDERLY: its key waits ``suspend_ms`` on
  the consumer's one timer while the lane goes on with other keys,
  ``_lanes.parked_keys``), sent back to the retry topic (CONCURRENTLY) or
  dead-lettered.  A message whose key an earlier message of the same call
  parked waits behind it; one whose key is held (``dead_letter_order="key"``)
  follows it into the dead-letter topic.  Sends are handed off to the pull
  thread (``_lanes.handback``), which completes the offsets once the source
  stored them.
* **A due key's retry that failed again** (:meth:`LaneFailures.fail_due`):
  the same decision for one message; the caller parks the key again with
  what waits behind it.
* **A bug of the lane itself** (:meth:`LaneFailures.crashed`): logged, and
  the consumer stops; the lane's messages stay unfinished.

Each failure is counted (``retried``) and logged, with the traceback on a
message's first attempt.  Lane thread or task only.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from .._state.process_queue import ProcessQueue
from .._state.shared import Counters, FailureLatch
from .._tracing import settle
from .._types import MessageExt
from .failures import Failure, FailurePolicy, SendItem, Verdict
from .handback import Handback
from .parked_keys import ParkedKeys

__all__ = ["LaneFailures"]

logger = logging.getLogger(__name__)


class LaneFailures:
    """The failures of lane ``index`` (see the module docstring)."""

    __slots__ = ("_back", "_counters", "_group", "_latch", "_parked", "_policy", "index")

    def __init__(
        self,
        index: int,
        *,
        group: str,
        policy: FailurePolicy,
        parked: ParkedKeys,
        back: Handback,
        counters: Counters,
        latch: FailureLatch,
    ) -> None:
        self.index = index
        #: The consumer's group, for the log.
        self._group = group
        self._policy = policy
        #: This lane's parked keys: a failed key is parked here.
        self._parked = parked
        #: Hands sends off to the pull thread; holds messages behind held keys.
        self._back = back
        #: ``retried`` of this lane is written here.
        self._counters = counters
        #: A bug of the lane itself stops the consumer.
        self._latch = latch

    def fail(self, pq: ProcessQueue, chunk: list[MessageExt], exc: BaseException | None, result: object) -> None:
        """The listener failed ``chunk``: park, send back or dead-letter
        each message, as the failure policy decides (then the call's span,
        when traced, ends)."""
        try:
            self._fail(pq, chunk, exc, result)
        finally:
            settle()

    def _fail(self, pq: ProcessQueue, chunk: list[MessageExt], exc: BaseException | None, result: object) -> None:
        back = self._back
        if pq.dropped:
            back.skip(pq, chunk)
            return
        policy = self._policy
        failure = policy.classify(exc, result)
        self._counters.retried[self.index] += len(chunk)
        first = chunk[0]
        logger.warning(
            "consumer %r: %s for %d message(s) from %s offset %d (attempt %d)",
            self._group,
            failure.reason,
            len(chunk),
            pq.queue,
            first.queue_offset,
            first.reconsume_times + 1,
            exc_info=exc if exc is not None and first.reconsume_times == 0 else None,
        )
        parked = self._parked
        waiting = parked.keys  # its dict: a plain truth test per message
        held = back.held
        out: list[SendItem] = []
        for m in chunk:
            # An earlier message of its key (same chunk) parked it: wait behind.
            if policy.keyed and waiting and parked.queue_behind(pq, m):
                continue
            if held.keys and back.hold_behind(pq, m, out):
                continue  # its key is held (an earlier message of the chunk was dead-lettered)
            verdict = policy.verdict(m, failure)
            if verdict is Verdict.DEAD_LETTER:
                out.append(policy.dead_letter(pq, m, failure))
            elif verdict is Verdict.PARK:
                parked.park(pq, replace(m, reconsume_times=m.reconsume_times + 1), failure)
            else:
                out.append(policy.send_back(pq, m, failure))
        if out:
            back.hand_off(out)

    def fail_due(
        self, pq: ProcessQueue, m: MessageExt, exc: BaseException | None, result: object, out: list[SendItem]
    ) -> Failure | None:
        """A due key's message ``m`` failed again: the failure, when its key
        is to be parked again (the caller parks it, with what waits behind);
        else ``None``, its dead letter or send-back (a resumed key in
        CONCURRENTLY) appended to ``out``, and the key moves on."""
        policy = self._policy
        failure = policy.classify(exc, result)
        self._counters.retried[self.index] += 1
        logger.warning(
            "consumer %r: %s for %s offset %d (attempt %d)",
            self._group,
            failure.reason,
            pq.queue,
            m.queue_offset,
            m.reconsume_times + 1,
        )
        verdict = policy.verdict(m, failure)
        settle()  # the call's span, when traced
        if verdict is Verdict.PARK:
            return failure
        send = policy.dead_letter if verdict is Verdict.DEAD_LETTER else policy.send_back
        out.append(send(pq, m, failure))
        return None

    def crashed(self, exc: BaseException) -> None:
        """A bug in the lane itself (not the listener's failure, which is
        handled): logged; its messages stay unfinished."""
        logger.error("consumer %r: lane %d failed; the consumer stops", self._group, self.index, exc_info=exc)
        self._latch.fail(exc)

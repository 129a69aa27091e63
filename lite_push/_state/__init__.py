"""The state between the two sides of the data path, and the channels by
which work comes back from the lanes to the pull thread.

- :mod:`.process_queue`: each owned queue's messages in flight;
- :mod:`.offset_map`: which offsets above the committed one are finished;
- :mod:`.timer`: the consumer's one timer (parked keys due again, delayed
  sends, rate-limit wake-ups);
- :mod:`.shared`: the counters, episodes and latches both sides write, each
  with its writers named.

The seven channels back to the pull thread: the messages a lane released
(finished offsets, in the process queues), the failure sender's outbox
(:class:`lite_push._lanes.failures.Outbox`, emptied by
:mod:`lite_push._pull.failure_sender`), the timer, the stealer's
hand-shake (:mod:`lite_push._pull.lane_steal`), key pauses
(:mod:`lite_push._pull.key_pauses`), the ``Assignment`` a poll returns
(:mod:`lite_push._pull.assignment`) and the failure latch
(:class:`.shared.FailureLatch`).
"""

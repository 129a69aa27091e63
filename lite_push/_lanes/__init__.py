"""The lane side: bounded FIFOs of work, each drained by exactly one thread
or task.

A lane (:mod:`.lanes`) holds the work the dispatcher routed to it; its
worker (:mod:`.worker`) turns that work into listener calls (:mod:`.steps`)
after the call gate (:mod:`.call_gate`) and the rate limits
(:mod:`.rate_limit`) allow them, and decides what becomes of a failed
message (:mod:`.failures`): a key parked on the timer (:mod:`.parked_keys`)
or held behind a dead letter (:mod:`.held_keys`).  The executors that run
the workers are in :mod:`lite_push._exec`.
"""

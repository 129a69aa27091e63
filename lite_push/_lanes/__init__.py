"""The lane side: bounded FIFOs of work, each drained by exactly one thread
or task.

A lane (:mod:`.lanes`) holds the work the dispatcher routed to it; its
worker (:mod:`.worker`) turns that work into listener calls (:mod:`.steps`)
after the call gate (:mod:`.call_gate`) and the rate limits
(:mod:`.rate_limit`) allow them.  What a lane gives back (completions,
skips, hand-offs) goes through its :mod:`.handback`; a failed call is
handled by its :mod:`.lane_failures`, as the consumer's failure policy
(:mod:`.failures`) decides: a key parked on the timer (:mod:`.parked_keys`),
a send-back, or a dead letter, whose key may be held behind it
(:mod:`.held_keys`).  The executors that run the workers are in
:mod:`lite_push._exec`.
"""

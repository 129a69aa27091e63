"""The executors: what runs the lane workers.

Threads (:mod:`.thread_executor`, the default: one OS thread per lane) or
coroutines on one event loop (:mod:`.async_executor`, with
:mod:`.admission` bounding how many lanes are in listener calls and
:mod:`.watchdog` noticing a listener that blocks the loop); the call watch
(:mod:`.call_watch`) that sees every lane's listener call; and the
baseline, RocketMQ's orderly consumer (:mod:`.queue_orderly`).
"""

"""The pull side: the one thread (or event-loop task) that talks to the
source.

It reads batches (:mod:`.loop`, run by :mod:`.runner`; a turn and its
blocking calls: :mod:`.turn`).  Each turn's **intake** (:mod:`.intake`)
first hands the lanes what changed since the last poll (:mod:`.poll_sync`:
fences, the keys the application paused (:mod:`.key_pauses`), keys moved
off a stuck lane (:mod:`.lane_steal`)), then tracks what was polled and
hands it to the lanes (:mod:`.dispatch`).  Its **upkeep** (:mod:`.upkeep`)
fires the timer, stores what failed (:mod:`.failure_sender`), pauses and
resumes queues (:mod:`.flow_control`), commits when due
(:mod:`.commit_schedule`, :mod:`.committer`) and, in QUEUE_ORDERLY, renews
the broker locks (:mod:`.broker_locks`).  Inside a poll, the source calls
the rebalance listener (:mod:`.assignment`), which opens the queues gained
(:mod:`.queue_opener`) and drains the queues revoked (:mod:`.revoke_drain`).
What it shares with the lanes is in :mod:`lite_push._state`.
"""

"""The pull side: the one thread (or event-loop task) that talks to the
source.

It reads batches (:mod:`.loop`, run by :mod:`.runner`), hands them to the
lanes (:mod:`.dispatch`), keeps the queues this member owns
(:mod:`.assignment`), pauses a queue that holds too much
(:mod:`.flow_control`) or whose keys the application paused
(:mod:`.key_pauses`), commits (:mod:`.committer`), stores what failed
(:mod:`.failure_sender`) and moves keys off a stuck lane
(:mod:`.lane_steal`).  What it shares with the lanes is in
:mod:`lite_push._state`.
"""

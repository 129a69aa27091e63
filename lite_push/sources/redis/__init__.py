"""The Redis Streams source: topics, queues and consumer groups on a Redis server.

The package, one concern per module:

* :mod:`.broker`      ``RedisBroker``: topics, sending, the consumers of
  its groups, and the wiring of the parts below;
* :mod:`.connection`  the client, the reader client, the Lua scripts
  (:mod:`.scripts`), pipelines, storing messages, key names;
* :mod:`.topics`      the topics' queue counts (cached) and stored ranges;
* :mod:`.codec`       a message as a stream entry, and back;
* :mod:`.retries`     retries and dead letters, moving due retries;
* :mod:`.registry`    the broker's open consumers;
* :mod:`.membership`  a member's session in its group: heartbeats, owner
  keys, start positions, commits, queue locks;
* :mod:`.clustering`  a CLUSTERING member's rebalance and offsets, over its
  membership (``Balance.QUEUE``);
* :mod:`.message_grain` a member of a group balanced by message
  (``Balance.MESSAGE``), over the scripts of :mod:`.grain_scripts` (BROADCASTING is the shared
  :class:`~lite_push.sources._member_model.Broadcasting`);
* :mod:`.group_admin` a group read and reset from outside it (members,
  owners, in-flight counts; ``lite-push group``);
* :mod:`.reading`     a poll's read of its queues' streams (stopping
  before a jump of offsets the runtime must not see yet: :mod:`.gaps`);
* :mod:`.functions`   the ``lite_push`` Redis Function library
  (``FCALL lite_push_send``: producing from any language), loaded on the
  first use of a topic;
* :mod:`.notifier`    the pub/sub thread that wakes a waiting poll;
* :mod:`.lost_data`   saying so when the server lost the namespace's data
  (a FLUSHALL, a restart without its saved data) under a running member;
* :mod:`.consumer`    ``RedisPullConsumer``, built with the parts above
  (never the broker).

Mapping onto Redis (``ns`` is the broker's ``namespace``)

Topics
  ns:topics                       hash  topic -> queue count
  ns:{<topic>#<q>}:seq            string: the next offset of queue q
  ns:{<topic>#<q>}:log            stream: the messages of queue q
    A queue's keys share the hash tag {<topic>#<q>}, so they live in one
    Cluster slot.  Offsets are consecutive integers per queue, assigned at
    send time by the SEND script: INCRBY seq, then XADD with the explicit
    stream id "<offset+1>-0" (ids must be > 0-0), so reading from offset o
    is XRANGE log (o+1)-0 + .  Entry fields: b = body (raw bytes), m =
    orjson {"k": keys, "t": tags, "p": properties, "bt": born ms}, s = store
    ms (server TIME).  A batch send is one SEND call per queue (pipelined),
    so a batch's messages of one queue are contiguous (up to 65536 per
    queue per call; bigger batches are split).  msg_id is
    "<namespace>-<topic>-<q>-<offset>"; MessageQueue.broker_name is the
    namespace.
  ns:notify:<topic>               pub/sub channel: an empty message after
                                  every send (waiting polls wake)
  ns:rr:<topic>                   string: FCALL lite_push_send's round robin
                                  of keyless messages (:mod:`.functions`)
    Foreign entries (a raw XADD; :mod:`.codec`): every append goes through
    append_first (scripts.APPEND_FIRST), which moves seq past a higher id
    in the stream, so sends go on above it (a "*" id is the time in ms: the
    offsets jump by ~1.8e12); a consumer dead-letters the entry as
    malformed; the runtime is handed messages above a jump only once it
    finished those below (:mod:`.gaps`); max_offset is past a foreign top
    entry even before a send moved seq (scripts.QUEUE_END).

Retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>): normal topics
  of one queue, created on first use (send_back, send_to_dlq, subscribe).
  Delayed retries wait in the retry queue's own hash tag:
  ns:{%RETRY%<g>#0}:sched        zset  copy id -> due ms (broker clock .time())
  ns:{%RETRY%<g>#0}:sbody / :smeta  hashes copy id -> body / meta
  The MOVE_DUE script moves every due copy to the retry stream (same slot,
  atomic), returning the next due time.  Every poll iteration runs it for
  its group, and a waiting poll never waits past the next due time.

Consumer groups (hash tag {g:<group>})
  ns:{g:<g>}:members    zset  client id -> session expiry (server ms)
  ns:{g:<g>}:subs       hash  client id -> orjson list of subscribed topics
  ns:{g:<g>}:beats      hash  client id -> server ms of its last heartbeat
                        (read by ``group describe``)
  ns:{g:<g>}:version    counter bumped on every membership change/release
  ns:{g:<g>}:owner:<topic>#<q>   string: owning client id, PX session_timeout
  ns:{g:<g>}:offsets    hash  "<topic>#<q>" -> orjson [offset, metadata]
  ns:{g:<g>}:initial    hash  "<topic>#<q>" -> start offset fixed when the
                        group first owned the queue (ConsumeFromWhere)
  ns:{g:<g>}:lock:<topic>#<q>    string: orderly lock holder, PX lease
  ns:{g:<g>}:events     pub/sub channel announcing membership changes

Rebalance and the hand-off (all on the owning thread, inside poll)
  HEARTBEAT (at subscribe, on a version change, every rebalance_interval,
  while a wanted queue is still taken, and due at three quarters of
  heartbeat_interval after the last one, so that, counting the read that
  notices and the round trip, a polling member's last heartbeat is never
  older than heartbeat_interval) drops members whose session expired,
  (re)adds the caller with expiry now + session_timeout and records now as
  its last heartbeat, bumps the version on a change, renews
  the caller's owner keys (reporting those it lost) and returns the live
  members' subscriptions.  The target is the allocation strategy over the
  topic's sorted queues and the sorted ids of the members subscribed to
  it.  Owned queues that left the target (or were lost) go through
  on_revoked, then their owner keys are compare-and-deleted (RELEASE,
  which bumps the version so the others look at once).  Target queues are
  taken by ACQUIRE (free, or already ours); their start position is the
  committed offset, else the group's initial position; then on_assigned.
  A queue still owned by another member is retried on every poll
  iteration until it is released or its owner key expires (the previous
  owner missed its session).  commit() stores only offsets of queues whose
  owner key holds the caller's id (COMMIT), so late commits are fenced.
  Every poll iteration reads the version (pipelined with the reads), so a
  membership change is seen at once (pub/sub, below) or within one wait
  slice.  Sessions expire on the server's clock (TIME in the scripts), so
  members on different machines agree on them.

BROADCASTING members (message_model=BROADCASTING) touch none of the group
  keys above: no registry entry, no owner keys, no locks.  A member owns
  every queue of its topics from its first poll after subscribe, starting
  at its offset in its local file (lite_push.sources.local_offsets), else
  at consume_from (written to the file at once); commit() writes the file.
  send_back is refused (the runtime retries failures in the member).

Balance.MESSAGE (message-grain: :mod:`.message_grain`)
  ns:{g:<g>}:balance             string: QUEUE or MESSAGE, recorded by the
                                 first member (CLAIM_BALANCE); a member asking
                                 for the other while a live member uses it
                                 gets a ConfigError
  ns:{<topic>#<q>}:mg:<g>:cur    string: the id of the last entry any member
                                 looked at ("<n>" for "<n>-0")
  ns:{<topic>#<q>}:mg:<g>:out    hash record id -> "<token><tab><offsets>
                                 <tab><keys>": what one DISPATCH delivered
                                 to a member, not acknowledged
  ns:{<topic>#<q>}:mg:<g>:outz   zset record id -> its lowest offset
  ns:{<topic>#<q>}:mg:<g>:hold   hash key -> "<token><tab><count>" holding it
                                 (kept only while two members are live)
  ns:{<topic>#<q>}:mg:<g>:live   zset token -> session expiry (server ms)
  ns:{<topic>#<q>}:mg:<g>:park   zset "<offset><tab><key>": parked, in order
  (:mod:`.grain_scripts` says what each holds.)
  The group's committed position of a queue is computed: the lowest of the
  records, the parked messages and the cursor.  Members read the streams
  themselves and propose what they read to DISPATCH.
  Everything of one queue shares its hash tag: DISPATCH (renew, reclaim the
  lapsed sessions, serve parked then proposed messages), ACK, RENEW and QUIT
  are each one script on one slot.  Members also keep their entry in the
  group's members zset (heartbeats) and copy each queue's committed
  position to the group's offsets hash every heartbeat, so a member of the
  other balance later starts there.

Redis Cluster: every script's keys share one hash tag (a queue's, or a
  group's, or the retry queue's for the schedule), and ns:topics is only
  used by single-key commands.  A redis.RedisCluster client cannot
  pipeline scripts, so on a cluster the pipelined steps (batch send, the
  poll's reads) run one by one (_Sequential).

"""

from __future__ import annotations

from .broker import RedisBroker
from .consumer import RedisPullConsumer

__all__ = ["RedisBroker", "RedisPullConsumer"]

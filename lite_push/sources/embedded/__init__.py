"""The embedded broker: topics, queues, consumer groups and rebalance in process.

The package, one concern per module:

* :mod:`.broker`    ``EmbeddedBroker``: the public face (topics, sending,
  offsets, closing) and the wiring of the parts below;
* :mod:`.log`       the log store: topics, each queue's messages, appending;
* :mod:`.files`     the files of a durable broker;
* :mod:`.groups`    the group coordinator: members, rebalance and the queue
  hand-off, committed offsets, queue locks;
* :mod:`.schedule`  retries, dead letters and the delivery of due retries;
* :mod:`.reading`   a poll's pass over the owned queues;
* :mod:`.group_admin`  a group read and reset from outside it
  (``lite-push group``);
* :mod:`.clustering`  a CLUSTERING member's side of the group: joining,
  rebalance, commits, locks (BROADCASTING is the shared
  :class:`~lite_push.sources._member_model.Broadcasting`);
* :mod:`.consumer`  ``EmbeddedPullConsumer``, built with the parts above
  (never the broker), which it uses through their public methods.

Storage
-------

Each queue is a Python list of MessageExt; a message's queue_offset is its
index (offsets run from 0, nothing is ever deleted, so min_offset is 0 and
max_offset is len(list)).  poll() hands out slices of these lists: messages
are shared, never copied, and must be treated as read-only.

With a ``path`` the broker is durable:
  path/LOCK                 flock'ed while a broker has the directory open; holds
                              the PID of the process that opened it last
  path/topics.json          {"version": 1, "topics": {topic: queue_count}}
  path/offsets.json         {"version": 1, "groups": {group: {topic:
                              {queue_id: {"offset": n, "metadata": s}}}}}
  path/<topic>/<qid>.log    append-only records, one per message:
      header  <IIIqqq  magic b"LPR1", meta_len, body_len, queue_offset,
                       born_timestamp ms, store_timestamp ms
      meta    orjson {"k": keys, "t": tags, "p": properties} (absent parts
              omitted; zero bytes when the message has none of them)
      body    body_len bytes
      trailer <I       CRC32 of header + meta + body
msg_id is not stored: it is f"{broker_name}-{topic}-{queue_id}-{offset}".
The JSON files are replaced atomically (write a .tmp, os.replace).  Logs
are written unbuffered (one write per queue per send/send_batch), so
what send() acknowledged survives kill -9; ``fsync=True`` adds an fsync for
power loss.  On reopen every record is checked (length, magic, CRC,
consecutive offset); the first bad one -- a write torn by a crash -- and
everything after it are truncated away with a warning.


Locks
-----

* The broker's one lock (``broker.log.lock``, with the condition
  ``broker.log.cond`` on it) guards all shared state: topics, the queue
  lists' growth, the log files' appends (so file order is offset order), and
  every group's members, owner map, committed offsets and version.
  ``send_batch`` builds and validates the messages without it, then takes it
  once per ~65,536 messages to number, write and publish them, and notifies
  the condition; blocked polls wait on it.  Listener callbacks and writes of
  offsets.json never run under it.  (Big batches also pause the cyclic GC
  while they build messages: a million new objects would otherwise trigger
  many full collections.)  (A topic's round-robin counter is read and
  written without it: a race only makes two senders pick the same queue.)
* The group coordinator's offsets-file lock serialises writes of
  offsets.json; each write carries a version, so a late, older snapshot
  never overwrites a newer one.
* A consumer has no lock: it belongs to one thread (the PullSource
  contract).  Its fast path reads the queue lists without the broker lock:
  len() and slicing of a list are atomic, and lists only grow.
  ``wakeup()``, the one method other threads may call, sets a flag and
  notifies the condition.  The schedule's ``next_due_ms`` is written under
  the lock and read without it by every poll.
"""

from __future__ import annotations

from .._common import BrokerClock, parse_tag_expression
from .broker import EmbeddedBroker, SendResults
from .consumer import EmbeddedPullConsumer
from .groups import SCHEDULE_GROUP
from .schedule import SCHEDULE_TOPIC

#: The former name of :class:`BrokerClock` (it then had ``monotonic()`` only).
MonotonicClock = BrokerClock

__all__ = [
    "SCHEDULE_GROUP",
    "SCHEDULE_TOPIC",
    "BrokerClock",
    "EmbeddedBroker",
    "EmbeddedPullConsumer",
    "MonotonicClock",
    "SendResults",
    "parse_tag_expression",
]

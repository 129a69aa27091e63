"""The cyclic garbage collector set up for a long run of ``consume``, whose
process is its own (the single process and each ``--processes`` member):
see :func:`prepare_gc`."""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "PYTHON_GEN0_THRESHOLD", "prepare_gc"]


#: The interpreter's own first-generation threshold (``gc.get_threshold()[0]``).
PYTHON_GEN0_THRESHOLD = 700
#: The command's: a young collection after this many container objects made
#: and not yet freed, not 700 (Kafka, 1 ms, 400,000 messages: the GC's CPU
#: 0.33-0.44 s -> 0.11-0.13 s; benchmarks/RESULTS.md, issue 40).
GEN0_THRESHOLD = 20_000


def prepare_gc() -> None:
    """Set the cyclic collector up for a long run, just before the consumer
    starts; the command owns its process, so it may.

    What exists by then (the modules, the listener's, the consumer and its
    lanes) lives until the process exits, so the collector need not walk it
    again: collect once, then move it all to the permanent generation
    (:func:`gc.freeze`), and each full collection walks only what the run
    made.  (Frozen objects are still freed by their reference counts; only
    a cycle among them would stay, and they live until exit anyway.)

    Each listener call makes a few short-lived containers (its coroutine,
    its future, its timer), freed by their reference counts: young
    collections every 700 of them find nothing to free, so the first
    generation's threshold is raised to :data:`GEN0_THRESHOLD`, unless the
    listener's module set its own (the threshold is no longer 700)."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 == PYTHON_GEN0_THRESHOLD:
        gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)

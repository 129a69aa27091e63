"""Which peers there are: every ``benchmarks/peers/<name>_runner.py`` with its
``<name>.requirements.txt`` (lite_push's runners need none), and the peers
of ``UNRUNNABLE.md`` (no runner, a reason).

A runner is a Kafka peer unless its name ends in ``_redis`` or it is one of
:data:`NO_BROKER` (the floor of issue 40: no broker, source ``"none"``, its
keys by file, see ``runner_protocol.py``).  It runs with the python of its
venv (``<name>.requirements.txt``, :mod:`.venvs`), but lite_push's runners
(``lite_push_*``) and those of :data:`NO_BROKER` with the project's own
python.  Which Redis format a Redis peer reads: lite_push's runners
(``lite_push_redis``, ``lite_push_cli_redis``) lite_push's topic (queues of
Redis streams in lite_push's entry format), every other ``*_redis`` peer one
stream in faststream's format (the only one so far).

A Kafka peer may ask for a mock cluster whose group coordinator waits
before it forms a new group's first generation (:data:`REBALANCE_DELAY_MS`,
Kafka's ``group.initial.rebalance.delay.ms``): the orchestrator then starts
one more cluster with that delay for it.  Every other Kafka peer shares one
cluster without a delay.

``UNRUNNABLE.md`` holds a markdown table whose rows are ``| peer | reason |``
(more columns are ignored): a peer that cannot be installed or run here
still gets its row in the results, with that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NO_BROKER", "ON_REQUEST", "REBALANCE_DELAY_MS", "VARIANTS", "Peer", "discover", "unrunnable"]

HERE = Path(__file__).resolve().parent

_ROW = re.compile(r"^\|\s*`?([A-Za-z0-9_]+)`?\s*\|\s*(.*?)\s*\|")


@dataclass(frozen=True)
class Peer:
    """One runner and how the orchestrator feeds it."""

    name: str
    runner: Path
    #: ``"kafka"``, ``"lite_push_redis"``, ``"faststream_redis"`` or
    #: ``"none"`` (:data:`NO_BROKER`): which filled topic it reads (and how
    #: its committed offsets are read).
    source: str
    #: Its pinned requirements, or None for the project's own python.
    requirements: Path | None
    #: The runner's name (its venv's): ``name`` itself, or for a variant
    #: (``faust@ordered``) the peer it is a setting of.
    base: str = ""
    #: ``KEY=VALUE`` settings a variant passes to its runner (before ``--set``'s).
    settings: tuple[str, ...] = ()
    #: The initial rebalance delay (ms) of the mock cluster it runs on
    #: (:data:`REBALANCE_DELAY_MS`; 0 for most).
    rebalance_delay_ms: int = 0

    @property
    def broker(self) -> str:
        """``"kafka"``, ``"redis"`` or ``"none"``: the runner's broker
        argument (``--bootstrap``, ``--redis`` or ``--keys``)."""
        if self.source in ("kafka", "none"):
            return self.source
        return "redis"


#: Second rows of one runner at other settings, measured beside its default:
#: ``variant -> (runner, settings)``.  A peer's default is its best throughput
#: by its own features; a variant is the setting of it that keeps per-key
#: order (faust), or its documented high-throughput form (faststream's
#: batch subscribers).
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "faust@ordered": ("faust", ("concurrency=1", "isolated_partitions=1")),
    "faststream_kafka@batch": ("faststream_kafka", ("mode=batch",)),
    "faststream_redis@batch": ("faststream_redis", ("mode=batch",)),
    # issue 40: `lite-push consume` with --lanes 1024 beside its defaults
    "lite_push_cli_kafka@1024": ("lite_push_cli_kafka", ("lanes=1024",)),
    "lite_push_cli_redis@1024": ("lite_push_cli_redis", ("lanes=1024",)),
    # the aiokafka runner's per-key loop before issue 40 made it lean (its docstring)
    "aiokafka@keys": ("aiokafka", ("mode=keys", "max_records=0")),
}

#: Variants that run only when ``--peers`` names them (not in the default
#: grid): comparisons of one runner's forms, not peers of their own.
ON_REQUEST: frozenset[str] = frozenset({"aiokafka@keys"})

#: Runners that read no broker: the floor (``floor_runner.py``, issue 40),
#: a task per key awaiting each message's cost with nothing to read from.
#: Their source is ``"none"``: no topic is filled and no commit read for
#: them, and they get the keys by file (``--keys``) instead of a broker
#: argument.  They run with the project's python (the floor needs uvloop,
#: one of its extras).
NO_BROKER: frozenset[str] = frozenset({"floor"})


#: Kafka peers that need the mock cluster's initial rebalance delay, in ms:
#: quixstreams runs N replicas in one group (one per partition), which must
#: all be in the group's first generation (``quixstreams_runner.py``'s
#: docstring: with 0 ms the replicas fail).  3,000 ms is Kafka's default
#: ``group.initial.rebalance.delay.ms``, what a fresh group waits on a broker.
REBALANCE_DELAY_MS: dict[str, int] = {"quixstreams": 3000}


def discover(peers_dir: Path = HERE) -> dict[str, Peer]:
    """The peers with a runner, by name (lite_push's first, then by name),
    and the :data:`VARIANTS` of those found."""
    found = {}
    for runner in sorted(peers_dir.glob("*_runner.py")):
        name = runner.name.removesuffix("_runner.py")
        if name in NO_BROKER:
            source = "none"
        elif name.endswith("_redis"):
            source = "lite_push_redis" if name.startswith("lite_push_") else "faststream_redis"
        else:
            source = "kafka"
        own = name.startswith("lite_push_") or name in NO_BROKER  # the project's python
        requirements = None if own else peers_dir / f"{name}.requirements.txt"
        if requirements is not None and not requirements.exists():
            continue  # a helper script, not a peer (a peer's runner comes with its pins)
        delay = REBALANCE_DELAY_MS.get(name, 0)
        found[name] = Peer(name, runner, source, requirements, name, rebalance_delay_ms=delay)
    for variant, (base, settings) in VARIANTS.items():
        if base in found:
            b = found[base]
            found[variant] = Peer(variant, b.runner, b.source, b.requirements, base, settings, b.rebalance_delay_ms)
    return dict(sorted(found.items(), key=lambda item: (not item[0].startswith("lite_push"), item[0])))


def unrunnable(peers_dir: Path = HERE) -> dict[str, str]:
    """``peer -> reason`` from ``UNRUNNABLE.md`` (empty without the file)."""
    path = peers_dir / "UNRUNNABLE.md"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match and match[1].lower() not in ("peer", "name") and not set(match[2]) <= set("-: "):
            out[match[1]] = match[2]
    return out

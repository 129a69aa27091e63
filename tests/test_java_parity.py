"""Both router twins route every key exactly as Java does.

The reference is Java itself, never a Python re-implementation:

* ``tests/data/java_hashes.json`` holds ``String.hashCode`` and
  ``Math.floorMod(hashCode, n)`` printed by Java 17 for a fixed key set
  (regenerate with ``tests/java/regen_java_hashes.py``);
* where ``javac`` is on PATH, ``tests/java/JavaHash.java`` is also compiled and
  run live on those keys plus ~2000 fresh random ones.

Each key is also hashed in its split-surrogate spelling (every astral
character written as two surrogate code points, as a str that Python keeps
unpaired): Java sees the same code units either way, so the twins must too.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lite_push import MessageExt

TESTS_DIR = Path(__file__).resolve().parent
DATA_FILE = TESTS_DIR / "data" / "java_hashes.json"

_spec = importlib.util.spec_from_file_location("regen_java_hashes", TESTS_DIR / "java" / "regen_java_hashes.py")
assert _spec is not None and _spec.loader is not None
regen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regen)

#: Seed of the random keys of the live Java run; set ``LITE_PUSH_JAVA_SEED``
#: to try others (the failure message names the seed).
LIVE_SEED = int(os.environ.get("LITE_PUSH_JAVA_SEED", "424242"))
LIVE_RANDOM_KEYS = 2000

DATA: dict[str, Any] = json.loads(DATA_FILE.read_text(encoding="ascii"))
MODULI: tuple[int, ...] = tuple(DATA["moduli"])
CASES: list[dict[str, Any]] = DATA["cases"]
NAMED = [c for c in CASES if not c["name"].startswith("random ")]
RANDOM = [c for c in CASES if c["name"].startswith("random ")]


def split_surrogates(key: str) -> str:
    """``key`` with every astral character written as its two surrogates."""
    units = key.encode("utf-16-le", "surrogatepass")
    return "".join(chr(int.from_bytes(units[i : i + 2], "little")) for i in range(0, len(units), 2))


def mismatches(router: ModuleType, key: str, java_hash: int, floor_mods: list[int] | tuple[int, ...]) -> list[str]:
    """What ``router`` gets wrong about ``key`` (empty: it agrees with Java)."""
    wrong = []
    for spelling, k in (("key", key), ("split surrogates", split_surrogates(key))):
        if k != key or spelling == "key":
            got = router.java_hash(k)
            if got != java_hash:
                wrong.append(f"{ascii(k)[:60]} ({spelling}): java_hash {got}, Java {java_hash}")
            for n, want in zip(MODULI, floor_mods, strict=True):
                got = router.lane_of(k, n)
                if got != want:
                    wrong.append(f"{ascii(k)[:60]} ({spelling}): lane_of(n={n}) {got}, Java floorMod {want}")
    return wrong


def report(wrong: list[str], total: int) -> str:
    return f"{len(wrong)} disagreements with Java over {total} keys; first ones:\n" + "\n".join(wrong[:15])


# --- the data file -------------------------------------------------------------


def test_data_file_is_what_the_tests_expect() -> None:
    assert MODULI == regen.MODULI
    assert DATA["java"].startswith(("openjdk version", "java version")), DATA["java"]
    assert len(RANDOM) >= 200
    names = {c["name"] for c in NAMED}
    for required in ("empty", "lone high surrogate", "1000 chars", "Integer.MIN_VALUE polygenelubricants"):
        assert required in names
    assert len(next(c for c in NAMED if c["name"] == "1000 chars")["key"]) == 1000
    for case in CASES:
        # The readable key and the authoritative code units say the same.
        assert case["key"].encode("utf-16-le", "surrogatepass") == base64.b64decode(case["utf16le_b64"]), case["name"]
        assert len(case["floor_mod"]) == len(MODULI)


def test_random_keys_cover_every_str_width() -> None:
    # PEP 393: the compiled twin has one loop per width; each must be hit,
    # and the 2- and 4-byte ones with lone surrogates in them.
    widths = {1: 0, 2: 0, 4: 0}
    lone = {2: 0, 4: 0}
    for case in RANDOM:
        key = case["key"]
        width = 1 if max(key, default="\0") <= "\xff" else 2 if max(key) <= "\uffff" else 4
        widths[width] += 1
        if width > 1 and any("\ud800" <= ch <= "\udfff" for ch in key):
            lone[width] += 1
    assert min(widths.values()) >= 20, widths
    assert min(lone.values()) >= 5, lone


# --- both twins against the stored Java output ------------------------------------


@pytest.mark.parametrize("case", NAMED, ids=[c["name"] for c in NAMED])
def test_named_key_matches_java(router: ModuleType, case: dict[str, Any]) -> None:
    assert router.java_hash(case["key"]) == case["hash"]
    assert [router.lane_of(case["key"], n) for n in MODULI] == case["floor_mod"]
    assert mismatches(router, case["key"], case["hash"], case["floor_mod"]) == []


def test_random_keys_match_java(router: ModuleType) -> None:
    wrong = [w for c in RANDOM for w in mismatches(router, c["key"], c["hash"], c["floor_mod"])]
    assert not wrong, report(wrong, len(RANDOM))


@pytest.mark.parametrize("n", MODULI)
def test_java_placement_routes_like_java(router: ModuleType, n: int) -> None:
    """``lane_placement="java"``: every key on Java's ``floorMod(hashCode, n)``."""
    i = MODULI.index(n)
    cases = [c for c in CASES if c["key"]]
    items = [MessageExt("T", 0, j, b"", keys=c["key"]) for j, c in enumerate(cases)]
    items += [MessageExt("T", 0, len(items), b"", keys=None), MessageExt("T", 0, len(items) + 1, b"", keys="")]
    r = router.KeyRouter(n, "java")
    for label in ("cold cache", "warm cache"):
        segments, counts = r.route([("q", items, n - 1)])
        got = {m.queue_offset: lane for lane, segs in enumerate(segments) for _, sub in segs or [] for m in sub}
        want = [c["floor_mod"][i] for c in cases] + [n - 1, n - 1]
        wrong = [(ascii(items[j].keys)[:40], got[j], w) for j, w in enumerate(want) if got[j] != w]
        assert not wrong, f"{label}: (key, lane, Java floorMod): {wrong[:10]}"
        assert sum(counts) == len(items)


# --- both twins against Java, live -------------------------------------------------


@pytest.fixture(scope="module")
def live_java(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[tuple[int, tuple[int, ...]]]]:
    """Keys and Java's ``(hashCode, floorMods)`` for them, from a JavaHash
    compiled and run now."""
    if not regen.have_java():
        pytest.skip("javac/java not on PATH: the live Java comparison needs a JDK (17+)")
    classdir = regen.compile_java(tmp_path_factory.mktemp("javahash"))
    # The random keys are used as generated: a high surrogate followed by a
    # low one stays two code points here, unlike in the data file.
    keys = [c["key"] for c in CASES] + regen.random_keys(LIVE_SEED, LIVE_RANDOM_KEYS)
    return keys, regen.run_java(classdir, keys)


def test_live_java_agrees_with_the_data_file(live_java: tuple[list[str], list[Any]]) -> None:
    _, results = live_java
    stored = [(c["hash"], tuple(c["floor_mod"])) for c in CASES]
    assert results[: len(CASES)] == stored


def test_twin_matches_live_java(router: ModuleType, live_java: tuple[list[str], list[Any]]) -> None:
    keys, results = live_java
    wrong = [w for key, (h, mods) in zip(keys, results, strict=True) for w in mismatches(router, key, h, mods)]
    assert not wrong, f"seed {LIVE_SEED}: " + report(wrong, len(keys))

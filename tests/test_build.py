"""The build: the compiled router loads where it was built, and both router
twins give Java's answers and agree with each other on arbitrary input."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from conftest import PACKAGE_DIR, REQUIRE_EXTENSIONS, assert_compiled_selected, compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import _router, _router_py

EXT_DIR = PACKAGE_DIR.parent / "_ext"


# --- the compiled module is the one in use ---------------------------------


def test_router_c_loaded() -> None:
    """Fails when ``_router_c`` was built (or is required) but the selector
    silently fell back to the Python twin."""
    assert_compiled_selected("_router_c", _router.ROUTER_IMPL, _router.java_hash, "java_hash")


@pytest.mark.parametrize("pyx", sorted(p.stem for p in EXT_DIR.glob("*.pyx")) or ["(none)"])
def test_every_extension_built(pyx: str) -> None:
    """Every ``_ext/<stem>.pyx`` is built as ``lite_push.<stem>`` when
    extensions are required."""
    if not EXT_DIR.is_dir():
        pytest.skip("not running from a source tree")
    if not REQUIRE_EXTENSIONS:
        pytest.skip("LITE_PUSH_REQUIRE_EXTENSIONS is not set")
    assert pyx != "(none)", f"no .pyx in {EXT_DIR}"
    module = compiled_twin(pyx)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == PACKAGE_DIR


# --- known answers ----------------------------------------------------------

# (key, hashCode) printed by Java 17's String.hashCode (OpenJDK 17.0.15).
JAVA_HASHES = [
    ("", 0),
    ("a", 97),
    ("Aa", 2112),
    ("BB", 2112),
    ("hello", 99162322),
    ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE
    ("order-000042", 1928348125),
    ("caf\u00e9", 3045921),  # café: one-byte (Latin-1) str
    ("\u4f60\u597d\u4e16\u754c", 628018387),  # 你好世界: two-byte str
    ("\u8ba2\u5355-12345", -2062070311),  # 订单-12345
    ("\U0001f680rocket\U0001f600", -2002490854),  # 🚀rocket😀: surrogate pairs
    ("\U0001f44d", 1772464),  # 👍
    ("\U00020000", 1772480),  # CJK Extension B, outside the BMP
]

# (hashCode, n, Math.floorMod(hashCode, n)) printed by Java 17.
JAVA_FLOORMODS = [
    (-2147483648, 1, 0),
    (-2147483648, 3, 1),
    (-2147483648, 7, 5),
    (-2147483648, 10, 2),
    (-2147483648, 16, 0),
    (-2147483648, 1000, 352),
    (-2062070311, 3, 2),
    (-2062070311, 10, 9),
    (-2062070311, 1000, 689),
    (-2002490854, 16, 10),
    (-2002490854, 1000, 146),
    (99162322, 7, 0),
    (99162322, 1000, 322),
]
KEY_OF_HASH = {h: k for k, h in JAVA_HASHES}


@pytest.mark.parametrize(("key", "expected"), JAVA_HASHES, ids=[repr(k) for k, _ in JAVA_HASHES])
def test_java_hash_matches_java(router: ModuleType, key: str, expected: int) -> None:
    assert router.java_hash(key) == expected


@pytest.mark.parametrize(("h", "n", "expected"), JAVA_FLOORMODS)
def test_lane_of_matches_java_floormod(router: ModuleType, h: int, n: int, expected: int) -> None:
    assert router.lane_of(KEY_OF_HASH[h], n) == expected


def test_lane_of_min_value_is_in_range(router: ModuleType) -> None:
    # Math.abs(Integer.MIN_VALUE) is negative: the classic lane bug.
    assert router.lane_of("polygenelubricants", 8) == 0
    for key, _ in JAVA_HASHES:
        for n in (1, 2, 3, 7, 8, 16, 31, 1000, 2**31 + 1):
            assert 0 <= router.lane_of(key, n) < n


@pytest.mark.parametrize("n", [0, -1, -8])
def test_lane_of_rejects_nonpositive_n(router: ModuleType, n: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        router.lane_of("a", n)


def test_lone_surrogate_hashes_as_java(router: ModuleType) -> None:
    # Java hashes a lone surrogate as its one code unit: "\ud800".hashCode()
    # is 55296 (Java 17).
    assert router.java_hash("\ud800") == 55296
    assert router.java_hash("a\udc00b") == (97 * 31 + 0xDC00) * 31 + 98


def test_str_subclass_is_a_key(router: ModuleType) -> None:
    class Key(str):
        pass

    assert router.java_hash(Key("hello")) == 99162322
    assert router.lane_of(Key("hello"), 7) == 0


def _plain(keys: object) -> object:
    class Item:
        __slots__ = ("keys",)

    item = Item()
    item.keys = keys
    return item


def test_fixed_placements_route_by_their_hash_and_keep_order(router: ModuleType) -> None:
    keys = ["hello", None, "polygenelubricants", "", "hello", "a"]
    items = [_plain(k) for k in keys]
    for placement, hash_of in (("java", router.java_hash), ("hash", router.mixed_hash)):
        segments, counts = router.KeyRouter(8, placement).route([("q", items, 7)])
        want: list[list[object]] = [[] for _ in range(8)]
        for item, key in zip(items, keys, strict=True):
            want[hash_of(key) % 8 if key else 7].append(item)
        assert segments == [[("q", w)] if w else None for w in want], placement
        assert counts == [len(w) for w in want]


def test_mixed_hash_is_fmix32_of_java_hash(router: ModuleType) -> None:
    # MurmurHash3's fmix32 of a few values, worked by hand from its definition
    def fmix32(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    assert fmix32(0) == 0
    for key, h in JAVA_HASHES:
        assert router.mixed_hash(key) == fmix32(h & 0xFFFFFFFF)
    # sequential ids spread over 64 lanes where Java's hash clusters them
    lanes = [router.mixed_hash(f"acct-{i}") % 64 for i in range(6400)]
    java = [router.lane_of(f"acct-{i}", 64) for i in range(6400)]
    assert max(lanes.count(i) for i in range(64)) < 1.3 * 100
    assert max(java.count(i) for i in range(64)) > 1.5 * 100


def test_bad_keyless_lane_raises(router: ModuleType) -> None:
    for placement in ("load", "hash", "java"):
        with pytest.raises(IndexError, match="keyless lane 4 out of range"):
            router.KeyRouter(4, placement).route([("q", [_plain(None)], 4)])


# --- the twins agree ---------------------------------------------------------

keys = st.text(max_size=40)
maybe_keys = st.one_of(st.none(), keys)


@settings(max_examples=500, deadline=None)
@given(key=keys, n=st.integers(min_value=1, max_value=2**40))
def test_twins_agree_on_java_hash_and_lane_of(key: str, n: int) -> None:
    c = compiled_twin("_router_c")
    assert c.java_hash(key) == _router_py.java_hash(key)
    assert c.lane_of(key, n) == _router_py.lane_of(key, n)


@settings(max_examples=300, deadline=None)
@given(key=keys)
def test_twins_agree_on_mixed_hash(key: str) -> None:
    assert compiled_twin("_router_c").mixed_hash(key) == _router_py.mixed_hash(key)

"""The build: the compiled router loads where it was built, and both router
twins give Java's answers and agree with each other on arbitrary input."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from conftest import PACKAGE_DIR, REQUIRE_EXTENSIONS, assert_compiled_selected, compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push._kernels import router as _router
from lite_push._kernels import router_py as _router_py

EXT_DIR = PACKAGE_DIR.parent / "_ext"


# --- the compiled module is the one in use ---------------------------------


def test_router_c_loaded() -> None:
    """Fails when ``_router_c`` was built (or is required) but the selector
    silently fell back to the Python twin."""
    assert_compiled_selected("router_c", _router.ROUTER_IMPL, _router.java_hash, "java_hash")


@pytest.mark.parametrize("pyx", sorted(p.stem for p in EXT_DIR.glob("*.pyx")) or ["(none)"])
def test_every_extension_built(pyx: str) -> None:
    """Every ``_ext/<stem>.pyx`` is built as ``lite_push._kernels.<stem>`` when
    extensions are required."""
    if not EXT_DIR.is_dir():
        pytest.skip("not running from a source tree")
    if not REQUIRE_EXTENSIONS:
        pytest.skip("LITE_PUSH_REQUIRE_EXTENSIONS is not set")
    assert pyx != "(none)", f"no .pyx in {EXT_DIR}"
    module = compiled_twin(pyx)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == PACKAGE_DIR / "_kernels"


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


# MurmurHash3_x86_32 (data, seed, hash): the known answers that ports of
# Austin Appleby's reference implementation are checked against.  With no
# data the hash is fmix32(seed) itself; otherwise fmix32 of the state that
# MurmurHash3's block and tail mixing left (``_murmur3_state``).
MURMUR3_X86_32 = [
    (b"", 0, 0x00000000),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\0\0\0\0", 0, 0x2362F9DE),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"aa", 0x9747B28C, 0x5D211726),
    (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"ab", 0x9747B28C, 0x74875592),
    (b"abc", 0x9747B28C, 0xC84A62DD),
    (b"abcd", 0x9747B28C, 0xF0478627),
    (b"abc", 0, 0xB3DD93FA),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (("\u03c0" * 8).encode(), 0x9747B28C, 0xD58063C1),  # ππππππππ in UTF-8
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 0, 0xEE925B90),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


def _murmur3_state(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32 of ``data`` up to its finaliser: each 4-byte block
    (then the tail) scrambled with c1, c2 and mixed into the seed, then the
    length xored in: what its fmix32 takes.  (This part of MurmurHash3 is
    not in lite_push: the constants below are not fmix32's.)"""
    mask, c1, c2 = 0xFFFFFFFF, 0xCC9E2D51, 0x1B873593

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def scramble(k: int) -> int:
        return (rotl((k * c1) & mask, 15) * c2) & mask

    h = seed
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        h = (rotl(h ^ scramble(int.from_bytes(data[i : i + 4], "little")), 13) * 5 + 0xE6546B64) & mask
    if whole < len(data):
        h ^= scramble(int.from_bytes(data[whole:], "little"))
    return h ^ len(data)


def _key_with_java_hash(h: int) -> str:
    """A key whose Java ``hashCode`` is the unsigned 32-bit ``h``: its
    digits in base 31 (the first one up to 4650), as chars, so
    ``s[0]*31^4 + ... + s[4]`` is ``h`` without overflow."""
    digits = []
    for _ in range(4):
        h, d = divmod(h, 31)
        digits.append(d)
    return "".join(map(chr, [h, *reversed(digits)]))


@pytest.mark.parametrize(
    ("data", "seed", "expected"), MURMUR3_X86_32, ids=[f"{d[:8]!r}-{s:#x}" for d, s, _ in MURMUR3_X86_32]
)
def test_mixed_hash_is_murmur3s_fmix32_of_java_hash(router: ModuleType, data: bytes, seed: int, expected: int) -> None:
    """``mixed_hash(key)`` is fmix32 of the key's Java hash.  Checked
    against MurmurHash3's published hashes, not a copy of fmix32: the test
    takes MurmurHash3 up to its finaliser, hands that state to
    ``mixed_hash`` as the Java hash of a key, and expects the published
    hash; a wrong constant or shift in fmix32 fails every vector but the
    empty input with seed 0."""
    state = _murmur3_state(data, seed)
    key = _key_with_java_hash(state)
    assert router.java_hash(key) & 0xFFFFFFFF == state
    assert router.mixed_hash(key) == expected


def test_mixed_hash_spreads_sequential_ids(router: ModuleType) -> None:
    ids = [f"acct-{i}" for i in range(6400)]
    # fmix32 is a bijection: distinct Java hashes stay distinct
    assert len({router.mixed_hash(k) for k in ids}) == len({router.java_hash(k) for k in ids})
    # sequential ids spread over 64 lanes where Java's hash clusters them
    lanes = [router.mixed_hash(k) % 64 for k in ids]
    java = [router.lane_of(k, 64) for k in ids]
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
    c = compiled_twin("router_c")
    assert c.java_hash(key) == _router_py.java_hash(key)
    assert c.lane_of(key, n) == _router_py.lane_of(key, n)


@settings(max_examples=300, deadline=None)
@given(key=keys)
def test_twins_agree_on_mixed_hash(key: str) -> None:
    assert compiled_twin("router_c").mixed_hash(key) == _router_py.mixed_hash(key)

"""The Redis fast decoder (``decode_plain``, compiled and pure-Python twins):
a run of plain stream entries becomes exactly the messages the full decoder
(``codec.decode``) makes of them; anything else (a foreign id, other
fields, properties, metadata that is not a JSON object) is left to the full
decoder, which names what is malformed.  The compiled twin builds each
message without its ``__init__`` and untracked: nothing leaks.

The compiled cases skip when ``lite_push._kernels.redis_decode_c`` was not built,
unless ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from types import ModuleType
from typing import Any

import orjson
import pytest
from conftest import assert_compiled_selected, compiled_twin
from hypothesis import given
from hypothesis import strategies as st

from lite_push import MessageExt, MessageQueue
from lite_push._kernels import redis_decode as _redis_decode
from lite_push._kernels import redis_decode_py as _redis_decode_py
from lite_push.sources.redis import codec

Q = MessageQueue("orders", "ns", 3)
PREFIX = "ns-orders-3-"


@pytest.fixture(scope="module", params=["c", "py"])
def twin(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "c":
        return compiled_twin("redis_decode_c")
    return _redis_decode_py


def test_redis_decode_c_loaded() -> None:
    """Fails when ``_redis_decode_c`` was built (or is required) but the
    selector silently fell back to the Python twin."""
    assert_compiled_selected(
        "redis_decode_c", _redis_decode.REDIS_DECODE_IMPL, _redis_decode.decode_plain, "decode_plain"
    )


def _entry(offset: int, body: bytes, meta: Any, stored: bytes = b"1700000000123") -> list[Any]:
    raw = meta if isinstance(meta, bytes) else orjson.dumps(meta)
    return [f"{offset + 1}-0".encode(), [b"b", body, b"m", raw, b"s", stored]]


def _fields(m: MessageExt) -> dict[str, Any]:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(MessageExt)}


_meta = st.fixed_dictionaries(
    {"bt": st.integers(min_value=0, max_value=2**53)},
    optional={"k": st.one_of(st.none(), st.text(max_size=8)), "t": st.text(max_size=4), "p": st.just({})},
)


@given(st.lists(st.tuples(st.binary(max_size=16), _meta), min_size=1, max_size=20), st.integers(0, 10**9))
def test_a_run_of_plain_entries_decodes_as_the_full_decoder_does(twin: ModuleType, run: Any, first: int) -> None:
    entries = [_entry(first + i, body, meta) for i, (body, meta) in enumerate(run)]
    fast = twin.decode_plain("ns", "orders", 3, PREFIX, entries, first)
    assert fast is not None
    bad: list[tuple[MessageExt, str]] = []
    full = codec.decode("ns", Q, entries, bad)  # the selected fast path, or the loop for what it refuses
    assert bad == []
    slow = [codec.decode("ns", Q, [(e[0], dict(zip(e[1][::2], e[1][1::2], strict=True)))], bad)[0] for e in entries]
    assert [_fields(m) for m in fast] == [_fields(m) for m in full] == [_fields(m) for m in slow]
    assert all(type(m.properties) is dict and m.properties == {} for m in fast)
    assert len({id(m.properties) for m in fast}) == len(fast)  # a dict of its own each


@pytest.mark.parametrize(
    "entry",
    [
        [b"5-1", [b"b", b"x", b"m", b"{}", b"s", b"1"]],  # a foreign id
        ["5-0", [b"b", b"x", b"m", b"{}", b"s", b"1"]],  # an id that is no bytes
        [b"5-0", [b"b", b"x", b"m", b"{}"]],  # fields missing
        [b"5-0", [b"m", b"{}", b"b", b"x", b"s", b"1"]],  # fields in another order
        [b"5-0", {b"b": b"x", b"m": b"{}", b"s": b"1"}],  # a cluster client's dict
        [b"5-0", [b"b", b"x", b"m", b'{"p": {"RECONSUME_TIME": "2"}}', b"s", b"1"]],  # properties
        [b"5-0", [b"b", b"x", b"m", b"[1]", b"s", b"1"]],  # metadata that is no object
        [b"5-0", [b"b", b"x", b"m", b"{nope", b"s", b"1"]],  # metadata that is no JSON
        [b"5-0", [b"b", b"x", b"m", b"{}", b"s", b"soon"]],  # a store time that is no number
        [b"5-0", [b"b", None, b"m", b"{}", b"s", b"1"]],  # no body
    ],
)
def test_anything_but_a_plain_entry_is_left_to_the_full_decoder(twin: ModuleType, entry: list[Any]) -> None:
    plain = _entry(3, b"ok", {"bt": 1})
    assert twin.decode_plain("ns", "orders", 3, PREFIX, [plain, entry], 3) is None


def test_the_compiled_twin_leaks_nothing() -> None:
    twin = compiled_twin("redis_decode_c")
    namespace = "".join(["n", "s-leak"])  # a string of its own, not interned
    entries = [_entry(i, b"body", {"bt": 5, "k": "key"}) for i in range(100)]
    gc.collect()
    before = sys.getrefcount(namespace)
    for _ in range(200):
        msgs = twin.decode_plain(namespace, "orders", 3, PREFIX, entries, 0)
        assert len(msgs) == 100 and all(m.broker_name is namespace for m in msgs)
        assert not gc.is_tracked(msgs[0])
    del msgs
    gc.collect()
    assert sys.getrefcount(namespace) == before

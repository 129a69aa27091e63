"""Test helpers for code built on lite_push (as ``trio.testing`` is for trio).

The source contract suite
-------------------------
Whoever writes a :class:`~lite_push.sources.PullSource` of their own runs
the same suite lite_push's embedded, Redis and Kafka sources pass.  In a
pytest test module:

1. Subclass :class:`SourceHarness`: ``create_topic``, ``send``,
   ``consumer`` (a new member of a group), ``advance_clock`` (move the
   clock the source measures retry delays on; :class:`SkewedClock` is one
   to give it) and ``close``.
2. Provide a fixture named ``harness`` that yields a fresh harness for each
   test and closes it after.  Whatever the harness needs (a server, a temp
   directory) comes from your own fixtures: the suite asks for nothing but
   ``harness`` and pytest's built-in ``caplog``.
3. Subclass :class:`SourceContract` under a name pytest collects::

       import pytest
       from lite_push.testing import SourceContract, SourceHarness

       class MyHarness(SourceHarness):
           ...

       @pytest.fixture
       def harness(tmp_path):
           h = MyHarness(tmp_path)
           yield h
           h.close()

       class TestMySourceContract(SourceContract):
           pass

The helpers the suite polls with (:func:`poll_until`, :func:`poll_topic`,
:class:`OwnershipLog`, ...) are here too, for a source's own tests.

Fault tests
-----------
:class:`TcpProxy` stands between one member and its server (a Redis
server, say) and can partition them: :meth:`TcpProxy.partition` stops all
forwarding without closing a socket, so the member hangs on its server
while it still runs; :meth:`TcpProxy.heal` forwards again, losing nothing.

This package needs pytest (``pip install 'lite-push[testing]'``);
``import lite_push`` never imports it.
"""

from __future__ import annotations

try:
    import pytest
except ImportError as e:  # pragma: no cover - tested in a subprocess without pytest
    raise ImportError(
        "lite_push.testing is a pytest suite and needs pytest: pip install 'lite-push[testing]' (or pip install pytest)"
    ) from e

# The suite's plain asserts report the values they compared, as in a test
# module: pytest rewrites these modules when they are imported under it.
pytest.register_assert_rewrite(
    "lite_push.testing._contract_groups",
    "lite_push.testing._contract_reading",
    "lite_push.testing._contract_retry",
    "lite_push.testing._contract_start",
    "lite_push.testing._polling",
)

from ._contract import SourceContract  # noqa: E402
from ._harness import SkewedClock, SourceHarness  # noqa: E402
from ._polling import (  # noqa: E402
    OwnershipLog,
    assert_contiguous,
    count_of,
    messages_of,
    offsets,
    poll_messages,
    poll_topic,
    poll_until,
    split,
    wait_assigned,
)
from .tcp_proxy import TcpProxy  # noqa: E402

__all__ = [
    "OwnershipLog",
    "SkewedClock",
    "SourceContract",
    "SourceHarness",
    "TcpProxy",
    "assert_contiguous",
    "count_of",
    "messages_of",
    "offsets",
    "poll_messages",
    "poll_topic",
    "poll_until",
    "split",
    "wait_assigned",
]

"""SourceContract: the four parts of the suite in one class to subclass."""

from __future__ import annotations

from ._contract_groups import GroupContract
from ._contract_reading import ReadingContract
from ._contract_retry import RetryContract
from ._contract_start import StartPositionContract

__all__ = ["SourceContract"]


class SourceContract(ReadingContract, GroupContract, StartPositionContract, RetryContract):
    """Every test a :class:`~lite_push.sources.PullSource` must pass.

    Subclass it in a test module under a name pytest collects
    (``class TestMySourceContract(SourceContract): pass``) and provide a
    ``harness`` fixture that yields a fresh
    :class:`~lite_push.testing.SourceHarness` per test and closes it after;
    each test takes ``harness`` (one also takes pytest's own ``caplog``).
    Parametrize the fixture to run the suite on several set-ups of one
    source (in memory and on disk, say), or define it as a method of the
    subclass to give one subclass a set-up of its own.

    The suite checks what ``lite_push/sources/contract.py`` promises, loosely
    timed (upper bounds with a second or more of slack), so it holds for an
    in-process source and for one behind a network.  Delayed retries are
    tested by moving the source's clock
    (:meth:`~lite_push.testing.SourceHarness.advance_clock`), not by
    sleeping.  A source that cannot do something the suite tests says so
    with the harness's flags (``allocates_by_strategy``,
    ``finds_offsets_by_time``) or the source's own properties
    (``assignment_is_lock``, ``delayed_delivery``), and the tests that need
    it adapt or skip.
    """

"""Key strings of the benchmark workloads: what key rank ``r`` is called
under each ``Workload.key_format`` (see ``workloads``).

Pure Python, no dependencies: ``workloads`` re-exports these names.
"""

from __future__ import annotations

import hashlib

__all__ = ["KEY_FORMATS", "KEY_SPACE", "key_for_rank", "key_string"]

#: The values of ``Workload.key_format``.
KEY_FORMATS = ("luhn", "sequential")
#: Distinct ``"luhn"`` key strings available: 15-digit bodies 10**14 .. 10**15-1.
KEY_SPACE = 9 * 10**14

_HALF_BITS = 25
_HALF_MASK = (1 << _HALF_BITS) - 1
_ROUNDS = 6


def _feistel(x: int, seed_key: bytes) -> int:
    """A seeded pseudo-random permutation of ``[0, 2**50)`` (balanced Feistel
    network, BLAKE2b round function)."""
    left, right = x >> _HALF_BITS, x & _HALF_MASK
    for i in range(_ROUNDS):
        digest = hashlib.blake2b(right.to_bytes(4, "little"), digest_size=4, key=seed_key, person=bytes([i]) * 16)
        left, right = right, left ^ (int.from_bytes(digest.digest(), "little") & _HALF_MASK)
    return (left << _HALF_BITS) | right


def _luhn_digit(payload: str) -> str:
    """The Luhn check digit that makes ``payload + digit`` valid."""
    total = 0
    for i, ch in enumerate(reversed(payload)):
        d = ord(ch) - 48
        if i % 2 == 0:  # the digit next to the check digit is doubled
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def key_for_rank(rank: int, seed: int) -> str:
    """The key of ``rank`` under ``seed``: a 16-digit account-number-like id
    (15 digits, the first non-zero, plus a Luhn check digit).

    The 15-digit body is ``10**14 + P(rank)`` where ``P`` is a seeded
    pseudo-random permutation of ``[0, KEY_SPACE)`` (a Feistel network over
    50 bits with cycle-walking), so distinct ranks always give distinct keys
    and the keys spread over Java-hash lanes like real ids."""
    if not 0 <= rank < KEY_SPACE:
        raise ValueError(f"rank must be in [0, {KEY_SPACE}), got {rank}")
    seed_key = seed.to_bytes(8, "little", signed=False)
    x = _feistel(rank, seed_key)
    while x >= KEY_SPACE:  # cycle-walking: stays a bijection on [0, KEY_SPACE)
        x = _feistel(x, seed_key)
    body = str(10**14 + x)
    return body + _luhn_digit(body)


def key_string(rank: int, seed: int, key_format: str = "luhn") -> str:
    """The key of ``rank``: :func:`key_for_rank` (``"luhn"``) or
    ``f"acct-{rank}"`` (``"sequential"``, which ignores the seed)."""
    if key_format == "sequential":
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        return f"acct-{rank}"
    if key_format != "luhn":
        raise ValueError(f"key_format must be one of {KEY_FORMATS}, got {key_format!r}")
    return key_for_rank(rank, seed)

"""The consistent-hash ring behind ``AllocateConsistentHash``.

It follows RocketMQ's ``ConsistentHashRouter`` with its default ``MD5Hash``:

* a key's hash is the first 4 bytes of the MD5 digest of the key's UTF-8
  bytes, read as a big-endian unsigned number (RocketMQ shifts the bytes one
  by one into a ``long`` that starts at 0, so the value is in
  ``[0, 2**32)`` and never negative);
* a node ``k`` gets virtual nodes ``"k-0"``, ``"k-1"``, ... (RocketMQ's
  ``VirtualNode.getKey()``); a node added again continues the numbering
  (``getExistingReplicas``);
* a key belongs to the first virtual node whose hash is ``>=`` the key's
  hash, wrapping around to the smallest one (``tailMap(h).firstKey()``, else
  ``firstKey()``);
* two virtual nodes with the same hash: the one put last wins (``TreeMap.put``
  replaces), so the order nodes are added in matters only then.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable

__all__ = ["HashFunction", "HashRing", "md5_hash"]

#: A ring hash: any ``str -> int`` function.  Its values are compared as
#: Python ints (RocketMQ compares Java ``long`` values, signed).
HashFunction = Callable[[str], int]


def md5_hash(key: str) -> int:
    """RocketMQ's default ring hash (``ConsistentHashRouter.MD5Hash``): the
    first 4 bytes of ``MD5(key.encode("utf-8"))`` as a big-endian unsigned
    int, in ``[0, 2**32)``.  ``md5_hash("abc") == 0x90015098``.

    RocketMQ encodes with the JVM's default charset (``String.getBytes()``),
    UTF-8 on current JVMs; for ASCII keys, as client ids and queue keys
    usually are, every charset agrees."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()[:4], "big")


class HashRing:
    """An immutable consistent-hash ring of named nodes.

    ``HashRing(nodes, virtual_node_count, hash_function)`` puts
    ``virtual_node_count`` virtual nodes of each of ``nodes`` on the ring, in
    the order given; :meth:`route` finds a key's node.
    """

    __slots__ = ("_hash", "_owners", "_points")

    def __init__(self, nodes: Iterable[str], virtual_node_count: int, hash_function: HashFunction = md5_hash) -> None:
        if isinstance(virtual_node_count, bool) or not isinstance(virtual_node_count, int):
            raise TypeError(f"virtual_node_count must be an int, got {virtual_node_count!r}")
        if virtual_node_count < 0:
            raise ValueError(f"virtual_node_count must be >= 0, got {virtual_node_count}")
        self._hash = hash_function
        ring: dict[int, str] = {}
        replicas: dict[str, int] = {}
        for node in nodes:
            first = replicas.get(node, 0)
            for i in range(first, first + virtual_node_count):
                ring[self._hash_of(f"{node}-{i}")] = node
            replicas[node] = first + virtual_node_count
        self._points = sorted(ring)
        self._owners = [ring[p] for p in self._points]

    def _hash_of(self, key: str) -> int:
        h = self._hash(key)
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"hash function {self._hash!r} returned {h!r} for {key!r}; it must return an int")
        return h

    def __len__(self) -> int:
        """The number of distinct points (virtual nodes) on the ring."""
        return len(self._points)

    def points(self) -> list[tuple[int, str]]:
        """The ring as ``(hash, node)`` pairs in increasing hash order."""
        return list(zip(self._points, self._owners, strict=True))

    def route(self, key: str) -> str | None:
        """The node owning ``key``: that of the first point with hash
        ``>= hash(key)``, wrapping around; ``None`` on an empty ring."""
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, self._hash_of(key))
        return self._owners[i if i < len(self._points) else 0]

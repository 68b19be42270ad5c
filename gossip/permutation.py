"""The seeded permutation π of a wave: positions 0..n-2 onto the members other than its origin.

Owns: `Permutation` (a keyed pseudo-random permutation evaluated one position at a time) and
`Others` (the sorted members except the origin: the labels π permutes, without a copy).
Ref: protocols.md §3.1-3.2 ("run GP on randomly permuted node labels"; "the permutation
can be drawn from a small family").

How: a 4-round Feistel network keyed by BLAKE2b(seed, round) over the smallest domain of an
even number of bits that holds N = n-1 positions, with cycle walking to stay inside [0, N).
Every node computes the same π from the same seed and member list; a lookup costs a few
hashes, so a node never builds the whole permutation (it calls O(log n) positions per wave).

Invariants: `Permutation(seed, N)` is a bijection of range(N) (cycle walking on a bijection of
a superset restricts to a bijection); `identity=True` gives plain GP (position i -> i), which
the bench uses to show what the permutation buys against adversarial crashes.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from phalanx.consensus.types import NodeId

_ROUNDS = 4


class Others:
    """The sorted members except `origin` (the same on every node), indexed in O(1)."""

    __slots__ = ("_members", "_skip")

    def __init__(self, sorted_members: Sequence[NodeId], origin: NodeId) -> None:
        self._members = sorted_members
        self._skip = bisect.bisect_left(sorted_members, origin)
        if self._skip >= len(sorted_members) or sorted_members[self._skip] != origin:
            raise ValueError(f"{origin!r} is not a member")

    def __len__(self) -> int:
        return len(self._members) - 1

    def __getitem__(self, i: int) -> NodeId:
        return self._members[i if i < self._skip else i + 1]


class Permutation:
    """A bijection of range(size) drawn from `seed` (or the identity)."""

    __slots__ = ("_bits", "_cache", "_keys", "_mask", "_seed", "identity", "size")

    def __init__(self, seed: bytes, size: int, *, identity: bool = False) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.size = size
        self.identity = identity
        half = 1
        while (1 << (2 * half)) < max(size, 2):
            half += 1
        self._bits = half
        self._mask = (1 << half) - 1
        self._seed = seed
        self._keys: tuple[bytes, ...] = ()
        """The round keys, derived at the first lookup (most nodes of a wave get an empty
        grant and never look one up)."""
        self._cache: dict[int, int] = {}

    def _round_keys(self) -> tuple[bytes, ...]:
        self._keys = tuple(
            hashlib.blake2b(self._seed, person=b"gp-round" + bytes([r]),
                            digest_size=16).digest()
            for r in range(_ROUNDS)
        )
        return self._keys

    def _feistel(self, x: int) -> int:
        bits, mask = self._bits, self._mask
        keys = self._keys or self._round_keys()
        blake2b, from_bytes = hashlib.blake2b, int.from_bytes
        left, right = x >> bits, x & mask
        for key in keys:
            digest = blake2b(right.to_bytes(4, "big"), key=key, digest_size=8).digest()
            left, right = right, left ^ (from_bytes(digest, "big") & mask)
        return (left << bits) | right

    def __call__(self, position: int) -> int:
        """π(position), for 0 <= position < size."""
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} outside [0, {self.size})")
        if self.identity:
            return position
        cached = self._cache.get(position)
        if cached is not None:
            return cached
        x = self._feistel(position)
        while x >= self.size:  # cycle walking: expected < 4 steps (domain < 4 * size)
            x = self._feistel(x)
        self._cache[position] = x
        return x

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

Shared memo: π is a pure function of (seed, N, position), and every node of a wave builds its
own `Permutation` of the same seed, so the round keys, the round functions' values and the
values looked up are kept in one `_Table` per (seed, N), shared by all of them in this
process (`_TABLES`, at most `_MAX_TABLES`, oldest out; an evicted table lives on in the
permutations holding it, just no longer shared). A round function takes a half-word (N =
179: 16 values), so its BLAKE2b is computed at most 2^half times per round and seed, not 4 per
Feistel evaluation (a wave's n-1 lookups, each called by one node, cost ~1,000 hashes
before, <= 64 at n = 180). A memo of a pure function changes no value and no call order:
cores stay deterministic and sans-IO (it is a cache, not state: what a lookup returns never
depends on which node looked first, or on what was evicted).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from phalanx.consensus.types import NodeId

_ROUNDS = 4
_MAX_TABLES = 4096


class _Table:
    """The round keys, the round functions' values (by round: half-word -> masked hash) and
    the looked-up values of one (seed, size): see "Shared memo"."""

    __slots__ = ("keys", "rounds", "values")

    def __init__(self) -> None:
        self.keys: tuple[bytes, ...] = ()
        self.rounds: tuple[dict[int, int], ...] = tuple({} for _ in range(_ROUNDS))
        self.values: dict[int, int] = {}


_TABLES: dict[tuple[bytes, int], _Table] = {}
_NO_VALUES: dict[int, int] = {}  # read only: a permutation's values before its first lookup


def _table(seed: bytes, size: int) -> _Table:
    table = _TABLES.get((seed, size))
    if table is None:
        if len(_TABLES) >= _MAX_TABLES:
            del _TABLES[next(iter(_TABLES))]
        table = _TABLES[(seed, size)] = _Table()
    return table


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

    __slots__ = ("_bits", "_cache", "_mask", "_seed", "_table", "identity", "size")

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
        self._table: _Table | None = None
        """The shared memo of (seed, size), found at the first lookup (most nodes of a wave
        get an empty grant and never look one up); its round keys are derived once."""
        self._cache: dict[int, int] = _NO_VALUES
        """`_table.values` once it is found (never written through this name)."""

    def _round_keys(self) -> tuple[bytes, ...]:
        return tuple(
            hashlib.blake2b(self._seed, person=b"gp-round" + bytes([r]),
                            digest_size=16).digest()
            for r in range(_ROUNDS)
        )

    def _feistel(self, x: int, table: _Table) -> int:
        bits, mask = self._bits, self._mask
        left, right = x >> bits, x & mask
        for r, values in enumerate(table.rounds):
            f = values.get(right)
            if f is None:  # the round function, once per (seed, size, round, half-word)
                digest = hashlib.blake2b(right.to_bytes(4, "big"), key=table.keys[r],
                                         digest_size=8).digest()
                f = values[right] = int.from_bytes(digest, "big") & mask
            left, right = right, left ^ f
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
        table = self._table
        if table is None:
            table = self._table = _table(self._seed, self.size)
        x = table.values.get(position)
        if x is None:
            if not table.keys:
                table.keys = self._round_keys()
            x = self._feistel(position, table)
            while x >= self.size:  # cycle walking: expected < 4 steps (domain < 4 * size)
                x = self._feistel(x, table)
            table.values[position] = x
        self._cache = table.values
        return x

"""The KV state's immutable base: sorted, sharded, and packed, with no object per value.

Owns: `PackedShard` (up to `SHARD_KEYS` keys in ascending order, their values packed into one
`bytes`), `ShardPacker` (cuts an ascending stream of pairs into shards) and `SortedBase` (an
ordered list of shards: the base of `phalanx.apps.kv_state.LayeredState`).

Why packed: a million 100-byte values held as `bytes` objects cost 144 bytes each (a 33-byte
header, rounded up by the allocator) plus ~36 bytes of dict slot, and a million short keys as
`str` objects another ~64 bytes each plus an 8-byte tuple or dict slot. Here a shard keeps
its values in one `bytes` and its keys in one `str`, each with an `array` of offsets: 100 + 4
bytes per value and ``len(key)`` + 4 per (ASCII) key, plus every `SAMPLE_STRIDE`-th key as a
`str` (the sample a lookup bisects), ~4.5 bytes a key. At a million 7-character keys with
100-byte values that is ~115 MiB against ~225 MiB as a dict of objects. Having no object per
key also matters for fragmentation: keys that outlive the values written beside them no longer
pin pymalloc arenas that are otherwise free.

Lookups: bisect the shards' first keys and then the shard's sample (both C), then a binary
search of at most 4 steps over slices of the packed keys, then slice the value out: about as
fast as bisecting a tuple of a shard's 4096 keys, which misses the cache on every probe.
Every other shard operation is one bounded C call per slice (`str.join`, `bytes.join`,
`array`, `map` over slices).

Why sharded: no operation on the base covers more than one shard in one C call, so none holds
the GIL for long when it runs on the checkpoint writer's thread (building, walking and freeing
a shard of 4096 keys takes under a millisecond).

GC: a shard's sample tuple holds only `str`, so the collector untracks it the first time it
examines it (`ShardPacker.flush` makes that happen at once); the packed keys, the blob and the
offsets hold no references. No pass ever walks a base again.

Invariants: a shard's keys are strictly ascending; it has `len(keys) + 1` value offsets, the
first 0 and the last `len(blob)`, and as many key offsets over its packed keys; a
`SortedBase`'s shards are non-empty and every key of one sorts before every key of the next.
Shards are immutable once built.
Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import bisect
import gc
import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

__all__ = ["SHARD_KEYS", "PackedShard", "ShardPacker", "SortedBase"]

_Packed = TypeVar("_Packed", str, bytes)

SAMPLE_STRIDE = 16
"""Every 16th key of a shard stays a `str` object, the sample a lookup bisects in C before
a binary search of at most 4 steps over the packed keys."""

SHARD_KEYS = 2048
"""Keys per shard. A lookup bisects the shards' first keys, then the shard's sample, so its
cost hardly depends on this; packing a shard (one C-level pass each to join and to offset the
keys and the values) is one step of the checkpoint writer: ~0.5 ms at 2048 100-byte values."""


def _offsets_of(lengths: Iterable[int], total: int) -> array[int]:
    """Cumulative offsets (first 0) of items of `lengths` summing to `total`, in the narrowest
    array type that holds `total`, built in one C-level pass."""
    return array("I" if total < 1 << 32 else "Q", itertools.accumulate(lengths, initial=0))


def _cut(packed: _Packed, bounds: array[int]) -> list[_Packed]:
    """The pieces of `packed` between consecutive `bounds`, each a new object (C-level)."""
    return list(map(packed.__getitem__, map(slice, bounds, itertools.islice(bounds, 1, None))))


class PackedShard:
    """Ascending keys and their values, packed (module docstring). Read-only."""

    __slots__ = ("_blob", "_kpos", "_kstr", "_offsets", "_sample")

    def __init__(self, keys: Sequence[str], blob: bytes, offsets: array[int]) -> None:
        """Take `keys` (strictly ascending: the caller's promise), the concatenated values and
        their `len(keys) + 1` offsets. Raises `ValueError` if the offsets do not fit."""
        if len(offsets) != len(keys) + 1 or offsets[0] != 0 or offsets[-1] != len(blob):
            raise ValueError("PackedShard: offsets do not match the keys and the blob")
        self._kstr = kstr = "".join(keys)
        self._kpos = kpos = _offsets_of(map(len, keys), len(kstr))
        # Fresh copies, made together, not the caller's key objects: those were made one by
        # one among the many short-lived keys and values of a checkpoint or a restore, and
        # one long-lived object is enough to keep a whole pymalloc arena resident. Made this
        # way, a million-key fold left 75-105 arenas (~1 MiB each) instead of ~160.
        n = len(keys)
        self._sample = tuple(map(kstr.__getitem__, map(
            slice, kpos[0:n:SAMPLE_STRIDE], kpos[1:n + 1:SAMPLE_STRIDE])))
        self._blob = blob
        self._offsets = offsets

    @classmethod
    def pack(cls, keys: Iterable[str], values: Iterable[bytes]) -> PackedShard:
        """A shard of `keys` (strictly ascending) and their `values`, in C-level calls."""
        values = values if isinstance(values, list) else list(values)
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        blob = b"".join(values)
        return cls(keys, blob, _offsets_of(map(len, values), len(blob)))

    def __len__(self) -> int:
        return len(self._kpos) - 1

    def key_at(self, i: int) -> str:
        kpos = self._kpos
        return self._kstr[kpos[i]:kpos[i + 1]]

    def keys(self, lo: int = 0, hi: int | None = None) -> list[str]:
        """The keys `lo`..`hi` (a slice), each a new `str`, in one C-level pass."""
        return _cut(self._kstr, self._kpos[lo: (len(self) if hi is None else hi) + 1])

    def index_from(self, key: str) -> int:
        """The position of the first key >= `key` (`bisect_left` over the keys)."""
        sample = self._sample
        b = bisect.bisect_left(sample, key)
        if b == 0:
            return 0
        # keys[(b - 1) * stride] < key <= keys[b * stride] (or b * stride is past the end)
        lo = (b - 1) * SAMPLE_STRIDE + 1
        hi = min(b * SAMPLE_STRIDE, len(self))
        kstr, kpos = self._kstr, self._kpos
        while lo < hi:
            mid = (lo + hi) >> 1
            if kstr[kpos[mid]:kpos[mid + 1]] < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def get(self, key: str) -> bytes | None:
        """The value of `key`, or None. After the sample bisect, `key` can only be one of at
        most 15 keys, whose packed text `str.find` searches in C; a hit counts only where it
        starts and ends on key boundaries (it may span two keys, or lie inside a longer one)."""
        sample = self._sample
        b = bisect.bisect_left(sample, key)
        kpos = self._kpos
        if b < len(sample) and sample[b] == key:
            i = b * SAMPLE_STRIDE
        elif b == 0:
            return None
        else:
            lo = (b - 1) * SAMPLE_STRIDE + 1
            hi = min(b * SAMPLE_STRIDE, len(kpos) - 1)
            end = kpos[hi]
            find = self._kstr.find
            at = find(key, kpos[lo], end)
            while True:
                if at < 0:
                    return None
                i = bisect.bisect_left(kpos, at, lo, hi)
                if i < hi and kpos[i] == at and kpos[i + 1] == at + len(key):
                    break
                at = find(key, at + 1, end)
        offsets = self._offsets
        return self._blob[offsets[i]:offsets[i + 1]]

    def values(self, lo: int = 0, hi: int | None = None) -> list[bytes]:
        """The values of keys `lo`..`hi` (a slice), each a new `bytes`, in one C-level pass."""
        return _cut(self._blob, self._offsets[lo: (len(self) if hi is None else hi) + 1])

    def nbytes(self) -> int:
        """Bytes held by the packed keys and values and their offsets (tests, diagnostics)."""
        return (len(self._blob) + self._offsets.itemsize * len(self._offsets)
                + len(self._kstr.encode("utf-8", "surrogatepass"))
                + self._kpos.itemsize * len(self._kpos))


class ShardPacker:
    """Cuts an ascending stream of (keys, values) pieces into shards of exactly `shard_keys`
    keys (the last one, packed by `flush`, may be shorter). The caller keeps the
    whole-stream order; a caller that paces its work adds pieces of at most `shard_keys`
    keys, so that one `add` packs at most one shard."""

    __slots__ = ("_keys", "_shard_keys", "_values", "shards")

    def __init__(self, shard_keys: int = SHARD_KEYS) -> None:
        if shard_keys < 1:
            raise ValueError(f"shard_keys must be >= 1, got {shard_keys}")
        self._shard_keys = shard_keys
        self._keys: list[str] = []
        self._values: list[bytes] = []
        self.shards: list[PackedShard] = []

    def add(self, keys: list[str], values: list[bytes]) -> bool:
        """Add one piece; True if that completed a shard (one `pack` each: about a ms)."""
        self._keys += keys
        self._values += values
        n = self._shard_keys
        if len(self._keys) < n:
            return False
        while len(self._keys) >= n:
            self._pack(self._keys[:n], self._values[:n])
            del self._keys[:n], self._values[:n]
        return True

    def flush(self) -> None:
        """Pack what is pending into a (last, shorter) shard; nothing if nothing is."""
        if self._keys:
            self._pack(self._keys, self._values)
            self._keys, self._values = [], []

    def _pack(self, keys: list[str], values: list[bytes]) -> None:
        """Pack one shard, then run one young-generation GC pass, which untracks the shard's
        new sample tuple.

        Why: a tuple is tracked until a pass finds it holds only untracked objects. The
        checkpoint writer allocates few other containers, so young passes are rare there and
        the tuples of dozens of shards would pile up between them (when shards kept every
        key in a tuple, one such pass walked ~250k keys: ~4.7 ms with the GIL held, a stall
        for the applying thread). A pass right after each pack sees one small tuple and a few
        hundred small objects (~0.1 ms)."""
        self.shards.append(PackedShard.pack(keys, values))
        gc.collect(0)


class SortedBase:
    """An immutable str -> bytes map kept as ordered packed shards (module docstring)."""

    __slots__ = ("_bounds", "length", "shards")

    def __init__(self, shards: Iterable[PackedShard | Mapping[str, bytes]]) -> None:
        """Take `shards`: non-empty, each in ascending key order, every key of one sorting
        before every key of the next. A mapping is packed in its iteration order (tests). The
        order across shards, and first-before-last inside each, is checked here (O(shards));
        the order inside each is the caller's promise (a checkpoint parse checks it on the way
        in, a fold produces it). Raises `ValueError`."""
        packed: list[PackedShard] = [
            shard if isinstance(shard, PackedShard)
            else PackedShard.pack(list(shard), list(shard.values()))
            for shard in shards
        ]
        bounds: list[str] = []
        previous_last: str | None = None
        for shard in packed:
            if not len(shard):
                raise ValueError("SortedBase: empty shard")
            first, last = shard.key_at(0), shard.key_at(len(shard) - 1)
            if first > last or (previous_last is not None and not previous_last < first):
                raise ValueError("SortedBase: shards out of key order")
            bounds.append(first)
            previous_last = last
        self.shards = packed
        self._bounds = bounds
        self.length = sum(map(len, packed))

    @classmethod
    def from_items(cls, items: Mapping[str, bytes], *, shard_keys: int = SHARD_KEYS) -> SortedBase:
        """A base holding `items`, in any order (sorts them in one call: tests, small maps)."""
        if shard_keys < 1:
            raise ValueError(f"shard_keys must be >= 1, got {shard_keys}")
        keys = sorted(items)
        cuts = [keys[lo: lo + shard_keys] for lo in range(0, len(keys), shard_keys)]
        return cls([PackedShard.pack(cut, [items[k] for k in cut]) for cut in cuts])

    def __len__(self) -> int:
        return self.length

    def get(self, key: str) -> bytes | None:
        i = bisect.bisect_right(self._bounds, key)
        return self.shards[i - 1].get(key) if i else None

    def keys_from(self, start: str) -> Iterator[str]:
        """Keys >= `start`, ascending."""
        i = max(bisect.bisect_right(self._bounds, start) - 1, 0)
        for shard in self.shards[i:]:
            yield from shard.keys(shard.index_from(start))

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every pair, ascending (tests, small maps)."""
        for shard in self.shards:
            yield from zip(shard.keys(), shard.values(), strict=True)

    def windows(self, size: int) -> Iterator[tuple[list[str], list[bytes]]]:
        """Keys and values in ascending order, at most `size` per window, each window built
        by C-level calls over one shard."""
        for shard in self.shards:
            for lo in range(0, len(shard), size):
                hi = min(lo + size, len(shard))
                yield shard.keys(lo, hi), shard.values(lo, hi)

"""The KV state's immutable base: sorted, sharded, and packed, with no object per value.

Owns: `PackedShard` (up to `SHARD_KEYS` keys in ascending order, their values packed into one
`bytes`), `ShardPacker` (cuts an ascending stream of pairs into shards) and `SortedBase` (an
ordered list of shards: the base of `phalanx.apps.kv_state.LayeredState`).

Why packed: a million 100-byte values held as `bytes` objects cost 144 bytes each (a 33-byte
header, rounded up by the allocator) plus ~36 bytes of dict slot, against 100 bytes of value
and 16 of index here (a tuple slot for the key, an offset). The keys stay `str` objects (a
lookup bisects them). At a million keys that is ~65 MiB less resident memory for the same
state. A lookup costs ~0.5 us more than a dict's (two bisects and a slice, which copies the
value out); every shard operation is one bounded C call (`bytes.join`, `array`, a slice).

Why sharded: no operation on the base covers more than one shard in one C call, so none holds
the GIL for long when it runs on the checkpoint writer's thread (building, walking and freeing
a shard of 4096 keys takes under a millisecond).

GC: a shard's key tuple holds only `str`, so the collector untracks it the first time it
examines it (`ShardPacker.flush` makes that happen at once); the blob and the offsets hold no
references. No pass ever walks a base again.

Invariants: a shard's keys are strictly ascending and it has `len(keys) + 1` offsets, the
first 0 and the last `len(blob)`; a `SortedBase`'s shards are non-empty and every key of one
sorts before every key of the next. Shards are immutable once built.
Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import bisect
import gc
import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping

__all__ = ["SHARD_KEYS", "PackedShard", "ShardPacker", "SortedBase"]

SHARD_KEYS = 4096
"""Keys per shard (about: a piece is never split). A lookup bisects the shards' first keys,
then the shard's keys, so its cost does not depend on this; packing a shard is one C call
each for the join and the offsets, ~0.6 ms at 4096 100-byte values (page faults included)."""


class PackedShard:
    """Ascending keys and their values, packed (module docstring). Read-only."""

    __slots__ = ("_blob", "_offsets", "keys")

    def __init__(self, keys: tuple[str, ...], blob: bytes, offsets: array[int]) -> None:
        """Take `keys` (strictly ascending: the caller's promise), the concatenated values and
        their `len(keys) + 1` offsets. Raises `ValueError` if the offsets do not fit."""
        if len(offsets) != len(keys) + 1 or offsets[0] != 0 or offsets[-1] != len(blob):
            raise ValueError("PackedShard: offsets do not match the keys and the blob")
        self.keys = keys
        self._blob = blob
        self._offsets = offsets

    @classmethod
    def pack(cls, keys: Iterable[str], values: Iterable[bytes]) -> PackedShard:
        """A shard of `keys` (strictly ascending) and their `values`, in C-level calls."""
        values = values if isinstance(values, list) else list(values)
        offsets = array("Q", itertools.accumulate(map(len, values), initial=0))
        return cls(tuple(keys), b"".join(values), offsets)

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, key: str) -> bytes | None:
        keys = self.keys
        i = bisect.bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            return None
        offsets = self._offsets
        return self._blob[offsets[i]:offsets[i + 1]]

    def values(self, lo: int = 0, hi: int | None = None) -> list[bytes]:
        """The values of keys `lo`..`hi` (a slice), each a new `bytes`, in one C-level pass."""
        bounds = self._offsets[lo: (len(self.keys) if hi is None else hi) + 1]
        return list(map(self._blob.__getitem__,
                        map(slice, bounds, itertools.islice(bounds, 1, None))))

    def index_from(self, start: str) -> int:
        """The position of the first key >= `start`."""
        return bisect.bisect_left(self.keys, start)

    def nbytes(self) -> int:
        """Bytes held by the blob and the offsets (tests, diagnostics)."""
        return len(self._blob) + self._offsets.itemsize * len(self._offsets)


class ShardPacker:
    """Collects ascending (keys, values) pieces and packs them into shards of at least
    `shard_keys` keys (a piece is never split, so a shard may exceed it by less than a piece).
    The caller keeps the whole-stream order; `add` returns the shard it completed, if any."""

    __slots__ = ("_keys", "_shard_keys", "_values", "shards")

    def __init__(self, shard_keys: int = SHARD_KEYS) -> None:
        if shard_keys < 1:
            raise ValueError(f"shard_keys must be >= 1, got {shard_keys}")
        self._shard_keys = shard_keys
        self._keys: list[str] = []
        self._values: list[bytes] = []
        self.shards: list[PackedShard] = []

    def add(self, keys: list[str], values: list[bytes]) -> bool:
        """Add one piece; True if that completed a shard (one `pack`: well under a ms)."""
        self._keys += keys
        self._values += values
        if len(self._keys) < self._shard_keys:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Pack what is pending into a shard (nothing if nothing is), then run one
        young-generation GC pass, which untracks the shard's new key tuple.

        Why: a tuple is tracked until a pass finds it holds only untracked objects. The
        checkpoint writer allocates few other containers, so young passes are rare there and
        the key tuples of ~60 shards piled up between them: one pass then walked ~250k keys,
        ~4.7 ms with the GIL held, a stall for the applying thread. A pass right after each
        pack sees one tuple and a few hundred small objects (~0.1 ms)."""
        if self._keys:
            self.shards.append(PackedShard.pack(self._keys, self._values))
            self._keys, self._values = [], []
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
            first, last = shard.keys[0], shard.keys[-1]
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
            yield from itertools.islice(shard.keys, shard.index_from(start), None)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every pair, ascending (tests, small maps)."""
        for shard in self.shards:
            yield from zip(shard.keys, shard.values(), strict=True)

    def windows(self, size: int) -> Iterator[tuple[list[str], list[bytes]]]:
        """Keys and values in ascending order, at most `size` per window, each window built
        by C-level calls over one shard."""
        for shard in self.shards:
            for lo in range(0, len(shard), size):
                hi = min(lo + size, len(shard))
                yield list(shard.keys[lo:hi]), shard.values(lo, hi)

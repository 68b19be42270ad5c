"""The KV state's immutable base: sorted, sharded, and packed, with no object per value.

Owns: `PackedShard` (about `SHARD_KEYS` keys in ascending order, their values packed into one
`bytes`), `ShardPacker` (cuts an ascending stream of pairs into shards by the cut rule below),
`cut_positions` (the rule) and `SortedBase` (an ordered list of shards: the base of
`phalanx.apps.kv_state.LayeredState`).

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
fast as bisecting a tuple of a shard's keys, which misses the cache on every probe.
Every other shard operation is one bounded C call per slice (`str.join`, `bytes.join`,
`array`, `map` over slices).

Why sharded: no operation on the base covers more than one shard in one C call, so none holds
the GIL for long when it runs on the checkpoint writer's thread (building, walking and freeing
a shard of `MAX_SHARD_KEYS` keys takes about a millisecond).

GC: a shard's sample tuple holds only `str`, so the collector untracks it the first time it
examines it (`ShardPacker` makes that happen at once); the packed keys, the blob and the
offsets hold no references. No pass ever walks a base again.

Where shards end (content-defined, so a checkpoint reuses what did not change): a shard ends
after a key whose CRC-32 (of its UTF-8) is divisible by the cut rule's mean `SHARD_KEYS`
("a cut key"), or when it reaches `MAX_SHARD_KEYS` keys, or at the end of the key set.
`ShardPacker` cuts a stream that way, so the shards of a key set are a function of the key
set alone, not of its history: every replica holding the same state holds the same shards,
and their serialisation (the KV checkpoint) is the same bytes. And because a cut depends only
on the keys since the previous cut, a change to a few keys changes only the shards around
them: a checkpoint reuses every other shard as it is (`ShardPacker.reuse`), with no work per
key. A shard the packer cut records the rule it follows (`PackedShard.cut_by`); any other (a
checkpoint's, or one built by hand in a test) is checked against the rule by the first fold
that would reuse it (`PackedShard.follows`), and re-cut if it does not follow it.

Invariants: a shard's keys are strictly ascending; it has `len(keys) + 1` value offsets, the
first 0 and the last `len(blob)`, and as many key offsets over its packed keys; a
`SortedBase`'s shards are non-empty and every key of one sorts before every key of the next;
a shard with `cut_by` set is exactly what that rule makes of its keys.
Shards are immutable once built (`cut_by` is a cache of a fact about the keys, set at most
once per rule; `ckpt_digest` a cache of their checkpoint bytes' hash).
Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import operator
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

__all__ = [
    "MAX_SHARD_KEYS", "SHARD_KEYS", "PackedShard", "ShardPacker", "SortedBase", "cut_positions",
    "is_cut",
]

_Packed = TypeVar("_Packed", str, bytes)

SAMPLE_STRIDE = 16
"""Every 16th key of a shard stays a `str` object, the sample a lookup bisects in C before
a binary search of at most 4 steps over the packed keys."""

SHARD_KEYS = 1024
"""The cut rule's mean: a key ends a shard when its CRC-32 is divisible by this (module
docstring), so shards hold about this many keys. A lookup bisects the shards' first keys,
then the shard's sample, so its cost hardly depends on this; packing a shard (one C-level
pass each to join and to offset the keys and the values) is one step of the checkpoint
writer: ~0.25 ms at 1024 100-byte values."""

MAX_SHARD_KEYS_FACTOR = 4
MAX_SHARD_KEYS = MAX_SHARD_KEYS_FACTOR * SHARD_KEYS
"""A shard with no cut key in this many keys ends anyway (1 in e^4, ~2%, of shards at the
mean), so no shard, and no step of the writer, grows without bound (keys can be chosen)."""

_UTF8 = operator.methodcaller("encode", "utf-8", "surrogatepass")


def cut_positions(keys: Iterable[str], mean: int) -> list[int]:
    """The positions in `keys` of the cut keys under the rule with mean `mean` (a CRC-32 of
    each key's UTF-8 in C-level passes; ~0.1-0.2 us a key)."""
    return [i for i, crc in enumerate(map(zlib.crc32, map(_UTF8, keys))) if not crc % mean]


def is_cut(key: str, mean: int) -> bool:
    """Whether `key` is a cut key under the rule with mean `mean`."""
    return not zlib.crc32(_UTF8(key)) % mean


def _offsets_of(lengths: Iterable[int], total: int) -> array[int]:
    """Cumulative offsets (first 0) of items of `lengths` summing to `total`, in the narrowest
    array type that holds `total`, built in one C-level pass."""
    return array("I" if total < 1 << 32 else "Q", itertools.accumulate(lengths, initial=0))


def _cut(packed: _Packed, bounds: array[int]) -> list[_Packed]:
    """The pieces of `packed` between consecutive `bounds`, each a new object (C-level)."""
    return list(map(packed.__getitem__, map(slice, bounds, itertools.islice(bounds, 1, None))))


class PackedShard:
    """Ascending keys and their values, packed (module docstring). Read-only."""

    __slots__ = ("_blob", "_kpos", "_kstr", "_offsets", "_sample", "ckpt_digest", "cut_by")

    def __init__(self, keys: Sequence[str], blob: bytes, offsets: array[int]) -> None:
        """Take `keys` (strictly ascending: the caller's promise), the concatenated values and
        their `len(keys) + 1` offsets. Raises `ValueError` if the offsets do not fit."""
        if len(offsets) != len(keys) + 1 or offsets[0] != 0 or offsets[-1] != len(blob):
            raise ValueError("PackedShard: offsets do not match the keys and the blob")
        kstr = "".join(keys)
        self._adopt(kstr, _offsets_of(map(len, keys), len(kstr)), blob, offsets)

    def _adopt(self, kstr: str, kpos: array[int], blob: bytes, offsets: array[int]) -> None:
        self._kstr = kstr
        self._kpos = kpos
        # Fresh copies, made together, not the caller's key objects: those were made one by
        # one among the many short-lived keys and values of a checkpoint or a restore, and
        # one long-lived object is enough to keep a whole pymalloc arena resident. Made this
        # way, a million-key fold left 75-105 arenas (~1 MiB each) instead of ~160.
        n = len(kpos) - 1
        self._sample = tuple(map(kstr.__getitem__, map(
            slice, kpos[0:n:SAMPLE_STRIDE], kpos[1:n + 1:SAMPLE_STRIDE])))
        self._blob = blob
        self._offsets = offsets
        self.cut_by = 0
        """The mean of the cut rule this shard is known to follow (it was cut by it, or
        checked: `follows`), else 0."""
        self.ckpt_digest: bytes | None = None
        """A cache `phalanx.apps.kv_checkpoint` keeps: the SHA-256 of this shard's checkpoint
        bytes once computed (a content-addressed store then skips an unchanged shard)."""

    def follows(self, mean: int, *, last: bool) -> bool:
        """Whether this shard is what the cut rule with mean `mean` makes of its keys, when
        they follow a cut: it ends at its only cut key, or holds `MAX_SHARD_KEYS_FACTOR *
        mean` keys with none, or (`last`: nothing follows it) ends with none. Remembered in
        `cut_by` (a CRC-32 per key the first time: ~0.2 ms at 1024 keys)."""
        if self.cut_by == mean:
            return True
        n = len(self)
        most = MAX_SHARD_KEYS_FACTOR * mean
        if n > most:
            return False
        cuts = cut_positions(self.keys(), mean)
        if cuts == [n - 1] or (not cuts and (last or n == most)):
            self.cut_by = mean
            return True
        return False

    @classmethod
    def pack(cls, keys: Iterable[str], values: Iterable[bytes]) -> PackedShard:
        """A shard of `keys` (strictly ascending) and their `values`, in C-level calls."""
        values = values if isinstance(values, list) else list(values)
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        blob = b"".join(values)
        return cls(keys, blob, _offsets_of(map(len, values), len(blob)))

    @classmethod
    def from_packed(cls, kstr: str, kpos: array[int], blob: bytes,
                    offsets: array[int]) -> PackedShard:
        """A shard over already packed keys and values (a checkpoint's, see `packed`): the
        keys `kstr[kpos[i]:kpos[i + 1]]`, their values `blob[offsets[i]:offsets[i + 1]]`.
        Checks only that the offsets span both (O(1)); the order of the keys, and offsets
        that never decrease, are the caller's promise (a checkpoint parse checks them).
        Raises `ValueError`."""
        if (len(kpos) != len(offsets) or len(kpos) < 2 or kpos[0] != 0 or offsets[0] != 0
                or kpos[-1] != len(kstr) or offsets[-1] != len(blob)):
            raise ValueError("PackedShard: offsets do not match the keys and the blob")
        shard = cls.__new__(cls)
        shard._adopt(kstr, kpos, blob, offsets)
        return shard

    def packed(self) -> tuple[str, array[int], bytes, array[int]]:
        """The packed keys, their offsets, the packed values and theirs (see `from_packed`):
        shared, not copied; nobody may change them."""
        return self._kstr, self._kpos, self._blob, self._offsets

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
        """The value of `key`, or None (see `position`)."""
        i = self.position(key)
        if i < 0:
            return None
        offsets = self._offsets
        return self._blob[offsets[i]:offsets[i + 1]]

    def position(self, key: str) -> int:
        """The index of `key` among the keys, or -1. After the sample bisect, `key` can only
        be one of at most 15 keys, whose packed text `str.find` searches in C; a hit counts
        only where it starts and ends on key boundaries (it may span two keys, or lie inside
        a longer one)."""
        sample = self._sample
        b = bisect.bisect_left(sample, key)
        if b < len(sample) and sample[b] == key:
            return b * SAMPLE_STRIDE
        if b == 0:
            return -1
        kpos = self._kpos
        lo = (b - 1) * SAMPLE_STRIDE + 1
        hi = min(b * SAMPLE_STRIDE, len(kpos) - 1)
        end = kpos[hi]
        find = self._kstr.find
        at = find(key, kpos[lo], end)
        while at >= 0:
            i = bisect.bisect_left(kpos, at, lo, hi)
            if i < hi and kpos[i] == at and kpos[i + 1] == at + len(key):
                return i
            at = find(key, at + 1, end)
        return -1

    def with_values(self, changes: list[tuple[int, bytes]]) -> PackedShard:
        """A shard with the same keys (shared, not copied: same cut, same sample) and the
        values at the ascending, distinct positions of `changes` replaced: the blob spliced
        around them in C-level slices, not cut into a value apiece."""
        blob, offsets = self._blob, self._offsets
        pieces: list[bytes] = []
        lengths = array("Q", map(operator.sub, itertools.islice(offsets, 1, None), offsets))
        start = 0
        for i, value in changes:
            pieces.append(blob[start:offsets[i]])
            pieces.append(value)
            lengths[i] = len(value)
            start = offsets[i + 1]
        pieces.append(blob[start:])
        new_blob = b"".join(pieces)
        shard = PackedShard.__new__(PackedShard)
        shard._kstr, shard._kpos, shard._sample = self._kstr, self._kpos, self._sample
        shard._blob = new_blob
        shard._offsets = _offsets_of(lengths, len(new_blob))
        shard.cut_by = self.cut_by
        shard.ckpt_digest = None  # new values: new checkpoint bytes
        return shard

    def values(self, lo: int = 0, hi: int | None = None) -> list[bytes]:
        """The values of keys `lo`..`hi` (a slice), each a new `bytes`, in one C-level pass."""
        return _cut(self._blob, self._offsets[lo: (len(self) if hi is None else hi) + 1])

    def nbytes(self) -> int:
        """Bytes held by the packed keys and values and their offsets (tests, diagnostics)."""
        return (len(self._blob) + self._offsets.itemsize * len(self._offsets)
                + len(self._kstr.encode("utf-8", "surrogatepass"))
                + self._kpos.itemsize * len(self._kpos))


class ShardPacker:
    """Cuts an ascending stream of (keys, values) pieces into shards by the cut rule with mean
    `shard_keys` (module docstring): a shard ends after a cut key, or at
    `MAX_SHARD_KEYS_FACTOR * shard_keys` keys, or (`flush`) at the end of the stream. The
    caller keeps the whole-stream order. A caller that paces its work adds pieces of at most
    about `shard_keys` keys, so that one `add` packs about one shard.

    `reuse` passes on a shard of an earlier packing by the same rule unchanged: when nothing
    is pending, a shard's keys alone decide where it ends, so the rule would cut that shard's
    keys into that very shard again."""

    __slots__ = ("_keys", "_max", "_shard_keys", "_values", "shards")

    def __init__(self, shard_keys: int = SHARD_KEYS) -> None:
        if shard_keys < 1:
            raise ValueError(f"shard_keys must be >= 1, got {shard_keys}")
        self._shard_keys = shard_keys
        self._max = MAX_SHARD_KEYS_FACTOR * shard_keys
        self._keys: list[str] = []
        self._values: list[bytes] = []
        self.shards: list[PackedShard] = []

    @property
    def pending(self) -> int:
        """Keys added but not packed yet (they wait for a cut)."""
        return len(self._keys)

    def add(self, keys: list[str], values: list[bytes]) -> bool:
        """Add one piece; True if that completed a shard (one `pack` each: ~0.25 ms at the
        mean)."""
        held = len(self._keys)
        self._keys += keys
        self._values += values
        start, most = 0, self._max
        for at in cut_positions(keys, self._shard_keys):
            end = held + at + 1
            while end - start > most:  # no cut key within the limit: a forced cut
                self._pack(start, start + most)
                start += most
            self._pack(start, end)
            start = end
        while len(self._keys) - start >= most:
            self._pack(start, start + most)
            start += most
        if not start:
            return False
        del self._keys[:start], self._values[:start]
        return True

    def reuse(self, shard: PackedShard) -> None:
        """Append `shard`, cut by this rule from the keys that follow the previous cut. Raises
        `RuntimeError` if keys are pending (our own misuse: the rule would cut differently)."""
        if self._keys:
            raise RuntimeError("ShardPacker.reuse with keys pending")
        self.shards.append(shard)

    def flush(self) -> None:
        """Pack what is pending into a (last) shard; nothing if nothing is."""
        if self._keys:
            self._pack(0, len(self._keys))
            self._keys, self._values = [], []

    def _pack(self, lo: int, hi: int) -> None:
        """Pack the pending keys `lo`..`hi` into a shard, then run one young-generation GC
        pass, which untracks the shard's new sample tuple.

        Why: a tuple is tracked until a pass finds it holds only untracked objects. The
        checkpoint writer allocates few other containers, so young passes are rare there and
        the tuples of dozens of shards would pile up between them (when shards kept every
        key in a tuple, one such pass walked ~250k keys: ~4.7 ms with the GIL held, a stall
        for the applying thread). A pass right after each pack sees one small tuple and a few
        hundred small objects (~0.1 ms)."""
        shard = PackedShard.pack(self._keys[lo:hi], self._values[lo:hi])
        shard.cut_by = self._shard_keys
        self.shards.append(shard)
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
    def ordered(cls, shards: list[PackedShard], firsts: list[str]) -> SortedBase:
        """A base of `shards`, already in order with their `firsts` keys (a `ShardPacker`'s
        output, our own invariant: not checked again, so that building a base of ~1000
        shards is not one long step)."""
        if len(firsts) != len(shards):
            raise ValueError("SortedBase.ordered: one first key per shard")
        base = cls.__new__(cls)
        base.shards = shards
        base._bounds = firsts
        base.length = sum(map(len, shards))
        return base

    @classmethod
    def from_items(cls, items: Mapping[str, bytes], *, shard_keys: int = SHARD_KEYS) -> SortedBase:
        """A base holding `items`, in any order, cut by the rule with mean `shard_keys` (sorts
        them in one call: tests, small maps)."""
        packer = ShardPacker(shard_keys)
        keys = sorted(items)
        packer.add(keys, [items[k] for k in keys])
        packer.flush()
        return cls(packer.shards)

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

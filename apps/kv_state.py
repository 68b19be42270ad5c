"""The KV store's state: a sorted, sharded, packed base under persistent overlays,
snapshotted in O(1) and serialised in bounded steps.

Owns: `LayeredState` (the live state of `phalanx.apps.kv.KvStateMachine`) and
`LayeredSnapshot` (an immutable view of it). The base is `phalanx.apps.kv_base.SortedBase`.

Layout, newest first:
    live     an `immutables.MapMutation` taking every write in place (``None`` marks a
             deleted key): no copied path per write, and nothing else ever reads it
    levels   older overlays, frozen when a snapshot was taken (oldest first)
    base     a `SortedBase`, never mutated after it is installed
A read looks in `live`, then the levels from newest to oldest, then `base`.

`SortedBase` is a list of packed shards of at most `SHARD_KEYS` keys each, cut from the key
order (see `phalanx.apps.kv_base` for the layout and its memory figures). Why this shape:
- No operation on the base ever covers more than one shard in one C call. A single dict of
  a million keys cannot be built, grown, copied or dropped without a C call of 15-40 ms
  with the GIL held (a resize rehashes every entry, reading each key object: a cache miss
  apiece), and that call stalls the applying thread when it runs on the checkpoint writer.
- The base is already in key order, so a checkpoint does not sort it: it streams the shards
  and merges in only the overlay keys (sorted in steps). Shard slices pass through C-level
  calls (slices, `map`, `msgpack`), with no per-key Python code.
- No GC pass walks the base: a shard's key sample is untracked once the collector has seen
  it, and its keys and values are one `str` and one `bytes`. A HAMT node per few keys (an
  all-`immutables.Map` state) costs ~250 bytes per key at a million keys and ~300k tracked
  objects.

Snapshots and folding:
- `snapshot()` is O(1): the current `live` mutation is finished into a map that becomes the
  newest level (it is never written again) and a fresh `live` starts; the snapshot holds
  `base` and the levels.
- Serialising the snapshot (`sorted_chunks`, on the checkpoint writer's thread) also builds
  the *folded* base, base plus its levels, in shards of `SHARD_KEYS` keys, as a
  by-product. Once it is complete, the next write or snapshot on the live state adopts it:
  `base` becomes the folded base and the levels it covers are dropped. So the overlays stay
  about one checkpoint interval deep.
- The replaced base and levels are taken apart a piece per write (a shard, or `REAP_STEP`
  keys of a level), and only once nothing else references them (`sys.getrefcount`): an
  older snapshot still reading them keeps them whole, and frees them when it goes.
- Adoption changes where values are stored, never what any key reads: the folded base holds
  exactly base-plus-levels at the snapshot, and newer writes sit in newer layers. So results
  never depend on whether or when a fold was adopted (determinism for the simulator, which
  writes checkpoints inline and so always adopts at the same point).

Invariants: `base` and every level are immutable once installed (a snapshot may be reading
them on another thread), until replaced and referenced by nothing else; `len(state)` is the
number of keys with a value; keys are `str`, values `bytes` (checked by the KV app before
they get here); a `SortedBase`'s shards are non-empty, each in ascending insertion order,
and ordered between each other.
Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import sys
from collections.abc import Callable, Iterable, Iterator

import immutables

from phalanx.apps.kv_base import SHARD_KEYS, ShardPacker, SortedBase
from phalanx.apps.sorted_steps import sorted_in_steps

__all__ = ["SHARD_KEYS", "LayeredSnapshot", "LayeredState", "SortedBase"]

Overlay = immutables.Map[str, bytes | None]
LiveLayer = immutables.MapMutation[str, bytes | None]
_ABSENT = object()  # "this layer says nothing about the key" (None means: deleted)
MAINTAIN_PIECES = 8
"""Pieces `maintain` frees per call (~1 ms; the runtime calls it on idle ticks): at 100
ticks a second, ~100k keys of replaced levels a second."""
REAP_STEP = 128
"""Keys of a replaced level deleted per write (see `LayeredState._reap`): ~0.1 ms."""
_EMPTY = SortedBase([])


def _lookup(key: str, layers: tuple[Overlay, ...], base: SortedBase) -> bytes | None:
    """`key` through `layers` (newest LAST) then `base`."""
    for layer in reversed(layers):
        value = layer.get(key, _ABSENT)
        if value is not _ABSENT:
            return value  # type: ignore[return-value]  # bytes | None
    return base.get(key)


def _in_levels(layers: tuple[Overlay, ...], key: str) -> bytes | None:
    """`key`'s value in the newest of `layers` (newest LAST) that has it."""
    for layer in reversed(layers):
        value = layer.get(key, _ABSENT)
        if value is not _ABSENT:
            return value  # type: ignore[return-value]  # bytes | None
    raise KeyError(key)


def _distinct_keys(levels: tuple[Overlay, ...]) -> Iterator[str]:
    """Every key of `levels` (oldest first) once: each level's keys that no newer one has."""
    for i, level in enumerate(levels):
        keys: Iterator[str] = iter(level)
        for newer in levels[i + 1:]:  # C-level filters: no Python code per key
            keys = itertools.filterfalse(newer.__contains__, keys)
        yield from keys


def _merge_into(
    keys: list[str], values: list[bytes], changes: list[str],
    value_of: Callable[[str], bytes | None],
) -> None:
    """Apply the overlay's `changes` (ascending keys; `value_of` gives each one's value, None
    for deleted) to the ascending `keys`/`values`, in place. A bisect per change, not a
    dict of the window: a window holds thousands of base keys and usually a few changes."""
    lo = 0
    for key in changes:
        value = value_of(key)
        i = bisect.bisect_left(keys, key, lo)
        if i < len(keys) and keys[i] == key:
            if value is None:
                del keys[i], values[i]
            else:
                values[i] = value
        elif value is not None:
            keys.insert(i, key)
            values.insert(i, value)
        lo = i


def _without_deleted(keys: list[str], values: list[bytes | None]) -> tuple[list[str], list[bytes]]:
    if None not in values:
        return keys, values  # type: ignore[return-value]  # no None left
    kept = list(map(operator.is_not, values, itertools.repeat(None)))
    return list(itertools.compress(keys, kept)), list(itertools.compress(values, kept))  # type: ignore[arg-type]


def _count_keys(base: SortedBase, layers: tuple[Overlay, ...]) -> int:
    """Keys with a value in `layers` (oldest first) over `base`: the base's count, plus each
    overlay key's newest value (set or deleted) against whether the base has it."""
    count = len(base)
    for key in _distinct_keys(layers):
        count += (_in_levels(layers, key) is not None) - (base.get(key) is not None)
    return count


class LayeredSnapshot:
    """base + levels at one instant. Read-only; safe to serialise on another thread."""

    __slots__ = ("_base", "_count", "_levels", "folded")

    def __init__(self, base: SortedBase, levels: tuple[Overlay, ...]) -> None:
        self._base = base
        self._levels = levels
        self._count: int | None = None
        self.folded: SortedBase | None = None
        """base + levels as one `SortedBase`, set once `sorted_chunks` ran to the end (only
        when there were levels to fold)."""

    def count(self) -> int:
        """How many keys have a value. O(overlay keys) base lookups the first time (tests,
        tools); a checkpoint counts its keys as it streams them instead."""
        if self._count is None:
            self._count = _count_keys(self._base, self._levels)
        return self._count

    def release(self) -> None:
        """Read from the folded base from now on (the same contents), dropping the base and
        levels it was folded from, so the live state can take the old base apart."""
        if self.folded is not None:
            self._base, self._levels = self.folded, ()

    def covers(self, base: SortedBase, levels: tuple[Overlay, ...]) -> int:
        """How many of `levels` (oldest first) this snapshot's fold replaces, or 0 if it was
        taken over another base or other levels."""
        n = len(self._levels)
        if base is not self._base or n == 0 or len(levels) < n:
            return 0
        # Identity, not equality: the very same (immutable) layers, compared in O(levels).
        if any(mine is not theirs for mine, theirs in zip(self._levels, levels, strict=False)):
            return 0
        return n

    def sorted_chunks(
        self, *, chunk: int, window: int, run: int, step: int, shard: int = SHARD_KEYS
    ) -> Iterator[tuple[list[str], list[bytes]] | None]:
        """Every (key, value) in ascending key order, as (keys, values) of exactly `chunk`
        pairs (the last one shorter; none if empty), with `None` between bounded pieces of
        work. `window` bounds the base keys one step handles (C-level work); `run` and
        `step` bound the sorting of the overlay keys (see `sorted_in_steps`). Building the
        folded base rides along: the output is cut into shards of `shard` keys, one packed
        per step."""
        if min(chunk, window, run, step, shard) < 1:
            raise ValueError("chunk, window, run, step and shard must be >= 1")
        base, levels = self._base, self._levels
        # The overlay keys, each once, sorted in steps. No dict of them all is built: growing
        # a dict of a few hundred thousand keys means resizes of several ms each.
        sorted_overlay = sorted_in_steps(_distinct_keys(levels), run=run, step=step)
        overlay_value: Callable[[str], bytes | None] = (
            levels[0].__getitem__ if len(levels) == 1 else functools.partial(_in_levels, levels)
        )
        base_windows = base.windows(window)
        fold = ShardPacker(shard) if levels else None
        out_keys: list[str] = []
        out_values: list[bytes] = []
        # A two-way merge in windows. Each side keeps a buffer of its next keys, in order;
        # a side that is not exhausted has no unseen key below its buffer's last key, so
        # every key up to `high` (the lower of the two last keys) is buffered on both sides.
        # The side that set `high` empties its buffer, so every round makes progress.
        b_keys: list[str] = []
        b_values: list[bytes] = []
        o_keys: list[str] = []
        b_done = o_done = False
        emitted = 0
        while True:
            if not b_keys and not b_done:
                b_keys, b_values = next(base_windows, ([], []))
                b_done = not b_keys
            while not o_keys and not o_done:
                pulled = next(sorted_overlay, _ABSENT)
                if pulled is _ABSENT:
                    o_done = True
                elif pulled is None:
                    yield None
                else:
                    o_keys = pulled  # type: ignore[assignment]  # list[str]
                    yield None  # the heap merge's share; the window merge is the next step
            if not b_keys and not o_keys:
                break
            if not o_keys:  # base only: no deletions to drop
                kept_keys, kept_values = b_keys, b_values
                b_keys, b_values = [], []
            elif not b_keys:
                keys, o_keys = o_keys, []
                kept_keys, kept_values = _without_deleted(
                    keys, list(map(overlay_value, keys))
                )
            else:
                high = min(b_keys[-1], o_keys[-1])
                b_cut = bisect.bisect_right(b_keys, high)
                o_cut = bisect.bisect_right(o_keys, high)
                kept_keys, kept_values = b_keys[:b_cut], b_values[:b_cut]
                del b_keys[:b_cut], b_values[:b_cut]
                mine = o_keys[:o_cut]
                del o_keys[:o_cut]
                _merge_into(kept_keys, kept_values, mine, overlay_value)
            out_keys += kept_keys
            out_values += kept_values
            while len(out_keys) >= chunk:
                yield None  # the window merge above was this step; packing a shard is the next
                done_keys, done_values = out_keys[:chunk], out_values[:chunk]
                del out_keys[:chunk], out_values[:chunk]
                if fold is not None:
                    for lo in range(0, len(done_keys), shard):  # at most one pack per step
                        if fold.add(done_keys[lo:lo + shard], done_values[lo:lo + shard]):
                            yield None  # the fold packed a shard
                emitted += chunk
                yield done_keys, done_values
            yield None
        if out_keys:
            if fold is not None:
                for lo in range(0, len(out_keys), shard):
                    if fold.add(out_keys[lo:lo + shard], out_values[lo:lo + shard]):
                        yield None
            emitted += len(out_keys)
            yield out_keys, out_values
        if fold is not None:
            fold.flush()
        self._count = emitted
        # Drop this frame's references to the layers BEFORE publishing the fold: the applying
        # thread may adopt it at once, and must then hold the last references to the old
        # base and levels, to take them apart in steps. Otherwise this frame's teardown would
        # free them here, in one long call, with the GIL held.
        del base, levels, base_windows, sorted_overlay, overlay_value
        if fold is not None:
            self.folded = SortedBase(fold.shards)


class LayeredState:
    """The live KV state (see the module docstring)."""

    __slots__ = ("_base", "_graveyard", "_len", "_levels", "_live", "_snapshot")

    # NB: `_len` is a cache (None: unknown). Writes do not keep a count: knowing whether a
    # put adds a key would cost a lookup through the layers and the base on every write
    # (~4.5 us at a million keys: a fifth of a WAL replay's time). `len()` counts on demand.

    def __init__(self, base: SortedBase | None = None) -> None:
        # Replaced bases and levels, taken apart in steps.
        self._graveyard: list[SortedBase | Overlay] = []
        self._base: SortedBase = base if base is not None else _EMPTY
        self._levels: tuple[Overlay, ...] = ()
        self._live: LiveLayer = immutables.Map().mutate()
        self._len: int | None = len(self._base)
        self._snapshot: LayeredSnapshot | None = None  # the newest, until its fold is adopted

    def __len__(self) -> int:
        """Keys with a value: cached, or counted over the overlays (O(overlay keys) lookups;
        tests and tools, not the write path)."""
        if self._len is None:
            live = self._live.finish()  # O(1); a mutation cannot be iterated
            self._live = live.mutate()
            self._len = _count_keys(self._base, (*self._levels, live))
        return self._len

    def get(self, key: str) -> bytes | None:
        value = self._live.get(key, _ABSENT)
        if value is not _ABSENT:
            return value  # type: ignore[return-value]  # bytes | None
        return _lookup(key, self._levels, self._base) if self._levels else self._base.get(key)

    def set(self, key: str, value: bytes) -> None:
        self._adopt()
        if self._graveyard:
            self._reap()
        self._len = None
        self._live[key] = value

    def delete(self, key: str) -> bool:
        """Remove `key`; whether it had a value."""
        if self.get(key) is None:
            return False
        self._adopt()
        if self._graveyard:
            self._reap()
        self._len = None
        self._live[key] = None
        return True

    def write_all(self, writes: Iterable[tuple[str, bytes | None]]) -> None:
        """Apply (key, value or None to delete) in order."""
        self._adopt()
        if self._graveyard:
            self._reap()
        self._len = None
        live = self._live
        for key, value in writes:
            live[key] = value

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Every key with a value that starts with `prefix`, ascending. O(log n + matches)
        in the base, O(overlay size) in the overlays."""
        candidates = set(itertools.takewhile(
            operator.methodcaller("startswith", prefix), self._base.keys_from(prefix)
        ))
        live = self._live.finish()  # O(1); a mutation cannot be iterated
        self._live = live.mutate()
        for layer in (*self._levels, live):
            candidates.update(k for k in layer if k.startswith(prefix))
        return sorted(k for k in candidates if self.get(k) is not None)

    def snapshot(self) -> LayeredSnapshot:
        """O(1): the live overlay becomes the newest level; see the module docstring."""
        self._adopt()
        live = self._live.finish()  # O(1): never written again
        if len(live):
            self._levels = (*self._levels, live)
        self._live = immutables.Map().mutate()
        snap = LayeredSnapshot(self._base, self._levels)
        self._snapshot = snap
        return snap

    def layers(self) -> int:
        """Overlays above the base, `live` included (tests, diagnostics)."""
        return len(self._levels) + 1

    def _adopt(self) -> None:
        snap = self._snapshot
        if snap is None or snap.folded is None:
            return
        covered = snap.covers(self._base, self._levels)
        if covered:
            if self._base is not _EMPTY:
                self._graveyard.append(self._base)
            self._graveyard.extend(self._levels[:covered])
            self._base = snap.folded
            self._levels = self._levels[covered:]
            snap.release()
        self._snapshot = None

    def maintain(self, pieces: int | None = None) -> None:
        """Idle-time housekeeping (`phalanx.apps.interface.Housekeeping`): adopt a finished
        fold and free up to `pieces` pieces of replaced layers. Without it, an idle state
        would keep a finished fold beside the layers it replaces (two copies of the values
        it merged) until the next write. Never changes what any key reads. `pieces`
        defaults to `MAINTAIN_PIECES`."""
        self._adopt()
        for _ in range(MAINTAIN_PIECES if pieces is None else pieces):
            if not self._graveyard:
                return
            self._reap()

    def _reap(self) -> None:
        """Take replaced layers apart a piece per write: a shard of a base (at most
        `SHARD_KEYS` entries: ~0.2 ms), or `REAP_STEP` keys of a level. Freeing a base of a
        million keys or a level of a few hundred thousand at once is one C call of 30-40 ms
        (a decref per node, key and value: a cache miss apiece) that would stall apply."""
        old = self._graveyard[-1]
        if sys.getrefcount(old) > 3:  # the graveyard, `old` and the call's argument
            self._graveyard.pop()  # an older snapshot still reads it: it frees it later
            return
        if isinstance(old, SortedBase):
            if old.shards:
                old.shards.pop()
            if not old.shards:
                self._graveyard.pop()
            return
        # A persistent map: delete a slice of keys from a copy, then let the previous
        # version go: only the nodes the copy replaced are freed (a slice's worth).
        doomed = list(itertools.islice(old, REAP_STEP))
        if len(doomed) == len(old):
            del old
            self._graveyard.pop()
            return
        smaller = old.mutate()
        for key in doomed:
            del smaller[key]
        self._graveyard[-1] = smaller.finish()

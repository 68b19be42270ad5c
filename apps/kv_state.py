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

`SortedBase` is a list of packed shards of about `SHARD_KEYS` keys each, cut where the keys
say (see `phalanx.apps.kv_base` for the layout, the cut rule and the memory figures). Why
this shape:
- No operation on the base ever covers more than one shard in one C call. A single dict of
  a million keys cannot be built, grown, copied or dropped without a C call of 15-40 ms
  with the GIL held (a resize rehashes every entry, reading each key object: a cache miss
  apiece), and that call stalls the applying thread when it runs on the checkpoint writer.
- The base is already in key order, so a checkpoint does not sort it: it walks the shards
  and merges in only the overlay keys (sorted in steps). A shard no overlay key falls in is
  passed on as it is; the others pass through C-level calls (slices, `map`, joins), with no
  per-key Python code.
- No GC pass walks the base: a shard's key sample is untracked once the collector has seen
  it, and its keys and values are one `str` and one `bytes`. A HAMT node per few keys (an
  all-`immutables.Map` state) costs ~250 bytes per key at a million keys and ~300k tracked
  objects.

Snapshots and folding:
- `snapshot()` is O(1): the current `live` mutation is finished into a map that becomes the
  newest level (it is never written again) and a fresh `live` starts; the snapshot holds
  `base` and the levels.
- Serialising the snapshot (`shards`, on the checkpoint writer's thread) also builds the
  *folded* base, base plus its levels, as a by-product: the very shards it serialised,
  untouched ones shared with the old base. Once it is complete, the next write or snapshot
  on the live state adopts it:
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

from phalanx.apps.kv_base import SHARD_KEYS, PackedShard, ShardPacker, SortedBase
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


def _rewritten(
    shard: PackedShard, changes: list[str], value_of: Callable[[str], bytes | None]
) -> PackedShard | None:
    """`shard` with the overlay's `changes` (ascending keys) applied, if every one of them
    sets a key it already holds (else None: a key added or deleted moves the cut)."""
    at: list[tuple[int, bytes]] = []
    if len(changes) * 16 < len(shard):  # a few: look each one up
        for key in changes:
            value = value_of(key)
            i = shard.position(key)
            if value is None or i < 0:
                return None
            at.append((i, value))
    else:  # many: cut the keys apart once (C-level) and bisect them in order
        keys = shard.keys()
        i = 0
        for key in changes:
            value = value_of(key)
            i = bisect.bisect_left(keys, key, i)
            if value is None or i == len(keys) or keys[i] != key:
                return None
            at.append((i, value))
    return shard.with_values(at)


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
        """base + levels as one `SortedBase`, set once `shards` ran to the end (only
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

    def shards(
        self, *, window: int, run: int, step: int, shard: int = SHARD_KEYS
    ) -> Iterator[PackedShard | None]:
        """The shards the cut rule with mean `shard` makes of base + levels (see
        `phalanx.apps.kv_base`), in key order, with `None` between bounded pieces of work.

        A base shard that no overlay key falls in (at or below its last key), met with
        nothing pending, comes out as it is, with no work per key, if it follows the same
        rule (`PackedShard.follows`: known, or checked once); any other is cut into windows
        of at most `window` keys, merged with the overlay keys among them and re-cut. `run`
        and `step` bound the sorting of the overlay keys (see `sorted_in_steps`). When the
        whole walk ran and there were levels, `folded` is the result."""
        if min(window, run, step, shard) < 1:
            raise ValueError("window, run, step and shard must be >= 1")
        base, levels = self._base, self._levels
        # The overlay keys, each once, sorted in steps. No dict of them all is built: growing
        # a dict of a few hundred thousand keys means resizes of several ms each.
        sorted_overlay = sorted_in_steps(_distinct_keys(levels), run=run, step=step)
        overlay_value: Callable[[str], bytes | None] = (
            levels[0].__getitem__ if len(levels) == 1 else functools.partial(_in_levels, levels)
        )
        packer = ShardPacker(shard)
        shards = base.shards
        n_shards = len(shards)
        made = 0  # packer.shards handed out so far
        si = wi = 0  # the next base window: shard si, from key wi
        # A two-way merge in windows. Each side keeps a buffer of its next keys, in order;
        # a side that is not exhausted has no unseen key below its buffer's last key, so
        # every key up to `high` (the lower of the two last keys) is buffered on both sides.
        # The side that set `high` empties its buffer, so every round makes progress.
        b_keys: list[str] = []
        b_values: list[bytes] = []
        o_keys: list[str] = []
        b_done = not n_shards
        o_done = not levels
        while True:
            if not b_keys and not b_done:
                if wi == 0 and not packer.pending:
                    # A shard start with nothing pending: the shard is reusable if the next
                    # overlay key (if any) sorts after its last key, which the cut rule made
                    # its end (unless it is the base's last shard: keys after that one may
                    # join it). An overlay key below its first key would start it.
                    while not o_keys and not o_done:
                        pulled = next(sorted_overlay, _ABSENT)
                        if pulled is _ABSENT:
                            o_done = True
                        else:
                            if pulled is not None:
                                o_keys = pulled  # type: ignore[assignment]  # list[str]
                            yield None
                    current = shards[si]
                    last = si + 1 == n_shards
                    last_key = current.key_at(len(current) - 1)
                    if (not o_keys or (not last and o_keys[0] > last_key)) and current.follows(
                            shard, last=last):
                        packer.reuse(current)
                        si += 1
                        b_done = si == n_shards
                        yield from packer.shards[made:]
                        made = len(packer.shards)
                        continue
                    # Touched. If every overlay key in it rewrites one of its keys, its keys,
                    # and so its cut, stay: splice the new values in (no key cut apart).
                    # (Buffer the overlay keys up to its last key, a shard's worth at most.)
                    while (o_keys and not o_done and o_keys[-1] <= last_key
                           and len(o_keys) <= len(current)):
                        pulled = next(sorted_overlay, _ABSENT)
                        if pulled is _ABSENT:
                            o_done = True
                        elif pulled is not None:
                            o_keys += pulled  # type: ignore[arg-type]  # list[str]
                        yield None
                    upto = bisect.bisect_right(o_keys, last_key)
                    # All of them buffered, and none after the base's last shard, which
                    # later keys might join.
                    if o_keys and (upto < len(o_keys) or o_done) and (
                            not last or upto == len(o_keys)) and current.follows(
                            shard, last=last):
                        updated = _rewritten(current, o_keys[:upto], overlay_value)
                        if updated is not None:
                            del o_keys[:upto]
                            packer.reuse(updated)
                            si += 1
                            b_done = si == n_shards
                            yield None
                            yield from packer.shards[made:]
                            made = len(packer.shards)
                            continue
                current = shards[si]
                hi = min(wi + window, len(current))
                b_keys, b_values = current.keys(wi, hi), current.values(wi, hi)
                if hi == len(current):
                    si, wi = si + 1, 0
                    b_done = si == n_shards
                else:
                    wi = hi
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
            if packer.add(kept_keys, kept_values):
                yield None  # the merge above was this step; handing out shards is cheap
                yield from packer.shards[made:]
                made = len(packer.shards)
            yield None
        packer.flush()
        yield from packer.shards[made:]
        made_shards = packer.shards
        self._count = sum(map(len, made_shards))
        if self._levels:
            # The fold's index of first keys, a few hundred shards per step (a base of a
            # million keys has ~1000 shards: all at once would be one step of ~2 ms).
            firsts: list[str] = []
            for lo in range(0, len(made_shards), 256):
                yield None
                firsts += [piece.key_at(0) for piece in made_shards[lo:lo + 256]]
        # Drop this frame's references to the layers BEFORE publishing the fold: the applying
        # thread may adopt it at once, and must then hold the last references to the old
        # base and levels, to take them apart in steps. Otherwise this frame's teardown would
        # free them here, in one long call, with the GIL held.
        del base, levels, shards, sorted_overlay, overlay_value
        if self._levels:
            self.folded = SortedBase.ordered(made_shards, firsts)


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

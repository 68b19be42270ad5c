"""The KV store's state: a plain `dict` base under persistent overlays, snapshotted in O(1).

Owns: `LayeredState` (the live state of `phalanx.apps.kv.KvStateMachine`) and
`LayeredSnapshot` (an immutable view of it, serialised in bounded steps).

Layout, newest first:
    live     an `immutables.Map` taking every write (``None`` marks a deleted key)
    levels   older overlays, frozen when a snapshot was taken (oldest first)
    base     a `dict` that is never mutated after it is installed
A read looks in `live`, then the levels from newest to oldest, then `base`.

Why not one persistent map for everything: a HAMT node per few keys costs memory (~250
bytes per key at a million keys, against ~45 for a dict slot), a million-key HAMT takes ~1 s
to build from a checkpoint (a dict: ~0.15 s) and gives the cyclic collector ~300k objects to
walk (a dict: one). Only recent writes need path copying, so only they live in maps.

Snapshots and folding:
- `snapshot()` is O(1): the current `live` map becomes the newest level (it is never written
  again) and a fresh `live` starts; the snapshot holds `base` and the levels.
- Serialising the snapshot (on the checkpoint writer's thread, in bounded steps) also builds
  the *folded* dict, base plus its levels, as a by-product. Once it is complete, the next
  write or snapshot on the live state adopts it: `base` becomes the folded dict and the levels
  it covers are dropped. So the overlays stay about one checkpoint interval deep.
- Adoption changes where values are stored, never what any key reads: the folded dict
  holds exactly base-plus-levels at the snapshot, and newer writes sit in newer layers. So
  results never depend on whether or when a fold was adopted (determinism for the
  simulator, which writes checkpoints inline and so always adopts at the same point).

Invariants: `base` and every level are immutable once installed (a snapshot may be reading
them on another thread); `len(state)` is the number of keys with a value; keys are `str`,
values `bytes` (checked by the KV app before they get here).
Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator

import immutables

from phalanx.apps.sorted_steps import sorted_in_steps

__all__ = ["LayeredSnapshot", "LayeredState"]

Overlay = immutables.Map[str, bytes | None]
_ABSENT = object()  # "this layer says nothing about the key" (None means: deleted)
REAP_STEP = 512
"""Entries of a replaced base dropped per write (see `LayeredState._reap`)."""


def _lookup(key: str, layers: tuple[Overlay, ...], base: dict[str, bytes]) -> bytes | None:
    """`key` through `layers` (newest LAST) then `base`."""
    for layer in reversed(layers):
        value = layer.get(key, _ABSENT)
        if value is not _ABSENT:
            return value  # type: ignore[return-value]  # bytes | None
    return base.get(key)


class LayeredSnapshot:
    """base + levels at one instant. Read-only; safe to serialise on another thread."""

    __slots__ = ("_base", "_levels", "folded", "length")

    def __init__(self, base: dict[str, bytes], levels: tuple[Overlay, ...], length: int) -> None:
        self._base = base
        self._levels = levels
        self.length = length
        self.folded: dict[str, bytes] | None = None
        """base + levels as one dict, set once `items_in_steps` ran to the end (only when
        there were levels to fold)."""

    def release(self) -> None:
        """Read from the folded dict from now on (the same contents), dropping the base and
        levels it was folded from, so the live state can take the old base apart."""
        if self.folded is not None:
            self._base, self._levels = self.folded, ()

    def covers(self, base: dict[str, bytes], levels: tuple[Overlay, ...]) -> int:
        """How many of `levels` (oldest first) this snapshot's fold replaces, or 0 if it was
        taken over another base or other levels."""
        n = len(self._levels)
        if base is not self._base or n == 0 or len(levels) < n:
            return 0
        # Identity, not equality: the very same (immutable) layers, compared in O(levels).
        if any(mine is not theirs for mine, theirs in zip(self._levels, levels, strict=False)):
            return 0
        return n

    def items_in_steps(self, *, run: int, step: int) -> Iterator[list[tuple[str, bytes]] | None]:
        """Every (key, value) in ascending key order, as lists of at most `step` pairs, with
        `None` between bounded pieces of work (see `sorted_in_steps`). Building the folded
        dict rides along."""
        base, levels = self._base, self._levels
        shadowed: set[str] = set()
        for level in levels:
            level_keys = iter(level.keys())
            while chunk := list(itertools.islice(level_keys, step)):
                shadowed.update(chunk)
                yield None
        keys_in_order: Iterable[str] = (
            itertools.chain((k for k in base if k not in shadowed), shadowed)
            if levels
            else base
        )
        folded: dict[str, bytes] | None = {} if levels else None
        for ordered in sorted_in_steps(keys_in_order, run=run, step=step):
            if ordered is None:
                yield None
                continue
            pairs: list[tuple[str, bytes]] = []
            for key in ordered:
                value = _lookup(key, levels, base) if levels else base[key]
                if value is not None:
                    pairs.append((key, value))
            if folded is not None:
                folded.update(pairs)
            yield pairs
        self.folded = folded


class LayeredState:
    """The live KV state (see the module docstring)."""

    __slots__ = ("_base", "_graveyard", "_len", "_levels", "_live", "_snapshot")

    def __init__(self, base: dict[str, bytes] | None = None) -> None:
        self._graveyard: list[dict[str, bytes]] = []  # replaced bases, taken apart in steps
        self._base: dict[str, bytes] = base if base is not None else {}
        self._levels: tuple[Overlay, ...] = ()
        self._live: Overlay = immutables.Map()
        self._len = len(self._base)
        self._snapshot: LayeredSnapshot | None = None  # the newest, until its fold is adopted

    def __len__(self) -> int:
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
        if self.get(key) is None:
            self._len += 1
        self._live = self._live.set(key, value)

    def delete(self, key: str) -> bool:
        """Remove `key`; whether it had a value."""
        if self.get(key) is None:
            return False
        self._adopt()
        if self._graveyard:
            self._reap()
        self._len -= 1
        self._live = self._live.set(key, None)
        return True

    def write_all(self, writes: Iterable[tuple[str, bytes | None]]) -> None:
        """Apply (key, value or None to delete) in order, through one map mutation."""
        self._adopt()
        if self._graveyard:
            self._reap()
        live = self._live.mutate()
        for key, value in writes:
            before = live.get(key, _ABSENT)
            had = (_lookup(key, self._levels, self._base) if before is _ABSENT
                   else before) is not None
            self._len += (value is not None) - had
            live[key] = value
        self._live = live.finish()

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Every key with a value that starts with `prefix`, ascending. O(number of keys)."""
        candidates = {k for k in self._base if k.startswith(prefix)}
        for layer in (*self._levels, self._live):
            candidates.update(k for k in layer if k.startswith(prefix))
        return sorted(k for k in candidates if self.get(k) is not None)

    def snapshot(self) -> LayeredSnapshot:
        """O(1): the live overlay becomes the newest level; see the module docstring."""
        self._adopt()
        if len(self._live):
            self._levels = (*self._levels, self._live)
            self._live = immutables.Map()
        snap = LayeredSnapshot(self._base, self._levels, self._len)
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
            self._graveyard.append(self._base)
            self._base = snap.folded
            self._levels = self._levels[covered:]
            snap.release()
        self._snapshot = None

    def _reap(self) -> None:
        """Take a replaced base apart, `REAP_STEP` entries per write. Dropping a dict of a
        million entries at once holds the GIL for ~40 ms (a decref per key and value, each a
        cache miss) and would stall apply; a few hundred per write cost microseconds."""
        old = self._graveyard[-1]
        if sys.getrefcount(old) > 3:  # the graveyard, `old` and the call's argument
            self._graveyard.pop()  # an older snapshot still reads it: it frees it later
            return
        for _ in range(REAP_STEP):
            if not old:
                self._graveyard.pop()
                return
            old.popitem()

"""Incremental persistence of `LeaderlessDurableState`: the delta between two records, and
its replay (the leaderless twin of `phalanx.consensus.pbft.durable`).

Owns: `LeaderlessDeltaRules`, the pure `diff(old, new)` / `apply(state, delta)` pair over
`messages.LeaderlessStateDelta` that the node's core-state journal
(`phalanx.runtime.persistence.StateJournal`) uses to append only what changed.

Shape of a record, as `LeaderlessCore.durable_state` builds it: each tuple field (own
endorsements, refusals, votes, tombstones, commit proofs, known transactions, vote relays,
release indexes, veto decisions) is the previous record's tuple minus some items plus new
items appended at the end, in the core's insertion order, and the core reuses the same
objects from one record to the next (a category that did not change is the very same
tuple). So `diff` finds a change by identity: an unchanged category costs one `is`; a
grown one one C-level slice comparison; each removed item a galloping search (a few
C-level slice comparisons). The delta holds, per category, the positions removed from the
old tuple and the items appended. Cost and size are proportional to the change, not to
the record.

Crash cases (with the core's rules in `core.py`, `release.py`; the driver writes a Ready's
WAL entries and its `core_state`, then reports `Persisted`):
- A released proof stays in the record until GC (the record always holds every committed
  transaction of the horizon: proof or tombstone). Dropping it once a fsynced `Persisted`
  covered its release is built (`ReleaseGate.mark_synced`) but not used: it lost commits in
  the simulator's restart sweep (docs/LEADERLESS.md "The hot path").
- Crash after the WAL append, before the journal append (the runtime's order): the WAL
  holds entries the record does not know as released (or at all). On restart the core
  reads the WAL suffix (`restored_entries`): those transactions are committed (tombstone,
  released at their WAL index, never released again nor voted drop); the replica re-applies
  them once (its transaction table dedups).
- Crash after the journal append, before the WAL append/fsync (the simulator's order, or
  lost unsynced WAL data): the record still holds the proofs released at indexes past the
  WAL's end (they were not `Persisted`): the restart releases them again at exactly those
  indexes, in order.
- GC of a released proof (the record forgets it) waits until a fsynced `Persisted` covered
  its release (`TickWork._wal_unsynced`; the GC step's Ready asks for the sync): a commit
  that signed nothing appends its WAL entry without `must_sync`, and a node idle until GC
  then lost it in a machine crash (neither WAL nor record held it; until 2026-12-02).
- A transaction committed in the WAL but not in the record has no proof after a restart:
  the checkpoint machine never votes drop on a checkpoint naming it (`unprovable`).

Growth notes (`note_growth`): at the GC horizon a category holds rate x horizon items
(~20,000 at 350 commits/s), and the identity rules above still cost a C-level copy and
comparison of the whole tuple per changed category and save. A producer that knows how
its tuple changed since the last record (its head trimmed by k items, then items
appended) says so (`growing.Growth`); the core notes, per record it builds, the growth of
each category from the record before (`RecordNotes`, when built with ``growth_notes``),
and `diff` uses a chain of such notes from `old` to `new` (found by identity of the
records, never by `id()`) instead of comparing, for each category every note of the chain
covers, after an O(1) plausibility check (`_fits`). The notes are bounded (`MAX_NOTES` per
process), shared under a lock (the journal diffs on the persistence worker thread while
the core steps), and a consumed chain is dropped; a category without a note, or a chain
that is not there, is diffed as before. A note says what the comparison would have
found, so the delta is the same either way (`test_growth_notes.py` checks it on the
core's own records).

Invariants:
- Exact replay: ``apply(old, diff(old, new)) == new`` for ANY two records (the walk matches
  items by value; the identity rules above only make it fast); a property test checks it.
- A delta is a function of the two records only (a noted category's delta is the one the
  comparison finds: the core's items of a category are distinct objects, so its "k oldest
  out, items appended" match is the noted trim and append).
- `apply` raises `ValueError` on a record or delta of the wrong type or with positions out
  of range (disk from elsewhere); the journal turns that into a `StorageError`.

Must not import: storage, the codec, trio, clocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from phalanx.consensus.leaderless.messages import LeaderlessDurableState, LeaderlessStateDelta

CATEGORIES = ("endorsed", "refused", "votes", "decided", "committed", "known", "relays",
              "released_at")
"""The tuple fields of `LeaderlessDurableState` diffed item by item."""

OPTIONAL_CATEGORIES = ("veto_decisions",)
"""Tuple fields diffed item by item like `CATEGORIES`, but None when empty, in the record
and in both parts of the delta: the codec leaves a trailing None off the wire
(``wire_optional``), so a record or delta that does not use them keeps its old bytes, and
one written before they existed still loads (as None)."""

SCALARS = ("gc_horizon_ms", "released", "fence_until_ms")
"""The fields copied whole into every delta (small)."""

WHOLE_IF_CHANGED = ("ordering",)
"""The fields copied whole into a delta only when they changed (None in the delta:
unchanged): the ordered resolution's record (`stuck_resolution = "pbft"`). A record never goes
back from a value to None (the mode is fixed per node), so "unchanged" is exact."""


MAX_NOTES = 64
"""Growth notes kept per process (`note_growth`): a journal consumes the chain up to each
record it saves, so a few are enough; the bound holds memory where nothing consumes them
(a core without a journal)."""


class _Note:
    """`new` is `old` with, per category in `grown`, its head trimmed and items appended.
    Compared by identity (a record's value equality costs O(record))."""

    __slots__ = ("grown", "new", "old")

    def __init__(self, old: LeaderlessDurableState, new: LeaderlessDurableState,
                 grown: dict[str, tuple[int, tuple[Any, ...]]]) -> None:
        self.old = old
        self.new = new
        self.grown = grown


_notes: deque[_Note] = deque(maxlen=MAX_NOTES)
_lock: AbstractContextManager[object] = nullcontext()
"""Every use of `_notes` holds this. A real node's core notes on its task while its journal
diffs on the persistence worker thread, so the runtime installs a real lock
(`guard_notes(threading.Lock())`, `phalanx.protocols.leaderless_node`); this package
imports no threading (sans-IO), and a single-threaded user needs none."""


def guard_notes(lock: AbstractContextManager[object]) -> None:
    """Install the lock that guards the growth notes (once per process: a later call keeps
    the first lock, so a thread holding it is never raced by a replacement)."""
    global _lock
    if isinstance(_lock, nullcontext):
        _lock = lock


def note_growth(old: LeaderlessDurableState, new: LeaderlessDurableState,
                grown: dict[str, tuple[int, tuple[Any, ...]]]) -> None:
    """Record that each category of `grown` went from `old`'s tuple to `new`'s by
    trimming its head and appending (the module docstring: a wrong note is a wrong delta;
    only the core's producers, which did exactly that, call this)."""
    if old is not new:
        with _lock:
            _notes.append(_Note(old, new, grown))


NOTED = ("endorsed", "refused", "known", "committed", "released_at", "decided")
"""The categories `RecordNotes.note` takes growths of, in its order."""


class Producer(Protocol):
    """A part of the core that builds categories of the record: `record_growth` is how each
    changed since its last `mark_record` (`growing.Growth.of`, None: unknown)."""

    def record_growth(self) -> tuple[tuple[int, tuple[Any, ...]] | None, ...]: ...

    def mark_record(self) -> None: ...


class RecordNotes:
    """The core's side of the notes: the last record it built, and `note`."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: LeaderlessDurableState | None = None

    def note(self, record: LeaderlessDurableState, producers: Sequence[Producer]) -> None:
        """`record` was just built from `producers` (the safety kernel: endorsed, refused,
        known; the release gate: committed, released_at; the store: decided, in `NOTED`
        order): note each category's growth since the last record, then mark them."""
        growths = [growth for producer in producers for growth in producer.record_growth()]
        if self._last is not None:
            note_growth(self._last, record, {name: growth for name, growth in zip(
                NOTED, growths, strict=True) if growth is not None})
        for producer in producers:
            producer.mark_record()
        self._last = record


def _chain(old: LeaderlessDurableState, new: LeaderlessDurableState) -> list[_Note] | None:
    """The notes leading from `old` to `new`, oldest first (None: not all noted)."""
    chain: list[_Note] = []
    at = new
    while at is not old:
        step = next((n for n in reversed(_notes) if n.new is at), None)
        if step is None or len(chain) >= MAX_NOTES:
            return None
        chain.append(step)
        at = step.old
    chain.reverse()
    return chain


def _consume(chain: list[_Note]) -> None:
    """Forget the notes of a chain a journal consumed, and the notes before it in the same
    line of records (a journal rewritten whole skipped them): nothing diffs from them
    again, and each holds a record."""
    done = list(chain)
    at = chain[0].old
    while len(done) <= len(_notes) and (
            before := next((n for n in _notes if n.new is at), None)) is not None:
        done.append(before)
        at = before.old
    kept = [n for n in _notes if not any(n is d for d in done)]
    _notes.clear()
    _notes.extend(kept)


def _fits(before: Sequence[Any], after: Sequence[Any], trimmed: int,
          added: tuple[Any, ...]) -> bool:
    """O(1) checks that ``after == before[trimmed:] + added`` is plausible: the length, and
    the items at both ends of the kept part and of `added` are the very objects there."""
    kept = len(before) - trimmed
    if kept + len(added) != len(after):
        return False
    if kept and (before[trimmed] is not after[0] or before[-1] is not after[kept - 1]):
        return False
    return not added or (added[0] is after[kept] and added[-1] is after[-1])


def _composed(chain: list[_Note], name: str, old_len: int
              ) -> tuple[tuple[int, ...], tuple[Any, ...]] | None:
    """The (removed positions, added items) of category `name` over `chain`, or None when a
    note of it lacks the category."""
    trimmed = 0  # the record's tuple is old[trimmed:] + added after each note
    added: tuple[Any, ...] = ()
    for note in chain:
        grown = note.grown.get(name)
        if grown is None:
            return None
        k, more = grown
        rest = old_len - trimmed  # what is left of old's items
        if k <= rest:
            trimmed += k
        else:
            trimmed = old_len
            added = added[k - rest:]
        added += more
    return tuple(range(trimmed)), added


HEAD_TRIM = 8
"""`diff_items` first tries "the k oldest items removed, the rest kept, items appended" for
k up to this (one C-level comparison: the core appends and GC removes the oldest)."""


def _common_prefix(old: Sequence[Any], i: int, new: Sequence[Any], j: int) -> int:
    """How many items `old[i:]` and `new[j:]` share at their start (C-level comparisons
    that short-cut on identity; galloping, then bisection)."""
    limit = min(len(old) - i, len(new) - j)
    if limit == 0 or old[i] != new[j]:
        return 0
    good, step = 1, 1
    while good < limit:  # gallop: old[i:i+good] == new[j:j+good] holds
        probe = min(good + step, limit)
        if old[i:i + probe] != new[j:j + probe]:
            bad = probe
            break
        good, step = probe, step * 2
    else:
        return good
    while bad - good > 1:  # bisect between a matching and a failing length
        mid = (good + bad) // 2
        if old[i + good:i + mid] == new[j + good:j + mid]:
            good = mid
        else:
            bad = mid
    return good


def diff_items(old: Sequence[Any], new: Sequence[Any]) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """(positions of `old` to remove, items to append) turning `old` into `new`: the usual
    change (a few oldest removed, items appended: `HEAD_TRIM`) in one comparison, else a
    greedy walk that keeps each item of `old` equal to the next unmatched item of `new`.
    Exact for any two sequences."""
    if old is new:
        return (), ()
    n = len(old)
    for k in range(min(HEAD_TRIM + 1, n)):  # the usual change: k oldest out, items appended
        if len(new) >= n - k and old[k] is new[0] and old[k:] == new[:n - k]:
            return tuple(range(k)), tuple(new[n - k:])
    removed: list[int] = []
    i = j = 0
    while i < len(old):
        shared = _common_prefix(old, i, new, j)
        i += shared
        j += shared
        if i < len(old):
            removed.append(i)
            i += 1
    return tuple(removed), tuple(new[j:])


def apply_items(old: Sequence[Any], removed: tuple[int, ...], added: tuple[Any, ...]
                ) -> tuple[Any, ...]:
    if not removed:
        return tuple(old) + added if added else tuple(old)
    if (not all(isinstance(p, int) for p in removed) or list(removed) != sorted(set(removed))
            or removed[0] < 0 or removed[-1] >= len(old)):
        raise ValueError("LeaderlessStateDelta removes positions the record does not have")
    gone = set(removed)
    return tuple(x for k, x in enumerate(old) if k not in gone) + added


class LeaderlessDeltaRules:
    """`diff`/`apply` for `LeaderlessDurableState` (see the module docstring)."""

    __slots__ = ("noted",)

    def __init__(self) -> None:
        self.noted = 0
        """Categories diffed from growth notes rather than compared (a statistic)."""

    def diff(self, old: object, new: object) -> LeaderlessStateDelta | None:
        """The delta turning `old` into `new`; None when they are equal."""
        if not isinstance(old, LeaderlessDurableState) or not isinstance(
                new, LeaderlessDurableState):
            raise ValueError("LeaderlessDeltaRules only diffs LeaderlessDurableState records")
        if old is new:
            return None
        with _lock:
            chain = _chain(old, new) if _notes else None
            if chain is not None:
                _consume(chain)
        fields: dict[str, Any] = {}
        changed = False
        for name in CATEGORIES:
            before, after = getattr(old, name), getattr(new, name)
            noted = (_composed(chain, name, len(before)) if chain is not None and before
                     is not after else None)
            if noted is not None and not _fits(before, after, len(noted[0]), noted[1]):
                noted = None  # a wrong note (a bug): the comparison decides
            if noted is not None:
                self.noted += 1
                removed, added = noted
            else:
                removed, added = diff_items(before, after)
            fields[f"{name}_removed"] = removed
            fields[f"{name}_added"] = added
            changed = changed or bool(removed or added)
        for name in OPTIONAL_CATEGORIES:
            removed, added = diff_items(getattr(old, name) or (), getattr(new, name) or ())
            fields[f"{name}_removed"] = removed or None
            fields[f"{name}_added"] = added or None
            changed = changed or bool(removed or added)
        for name in SCALARS:
            value = getattr(new, name)
            fields[name] = value
            changed = changed or value != getattr(old, name)
        for name in WHOLE_IF_CHANGED:
            value = getattr(new, name)
            if value is not getattr(old, name) and value != getattr(old, name):
                fields[name] = value
                changed = True
        return LeaderlessStateDelta(**fields) if changed else None

    def apply(self, state: object, delta: object) -> LeaderlessDurableState:
        """`state` with `delta` replayed onto it."""
        if not isinstance(state, LeaderlessDurableState) or not isinstance(
                delta, LeaderlessStateDelta):
            raise ValueError(
                f"cannot replay a {type(delta).__name__} onto a {type(state).__name__}")
        fields: dict[str, Any] = {
            name: apply_items(getattr(state, name), getattr(delta, f"{name}_removed"),
                              getattr(delta, f"{name}_added"))
            for name in CATEGORIES}
        for name in OPTIONAL_CATEGORIES:
            fields[name] = apply_items(
                getattr(state, name) or (), getattr(delta, f"{name}_removed") or (),
                getattr(delta, f"{name}_added") or ()) or None
        for name in SCALARS:
            fields[name] = getattr(delta, name)
        for name in WHOLE_IF_CHANGED:
            value = getattr(delta, name)
            fields[name] = value if value is not None else getattr(state, name)
        return LeaderlessDurableState(**fields)


__all__ = ["LeaderlessDeltaRules", "LeaderlessStateDelta"]

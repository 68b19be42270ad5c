"""Tuples of the durable record that grow at the end and shrink at the head, kept up to date
in one copy per read (docs/LEADERLESS.md "Round 7").

Owns: `Growth` (how such a tuple changed since a mark: its head trimmed by some items, then
items appended, or "some other way") and `GrowingTuple` (a table's values as a tuple whose
appends and head removals are held until `value()` applies them all in one copy, with the
`Growth` since the last `mark`).

Why: the durable record holds, per category, every item of the GC horizon (own
endorsements, known transactions, tombstones, commit proofs: rate x horizon, ~20,000 at
350 commits/s). Rebuilding or copying such a tuple per signature, per release or per
collected item cost O(horizon) each time; held changes cost one copy per read (the core
reads the record once per Ready), and the `Growth` lets the journal skip comparing the
whole tuple (`durable.note_growth`).

Invariant: `value()` equals the items appended minus those removed from the head, in order,
and is the very same tuple object until something changes (the journal diffs by identity).
`Growth.of(now)` is exact only while every change went through `append` / `pop_head`
since `mark` (`reset` makes it inexact). Pure and deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Growth:
    """How a tuple changed since `mark`: its first `trimmed` items removed, then `added`
    items appended; `exact` False once it changed in any other way."""

    __slots__ = ("added", "exact", "trimmed")

    def __init__(self) -> None:
        self.trimmed = 0
        self.added = 0
        self.exact = False

    def mark(self) -> None:
        """The tuple as it is now is the base of the next `of`."""
        self.trimmed = self.added = 0
        self.exact = True

    def appended(self, count: int) -> None:
        self.added += count

    def trimmed_head(self, length: int) -> None:
        """The head item of the tuple, which held `length` items, was removed (the base's
        rest goes first, then what was appended)."""
        if length - self.added > 0:
            self.trimmed += 1
        else:
            self.added -= 1

    def lost(self) -> None:
        self.exact = False

    def of(self, now: tuple[Any, ...]) -> tuple[int, tuple[Any, ...]] | None:
        """(how many items of the base's head went, the items appended) turning the base
        into `now`; None when not exact."""
        if not self.exact or self.added > len(now):
            return None
        return self.trimmed, now[len(now) - self.added:] if self.added else ()


class GrowingTuple(Generic[T]):
    """A tuple changed by `append`/`extend` at the end and `pop_head` at the head, or
    replaced whole (`reset`); `value()` applies the held changes in one copy."""

    __slots__ = ("_base", "_tail", "_trim", "growth")

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._base: tuple[T, ...] = tuple(items)
        self._trim = 0
        self._tail: list[T] = []
        self.growth = Growth()

    def __len__(self) -> int:
        return len(self._base) - self._trim + len(self._tail)

    def append(self, item: T) -> None:
        self._tail.append(item)
        self.growth.appended(1)

    def extend(self, items: Iterable[T]) -> None:
        before = len(self._tail)
        self._tail.extend(items)
        self.growth.appended(len(self._tail) - before)

    def head(self) -> T:
        """The first item (the tuple must not be empty)."""
        return self._base[self._trim] if self._trim < len(self._base) else self._tail[0]

    def pop_head(self) -> None:
        """Remove the first item (the tuple must not be empty)."""
        self.growth.trimmed_head(len(self))
        if self._trim < len(self._base):
            self._trim += 1
        else:
            self._tail.pop(0)

    def reset(self, items: Iterable[T]) -> None:
        """Replace every item (the growth since the mark is lost)."""
        self._base = tuple(items)
        self._trim = 0
        self._tail.clear()
        self.growth.lost()

    def value(self) -> tuple[T, ...]:
        """The items as one tuple: the same object until a change."""
        if self._trim or self._tail:
            base = self._base[self._trim:] if self._trim else self._base
            self._base = base + tuple(self._tail) if self._tail else base
            self._trim = 0
            self._tail.clear()
        return self._base

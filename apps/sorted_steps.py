"""Sorting a large key set in bounded steps, so a checkpoint never holds the GIL for long.

Owns: `sorted_in_steps`, a generator that sorts an iterable of distinct keys run by run and
merges the runs, yielding control (`None`) between bounded pieces of work. A single
`sorted()` of a million strings holds the GIL for about a second; this does the same work in
steps well under a millisecond.

Must not import: anything outside the standard library. Pure and deterministic: the output
order is the total order of the keys, independent of the input order.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterable, Iterator
from typing import TypeVar

K = TypeVar("K", str, bytes)
"""A key type: client ids and keys (str), transaction ids (bytes)."""


def sorted_in_steps(keys: Iterable[K], *, run: int, step: int) -> Iterator[list[K] | None]:
    """Yield the (distinct) keys in ascending order, as lists of at most `step` keys.

    While it is still sorting runs of `run` keys it yields `None` after each run (a step
    boundary with no output yet). One `next()` does O(run log run) or O(step log runs) work.
    Raises `ValueError` if a key repeats within a run (our own misuse: callers pass the keys
    of a mapping).
    """
    if run < 1 or step < 1:
        raise ValueError(f"run and step must be >= 1, got {run} and {step}")
    source = iter(keys)
    # Each sorted run is kept as the keys of a dict (values None), inserted in DESCENDING
    # order: `popitem()` takes the last-inserted key, so popping yields the run ascending.
    # - A dict of strs is never tracked by the cyclic GC, whereas a tuple is tracked until a
    #   collection first sees it and a list stays tracked: a young-generation pass walked
    #   every key of the runs built since the last pass (~10 ms with the GIL held).
    # - Popping hands each key over as it is merged, so the runs' references are dropped a
    #   step at a time. Iterating the runs instead would free every run in the last few
    #   steps, when they all run out together: a decref per key, ~8 ms for 300k keys.
    runs: list[dict[K, None]] = []
    while True:
        piece = list(itertools.islice(source, run))
        if not piece:
            break
        piece.sort(reverse=True)
        sorted_run = dict.fromkeys(piece)
        if len(sorted_run) != len(piece):
            raise ValueError("sorted_in_steps: keys must be distinct")
        runs.append(sorted_run)
        yield None
    del piece
    if not runs:
        return
    first = operator.itemgetter(0)
    iterators = [
        map(first, itertools.islice(iter(r.popitem, None), len(r))) for r in runs
    ]
    runs.clear()
    merged: Iterator[K] = iterators[0] if len(iterators) == 1 else heapq.merge(*iterators)
    iterators.clear()
    while True:
        out = list(itertools.islice(merged, step))
        if not out:
            return
        yield out

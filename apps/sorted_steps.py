"""Sorting a large key set in bounded steps, so a checkpoint never holds the GIL for long.

Owns: `sorted_in_steps`, a generator that sorts an iterable of keys run by run and merges the
runs, yielding control (`None`) between bounded pieces of work. A single `sorted()` of a
million strings holds the GIL for about a second; this does the same work in steps well under
a millisecond.

Must not import: anything outside the standard library. Pure and deterministic: the output
order is the total order of the keys, independent of the input order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator


def sorted_in_steps(keys: Iterable[str], *, run: int, step: int) -> Iterator[list[str] | None]:
    """Yield the keys in ascending order, as lists of at most `step` keys.

    While it is still sorting runs of `run` keys it yields `None` after each run (a step
    boundary with no output yet). One `next()` does O(run log run) or O(step log runs) work.
    """
    if run < 1 or step < 1:
        raise ValueError(f"run and step must be >= 1, got {run} and {step}")
    source = iter(keys)
    # Runs are kept as tuples: the cyclic GC untracks a tuple of untracked objects (str) the
    # first time it sees one, whereas a list stays tracked, and every later young-generation
    # pass would walk all of its elements (a million keys: tens of ms with the GIL held).
    runs: list[tuple[str, ...]] = []
    while True:
        piece = list(itertools.islice(source, run))
        if not piece:
            break
        piece.sort()
        runs.append(tuple(piece))
        yield None
    merged: Iterator[str] = iter(runs[0]) if len(runs) == 1 else heapq.merge(*runs)
    while True:
        out = list(itertools.islice(merged, step))
        if not out:
            return
        yield out


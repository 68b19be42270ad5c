"""The set checker: after healing, every acknowledged add is present, exactly once.

Owns the set workload's history format and `check_set` (Jepsen's set checker, split by key).

History format (elements are integers, unique per key; each key is an independent set):
    * ``add``: key ``"<set key>"``, value the element; ``ok`` echoes it.
    * ``read``: key ``"<set key>"``, invoke value null; ``ok`` value the list of elements the
      set holds, in its stored order, duplicates kept (so a double apply shows).

Per key, against its *final read* (the last ``ok`` read of the key in the file; the workload
issues one after the faults heal):
    * ``lost``: adds acknowledged (``ok``) before the final read was invoked, absent from it;
    * ``unexpected``: elements present although no add of them may have happened (never
      invoked on this key, or ``fail``, which promises no effect);
    * ``duplicated``: elements present more than once;
    * ``recovered``: indeterminate (``info`` or pending) adds that are present (fine);
    * adds still running when the final read was invoked may be present or not (fine).
    A key with adds but no ``ok`` read is ``"unknown"``. Valid iff no key has lost,
    unexpected or duplicated elements; the verdicts of keys merge (false > unknown > true).

Must not import: the simulator, consensus cores, trio, the client. Pure; deterministic
(results list keys in order of first invocation and elements sorted).
"""

from __future__ import annotations

from typing import Final

from phalanx.jepsen.checker import UNKNOWN, CheckerResult, Verdict, merge_verdicts
from phalanx.jepsen.history import FAIL, OK, History, HistoryError, Key, Op, OpPair

ADD: Final = "add"
READ: Final = "read"
FUNCTIONS: Final = (ADD, READ)
"""Operation kinds the stats checker requires to have succeeded in a set run."""


def _element(op: Op, line: int | None) -> int:
    if not isinstance(op.value, int) or isinstance(op.value, bool):
        raise HistoryError(f"set add value must be an integer element, got {op.value!r}", line=line)
    return op.value


def _elements(op: Op, line: int | None) -> list[int]:
    if not isinstance(op.value, tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in op.value
    ):
        raise HistoryError(
            f"set read value must be a list of integer elements, got {op.value!r}", line=line
        )
    return [v for v in op.value if isinstance(v, int)]


def check_set(history: History) -> CheckerResult:
    """Check a set history (module docstring).

    Raises:
        HistoryError: an add value that is not an integer, or a read value that is not a
            list of integers.
    """
    line_of = {op.index: line for op, line in zip(history.ops, history.lines, strict=True)}
    position = {op.index: pos for pos, op in enumerate(history.ops)}
    by_key: dict[Key, list[OpPair]] = {}
    for pair in history.pairs:
        if pair.invoke.f in (ADD, READ):
            by_key.setdefault(pair.invoke.key, []).append(pair)
    results = []
    totals = {
        "attempt": 0,
        "acknowledged": 0,
        "lost": 0,
        "unexpected": 0,
        "duplicated": 0,
        "recovered": 0,
    }
    verdicts: list[Verdict] = []
    for key, pairs in by_key.items():
        attempted: dict[int, OpPair] = {}
        final: OpPair | None = None
        for pair in pairs:
            if pair.invoke.f == ADD:
                attempted[_element(pair.invoke, line_of[pair.invoke.index])] = pair
            elif pair.outcome == OK:
                final = pair
        acknowledged = sorted(e for e, p in attempted.items() if p.outcome == OK)
        totals["attempt"] += len(attempted)
        totals["acknowledged"] += len(acknowledged)
        entry: dict[str, object] = {
            "key": key,
            "attempt_count": len(attempted),
            "acknowledged_count": len(acknowledged),
        }
        if final is None or final.completion is None:
            if attempted:
                verdicts.append(UNKNOWN)
                entry.update(valid=UNKNOWN, reason="no ok read of the key")
                results.append(entry)
            continue
        read = _elements(final.completion, line_of[final.completion.index])
        read_at = position[final.invoke.index]
        counts: dict[int, int] = {}
        for e in read:
            counts[e] = counts.get(e, 0) + 1
        lost = [
            e
            for e in acknowledged
            if e not in counts and _completed_before(attempted[e], read_at, position)
        ]
        unexpected = sorted(e for e in counts if e not in attempted or attempted[e].outcome == FAIL)
        duplicated = {e: n for e, n in sorted(counts.items()) if n > 1}
        recovered = sorted(e for e in counts if e in attempted and attempted[e].indeterminate)
        valid = not (lost or unexpected or duplicated)
        verdicts.append(valid)
        totals["lost"] += len(lost)
        totals["unexpected"] += len(unexpected)
        totals["duplicated"] += len(duplicated)
        totals["recovered"] += len(recovered)
        if valid and not recovered:
            continue
        entry.update(
            valid=valid,
            read_index=final.completion.index,
            read_count=len(read),
            lost=lost,
            unexpected=unexpected,
            duplicated=[[e, n] for e, n in duplicated.items()],
            recovered=recovered,
        )
        results.append(entry)
    return CheckerResult(
        checker="set",
        valid=merge_verdicts(verdicts),
        details={
            "keys": len(by_key),
            **{f"{name}_count": n for name, n in totals.items()},
            "results": results,
        },
    )


def _completed_before(pair: OpPair, at: int, position: dict[int, int]) -> bool:
    """Did `pair` complete before file position `at`?"""
    return pair.completion is not None and position[pair.completion.index] < at

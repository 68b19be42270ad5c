"""Linearizability checking: Wing & Gong search with Lowe's memoisation, split per key.

Owns:
    `check(history, model)` -> `CheckResult` with an overall verdict (``True``, ``False`` or
    ``"unknown"``), and per key a `KeyResult` carrying a counterexample (for ``False``) or the
    longest linearizable prefix found before the budget ran out (for ``"unknown"``).

Algorithm (Ref: Wing & Gong 1993; Lowe 2017 "Testing for linearizability" §3-4; Porcupine
``checker.go``; Herlihy & Wing 1990 §3.3 locality / Horn & Kroening P-compositionality):
    * The history is split per key; each key is checked on its own (locality).
    * Per key, every operation that may have happened becomes a *call* with an invoke and a
      return entry. Entries are ordered by their position in the history file, which is the
      real-time order (see `history`): op A precedes op B iff A's completion line comes
      before B's invoke line. ``fail`` ops are dropped (they did not happen); operations
      with an unknown outcome (``info`` or never completed) return at +infinity, and those
      the model says constrain nothing (reads with unknown results) are dropped.
    * Just-in-time linearization over a doubly linked entry list: at a call entry, try the
      call on the current model state; if legal and the configuration (bitset of linearized
      calls, state) is new, push it, lift the call and its return out of the list and
      restart from the head. Reaching a return entry means that call can no longer be
      linearized: pop and try the next alternative. Reaching the return of an operation with
      an unknown outcome means every completed operation is linearized: the remaining ones
      are taken not to have happened (or to happen after the end), so the key is linearizable.
    * Iterative (an explicit stack), so history length is not bounded by Python's recursion
      limit.

Budgets:
    Each key gets its own budget: ``time_limit`` seconds measured with the injected `clock`,
    and/or ``step_limit`` search steps. Exhausting either yields ``"unknown"`` for that key,
    never a silent pass. The simulator should pass ``time_limit=None`` and a ``step_limit`` so
    that its verdicts are a pure function of the history (no clocks in the simulator).

Verdicts compose Jepsen-style: false beats unknown beats true.

Must not import: the simulator, consensus cores, trio, or anything doing I/O.
Determinism: no set or dict iteration order leaks into results; ties between pending returns
are broken by call number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeAlias, TypeVar

from phalanx.jepsen.history import (
    FAIL,
    History,
    HistoryError,
    Key,
    Op,
    OpPair,
    Value,
    value_to_json,
)
from phalanx.jepsen.models import Model, RegisterModel

S = TypeVar("S", bound=Hashable)
C = TypeVar("C")

UNKNOWN: Final = "unknown"
#: A verdict: True (linearizable), False (certainly not) or "unknown" (budget exhausted).
Verdict: TypeAlias = bool | Literal["unknown"]

DEFAULT_TIME_LIMIT: Final = 10.0
#: Search steps between two looks at the clock (keeps clock calls off the hot path).
CLOCK_EVERY: Final = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One operation placed in a linearization, with the model state right after it."""

    op: OpPair
    state: Value


@dataclass(frozen=True, slots=True, kw_only=True)
class Counterexample:
    """Where the search got furthest for a key that is not (or not known to be) linearizable.

    Attributes:
        linearized: the longest linearizable prefix found, in linearization order.
        state: the model state after that prefix.
        blocked: an operation that completed but could not be placed before its completion,
            given that prefix (None if the search stopped before any such point).
        candidates: the other operations that could have come next at that point (invoked,
            not yet linearized, `blocked` excluded); no choice among them leads to a full
            linearization.
    """

    linearized: tuple[Step, ...]
    state: Value
    blocked: OpPair | None
    candidates: tuple[OpPair, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "linearized": [
                {"op": pair_to_json(s.op), "state": value_to_json(s.state)} for s in self.linearized
            ],
            "state": value_to_json(self.state),
            "blocked": None if self.blocked is None else pair_to_json(self.blocked),
            "candidates": [pair_to_json(p) for p in self.candidates],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyResult:
    """The verdict for one key.

    Attributes:
        key: the key (None for operations without one).
        valid: True, False or "unknown".
        ops: client operations on the key that may have happened (fail excluded).
        calls: of those, the ones the search had to place (indeterminate reads dropped).
        steps: search steps taken.
        reason: why the verdict is "unknown" (``time limit`` / ``step limit``), else None.
        counterexample: for False and "unknown", where the search got furthest.
    """

    key: Key
    valid: Verdict
    ops: int
    calls: int
    steps: int
    reason: str | None = None
    counterexample: Counterexample | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "key": self.key,
            "valid": self.valid,
            "ops": self.ops,
            "calls": self.calls,
            "steps": self.steps,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample.to_json()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """The verdict for a whole history: false if any key is false, else unknown if any key
    is unknown, else true."""

    valid: Verdict
    workload: str
    keys: tuple[KeyResult, ...]

    @property
    def failing_keys(self) -> tuple[Key, ...]:
        return tuple(r.key for r in self.keys if r.valid is False)

    @property
    def unknown_keys(self) -> tuple[Key, ...]:
        return tuple(r.key for r in self.keys if r.valid == UNKNOWN)

    @property
    def ops(self) -> int:
        return sum(r.ops for r in self.keys)

    def explain(self, *, tail: int = 5) -> list[str]:
        """Human-readable lines for every key that is not valid (for sweep failure output):
        the last `tail` steps of the longest linearizable prefix and the op that got stuck."""
        lines: list[str] = []
        for r in self.keys:
            if r.valid is True:
                continue
            what = "not linearizable" if r.valid is False else f"unknown ({r.reason})"
            lines.append(f"key {r.key!r}: {what}; {r.ops} ops, {r.steps} search steps")
            ce = r.counterexample
            if ce is None:
                continue
            lines.append(f"  longest linearizable prefix: {len(ce.linearized)} ops")
            for s in ce.linearized[-tail:]:
                lines.append(f"    {_describe(s.op)}  => {value_to_json(s.state)!r}")
            if ce.blocked is not None:
                lines.append(f"  cannot place next: {_describe(ce.blocked)}")
            for c in ce.candidates:
                lines.append(f"  also tried: {_describe(c)}")
        return lines

    def to_json(self) -> dict[str, object]:
        """The verdict document printed by ``phalanx jepsen check``: per-key detail only for
        keys that are not valid."""
        return {
            "valid": self.valid,
            "workload": self.workload,
            "ops": self.ops,
            "keys": len(self.keys),
            "failing_keys": list(self.failing_keys),
            "unknown_keys": list(self.unknown_keys),
            "results": [r.to_json() for r in self.keys if r.valid is not True],
        }


def merge_verdicts(verdicts: Iterable[Verdict]) -> Verdict:
    """Compose verdicts: False beats "unknown" beats True (Jepsen `checker/merge-valid`)."""
    out: Verdict = True
    for v in verdicts:
        if v is False:
            return False
        if v == UNKNOWN:
            out = UNKNOWN
    return out


def check(
    history: History | Iterable[Op],
    model: Model[S, C] | None = None,
    *,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    step_limit: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult:
    """Check that `history` is linearizable with respect to `model` (default: register).

    Args:
        history: a validated `History`, or ops to validate (raises `HistoryError`).
        model: the sequential specification; `RegisterModel` if None.
        time_limit: seconds of search per key before giving up with "unknown"; None for none.
        step_limit: search steps per key before giving up with "unknown"; None for none.
        clock: seconds, monotonic; injected so tests (and the simulator) stay deterministic.

    Raises:
        HistoryError: an operation the model cannot interpret (bad value shape, unknown f).

    Determinism:
        With ``time_limit=None`` the result is a pure function of the history and model.
    """
    if not isinstance(history, History):
        history = History.of(history)
    chosen: Model[S, C] = model if model is not None else RegisterModel()  # type: ignore[assignment]
    position = {op.index: pos for pos, op in enumerate(history.ops)}
    lines = {op.index: line for op, line in zip(history.ops, history.lines, strict=True)}
    by_key: dict[Key, list[OpPair]] = {}
    for pair in history.pairs:
        by_key.setdefault(pair.invoke.key, []).append(pair)
    results = [
        check_key(
            key,
            pairs,
            chosen,
            position=position,
            lines=lines,
            time_limit=time_limit,
            step_limit=step_limit,
            clock=clock,
        )
        for key, pairs in by_key.items()  # insertion order: first invocation per key
    ]
    return CheckResult(
        valid=merge_verdicts(r.valid for r in results),
        workload=chosen.name,
        keys=tuple(results),
    )


def check_key(
    key: Key,
    pairs: Sequence[OpPair],
    model: Model[S, C],
    *,
    position: dict[int, int] | None = None,
    lines: dict[int, int] | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    step_limit: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> KeyResult:
    """Check one key's operations (all on `key`, in history order). See `check`.

    `position` maps op index -> position in the history (real-time order); by default the
    op indexes themselves are used, which is equivalent for histories from one file.
    `lines` maps op index -> source line, so model errors can name the line.
    """
    pos = position if position is not None else {}
    live = [p for p in pairs if p.outcome != FAIL]
    calls: list[OpPair] = []
    args: list[C] = []
    for pair in live:
        try:
            arg = model.prepare(pair)
        except HistoryError as exc:
            if lines is None or exc.line is not None:
                raise
            raise HistoryError(str(exc), line=lines.get(pair.invoke.index)) from None
        if arg is not None:
            calls.append(pair)
            args.append(arg)
    n = len(calls)

    def at(op: Op) -> int:
        return pos.get(op.index, op.index)

    inv_pos = [at(p.invoke) for p in calls]
    done_pos = [
        None if p.indeterminate or p.completion is None else at(p.completion) for p in calls
    ]
    # Returns of operations with an unknown outcome go after every real entry, in call order.
    horizon = 1 + max(inv_pos + [d for d in done_pos if d is not None], default=0)
    ret_pos = [horizon + i if d is None else d for i, d in enumerate(done_pos)]
    pending = [d is None for d in done_pos]
    verdict, steps, reason, best = _search(
        n, inv_pos, ret_pos, pending, args, model, time_limit, step_limit, clock
    )
    counterexample = None
    if verdict is not True and best is not None:
        counterexample = Counterexample(
            linearized=tuple(
                Step(op=calls[c], state=model.describe_state(s))
                for c, s in zip(best.prefix, best.states, strict=True)
            ),
            state=model.describe_state(best.state),
            blocked=None if best.blocked is None else calls[best.blocked],
            candidates=tuple(calls[c] for c in best.candidates),
        )
    return KeyResult(
        key=key,
        valid=verdict,
        ops=len(live),
        calls=n,
        steps=steps,
        reason=reason,
        counterexample=counterexample,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Best(Generic[S]):
    """The deepest point of a search: the prefix (call ids), the state after each of its calls,
    the final state, the call that could not be placed and the alternatives at that point."""

    prefix: tuple[int, ...]
    states: tuple[S, ...]
    state: S
    blocked: int | None
    candidates: tuple[int, ...]


def _search(
    n: int,
    inv_pos: list[int],
    ret_pos: list[int],
    pending: list[bool],
    args: list[C],
    model: Model[S, C],
    time_limit: float | None,
    step_limit: int | None,
    clock: Callable[[], float],
) -> tuple[Verdict, int, str | None, _Best[S] | None]:
    """The Wing-Gong-Lowe search over one key's calls. Returns (verdict, steps, reason, best).

    Nodes 0..n-1 are call entries, n..2n-1 the matching return entries, 2n the list head.
    """
    head = 2 * n
    order = sorted([(inv_pos[i], i) for i in range(n)] + [(ret_pos[i], n + i) for i in range(n)])
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    last = head
    for _, node in order:
        nxt[last] = node
        prv[node] = last
        last = node

    step = model.step
    state: S = model.initial()
    lin = 0  # Invariant: bit i set iff call i is on the stack (linearized).
    stack: list[tuple[int, S]] = []  # (call id, state before it)
    cache: set[tuple[int, S]] = set()
    best: _Best[S] | None = None
    best_depth = -1
    deadline = None if time_limit is None else clock() + time_limit
    steps = 0
    entry = nxt[head]
    while entry != -1:
        steps += 1
        if step_limit is not None and steps > step_limit:
            return UNKNOWN, steps - 1, "step limit", _snapshot(best, stack, state, nxt, n)
        if deadline is not None and steps % CLOCK_EVERY == 0 and clock() > deadline:
            return UNKNOWN, steps, "time limit", _snapshot(best, stack, state, nxt, n)
        if entry < n:
            legal, after = step(state, args[entry])
            if legal:
                new_lin = lin | (1 << entry)
                config = (new_lin, after)
                if config not in cache:
                    cache.add(config)
                    stack.append((entry, state))
                    state, lin = after, new_lin
                    # Lift the call and its return out of the list.
                    ret = n + entry
                    nxt[prv[entry]] = nxt[entry]
                    prv[nxt[entry]] = prv[entry]  # a call always has a successor
                    nxt[prv[ret]] = nxt[ret]
                    if nxt[ret] != -1:
                        prv[nxt[ret]] = prv[ret]
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
            continue
        call = entry - n
        if pending[call]:
            return True, steps, None, None
        if len(stack) > best_depth:
            best_depth = len(stack)
            best = _record(stack, state, call, nxt, n)
        if not stack:
            return False, steps, None, best
        top, state = stack.pop()
        lin &= ~(1 << top)
        # Unlift in reverse order: the return first, then the call.
        ret = n + top
        nxt[prv[ret]] = ret
        if nxt[ret] != -1:
            prv[nxt[ret]] = ret
        nxt[prv[top]] = top
        prv[nxt[top]] = top
        entry = nxt[top]
    return True, steps, None, None


def _record(
    stack: list[tuple[int, S]],
    state: S,
    blocked: int | None,
    nxt: list[int],
    n: int,
) -> _Best[S]:
    """Snapshot the current prefix and the calls that could come next (those before the
    first return entry still in the list)."""
    candidates: list[int] = []
    node = nxt[2 * n]
    while node != -1 and node < n:
        if node != blocked:
            candidates.append(node)
        node = nxt[node]
    return _Best(
        prefix=tuple(c for c, _ in stack),
        states=tuple(s for _, s in stack[1:]) + ((state,) if stack else ()),
        state=state,
        blocked=blocked,
        candidates=tuple(candidates),
    )


def _snapshot(
    best: _Best[S] | None, stack: list[tuple[int, S]], state: S, nxt: list[int], n: int
) -> _Best[S]:
    """For an interrupted search: the deeper of the best recorded point and the current one."""
    if best is not None and len(best.prefix) >= len(stack):
        return best
    return _record(stack, state, None, nxt, n)


def _describe(pair: OpPair) -> str:
    inv, done = pair.invoke, pair.completion
    result = "" if done is None or pair.outcome != "ok" else f" -> {value_to_json(done.value)!r}"
    span = f"#{inv.index}..{'' if done is None else f'#{done.index}'}"
    return (
        f"{inv.f} {value_to_json(inv.value)!r}{result} [{pair.outcome}] "
        f"process={inv.process!r} ops {span}"
    )


def pair_to_json(pair: OpPair) -> dict[str, object]:
    """An operation as one JSON object for verdicts and counterexamples."""
    inv, done = pair.invoke, pair.completion
    return {
        "process": inv.process,
        "f": inv.f,
        "value": value_to_json(inv.value),
        "type": pair.outcome,
        "result": None if done is None else value_to_json(done.value),
        "invoke_index": inv.index,
        "complete_index": None if done is None else done.index,
        "invoke_time": inv.time,
        "complete_time": None if done is None else done.time,
    }

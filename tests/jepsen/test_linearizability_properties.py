"""Properties of the checker: histories of a real sequential register are valid, stale-read
mutations of them are rejected, and verdicts agree with a brute-force checker on tiny histories.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.jepsen.history import History, HistoryRecorder, Op, OpPair
from phalanx.jepsen.linearizability import check
from phalanx.jepsen.models import RegisterModel

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class _Client:
    process: int
    phase: str = "idle"  # idle -> invoked -> applied | skipped -> (completion) -> idle
    f: str = ""
    value: object = None
    result: object = None


@st.composite
def register_executions(draw: st.DrawFn, max_ops: int = 14) -> History:
    """A concurrent execution of a real register: each op takes effect at a chosen instant
    between its invoke and completion (or not at all if it fails / crashes first)."""
    clients = [_Client(process=p) for p in range(draw(st.integers(1, 4)))]
    next_process = len(clients)
    rec = HistoryRecorder()
    register: object = None
    written: list[object] = []
    next_value = 1
    started = 0
    for t in range(6 * max_ops):
        actions: list[tuple[int, str]] = []
        for i, c in enumerate(clients):
            if c.phase == "idle" and started < max_ops:
                actions.append((i, "invoke"))
            elif c.phase == "invoked":  # weighted: crashes and failures are the exception
                actions += [(i, "apply")] * 4 + [(i, "fail"), (i, "crash")]
            elif c.phase in ("applied", "skipped"):
                actions += [(i, "complete")] * 4 + [(i, "crash")]
        if not actions:
            break
        i, action = draw(st.sampled_from(actions))
        c = clients[i]
        if action == "invoke":
            c.f = draw(st.sampled_from(["read", "write", "cas"]))
            if c.f == "read":
                c.value = None
            elif c.f == "write":
                c.value, next_value = next_value, next_value + 1
            else:
                expected = draw(st.sampled_from([None, *written[-3:]]))
                c.value, next_value = (expected, next_value), next_value + 1
            rec.invoke(process=c.process, f=c.f, key="x", value=c.value, time=t)  # type: ignore[arg-type]
            c.phase = "invoked"
            started += 1
        elif action == "apply":  # the linearization point
            c.phase = "applied"
            if c.f == "read":
                c.result = register
            elif c.f == "write":
                register = c.value
                written.append(register)
            else:
                expected, new = c.value  # type: ignore[misc]
                if register == expected:
                    register = new
                    written.append(register)
                else:
                    c.phase = "skipped"  # the comparison failed: the cas did not happen
        elif action == "fail":  # rejected before taking effect
            rec.complete(process=c.process, type="fail", time=t)
            c.phase = "idle"
        elif action == "crash":  # the client never learns the outcome
            rec.complete(process=c.process, type="info", time=t)
            clients[i] = _Client(process=next_process)
            next_process += 1
        elif c.phase == "skipped":
            rec.complete(process=c.process, type="fail", time=t)
            c.phase = "idle"
        else:
            value = c.result if c.f == "read" else c.value
            rec.complete(process=c.process, type="ok", value=value, time=t)  # type: ignore[arg-type]
            c.phase = "idle"
    return rec.history()


@FAST
@given(register_executions())
def test_executions_of_a_real_register_are_linearizable(history: History) -> None:
    result = check(history, time_limit=None)
    assert result.valid is True, result.to_json()


def _position(history: History) -> dict[int, int]:
    return {op.index: pos for pos, op in enumerate(history.ops)}


def _stale_candidates(history: History) -> list[tuple[OpPair, object]]:
    """(ok read, stale value) pairs where returning that value is certainly not linearizable.

    Values are unique per write/cas, so value v was written only by op w. If another op w2
    that definitely took effect (ok) starts after w completes and completes before the read
    starts, the register cannot hold v during the read. For v = null (the initial state) it
    is enough that some definite write completed before the read started.
    """
    pos = _position(history)
    ok_writers = [p for p in history.pairs if p.outcome == "ok" and p.invoke.f in ("write", "cas")]

    def new_value(p: OpPair) -> object:
        v = p.invoke.value
        return v[1] if isinstance(v, tuple) else v

    out: list[tuple[OpPair, object]] = []
    for r in history.pairs:
        if r.invoke.f != "read" or r.outcome != "ok" or r.completion is None:
            continue
        start = pos[r.invoke.index]
        for w2 in ok_writers:
            assert w2.completion is not None
            if pos[w2.completion.index] >= start:
                continue
            if r.completion.value is not None:
                out.append((r, None))
            for w in ok_writers:
                assert w.completion is not None
                if w is w2 or pos[w.completion.index] >= pos[w2.invoke.index]:
                    continue
                if new_value(w) != r.completion.value:
                    out.append((r, new_value(w)))
    return out


def _with_read_value(history: History, read: OpPair, value: object) -> History:
    assert read.completion is not None
    target = read.completion.index
    ops = [dataclasses.replace(op, value=value) if op.index == target else op for op in history.ops]
    return History.of(ops)


@FAST
@given(st.data())
def test_stale_read_mutations_are_rejected(data: st.DataObject) -> None:
    history = data.draw(register_executions(max_ops=16))
    candidates = _stale_candidates(history)
    if not candidates:
        return
    read, stale = data.draw(st.sampled_from(candidates))
    mutated = _with_read_value(history, read, stale)
    result = check(mutated, time_limit=None)
    assert result.valid is False
    ce = result.keys[0].counterexample
    assert ce is not None
    assert ce.blocked is not None


def test_stale_generator_finds_candidates() -> None:
    """Guard against the property above passing vacuously: a fixed execution has candidates."""
    rec = HistoryRecorder()
    for t, (p, kind, *rest) in enumerate(
        [
            (0, "invoke", "write", 1),
            (0, "ok"),
            (0, "invoke", "write", 2),
            (0, "ok"),
            (1, "invoke", "read", None),
            (1, "ok", 2),
        ]
    ):
        if kind == "invoke":
            rec.invoke(process=p, f=rest[0], key="x", value=rest[1], time=t)  # type: ignore[arg-type]
        else:
            rec.complete(process=p, type=kind, time=t, **({"value": rest[0]} if rest else {}))  # type: ignore[arg-type]
    found = {v for _, v in _stale_candidates(rec.history())}
    assert found == {None, 1}


# --- brute force ------------------------------------------------------------------------------


def _brute_force(history: History) -> bool:
    """Linearizable iff some subset of the maybe-ops plus all ok-ops has an order that respects
    real time and is a legal register run. Exponential; for <= 6 ops only."""
    pos = _position(history)
    definite = [p for p in history.pairs if p.outcome == "ok"]
    maybe = [p for p in history.pairs if p.outcome == "info"]

    def precedes(a: OpPair, b: OpPair) -> bool:
        return (
            a.completion is not None
            and a.outcome == "ok"
            and (pos[a.completion.index] < pos[b.invoke.index])
        )

    def legal(order: tuple[OpPair, ...]) -> bool:
        reg: object = None
        for p in order:
            f, v = p.invoke.f, p.invoke.value
            if f == "write":
                reg = v
            elif f == "cas":
                assert isinstance(v, tuple)
                if not _same(reg, v[0]):
                    return False
                reg = v[1]
            elif p.outcome == "ok":
                assert p.completion is not None
                if not _same(reg, p.completion.value):
                    return False
        return True

    for k in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, k):
            ops = definite + list(chosen)
            for order in itertools.permutations(ops):
                if all(
                    not precedes(order[j], order[i])
                    for i in range(len(order))
                    for j in range(i + 1, len(order))
                ) and legal(order):
                    return True
    return False


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


@st.composite
def tiny_histories(draw: st.DrawFn) -> History:
    """Arbitrary (mostly invalid) histories of <= 6 ops, one process per op, values in 0..2."""
    values = st.sampled_from([None, 1, 2])
    n = draw(st.integers(1, 6))
    specs: list[tuple[str, object, str, object]] = []
    for _ in range(n):
        f = draw(st.sampled_from(["read", "write", "cas"]))
        if f == "read":
            arg: object = None
        elif f == "write":
            arg = draw(st.sampled_from([1, 2, 3]))
        else:
            arg = (draw(values), draw(st.sampled_from([1, 2])))
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "fail", "info", "pending"]))
        specs.append((f, arg, outcome, draw(values)))
    rec = HistoryRecorder()
    invoked = [False] * n
    done = [s[2] == "pending" for s in specs]
    t = 0
    while True:
        moves = [(i, "invoke") for i in range(n) if not invoked[i]]
        moves += [(i, "complete") for i in range(n) if invoked[i] and not done[i]]
        if not moves:
            break
        i, move = draw(st.sampled_from(moves))
        f, arg, outcome, read_value = specs[i]
        if move == "invoke":
            rec.invoke(process=i, f=f, key="k", value=arg, time=t)  # type: ignore[arg-type]
            invoked[i] = True
        else:
            result = read_value if f == "read" else arg
            rec.complete(process=i, type=outcome, value=result, time=t)  # type: ignore[arg-type]
            done[i] = True
        t += 1
    return rec.history()


@settings(max_examples=400, deadline=None)
@given(tiny_histories())
def test_agrees_with_brute_force_on_tiny_histories(history: History) -> None:
    expected = _brute_force(history)
    result = check(history, time_limit=None)
    assert result.valid is expected
    if expected is False:
        ce = result.keys[0].counterexample
        assert ce is not None
        model = RegisterModel()
        state = model.initial()
        for step in ce.linearized:
            arg = model.prepare(step.op)
            assert arg is not None
            legal, state = model.step(state, arg)
            assert legal


def test_brute_force_itself_distinguishes() -> None:
    """The oracle is not trivially true or false."""
    ops = [
        Op(index=0, time=0, process=0, type="invoke", f="write", key="k", value=1),
        Op(index=1, time=1, process=0, type="ok", f="write", key="k", value=1),
        Op(index=2, time=2, process=1, type="invoke", f="read", key="k"),
        Op(index=3, time=3, process=1, type="ok", f="read", key="k", value=1),
    ]
    assert _brute_force(History.of(ops)) is True
    stale = [*ops[:3], dataclasses.replace(ops[3], value=None)]
    assert _brute_force(History.of(stale)) is False

"""Hand-written linearizability cases (Knossos / Porcupine style), budgets and counterexamples.

Events are written as ``(process, "invoke", f, value)`` or ``(process, outcome[, value])``;
each event's time is its position, and file order is real-time order.
"""

from __future__ import annotations

import pytest

from phalanx.jepsen.history import History, HistoryError, HistoryRecorder, Op
from phalanx.jepsen.linearizability import (
    UNKNOWN,
    CheckResult,
    check,
    merge_verdicts,
)
from phalanx.jepsen.models import RegisterModel

Event = tuple[object, ...]


def hist(*events: Event, key: object = "x") -> History:
    rec = HistoryRecorder()
    for t, ev in enumerate(events):
        process, kind, *rest = ev
        if kind == "invoke":
            f, value = rest
            rec.invoke(process=process, f=f, key=key, value=value, time=t)  # type: ignore[arg-type]
        elif rest:
            rec.complete(process=process, type=kind, value=rest[0], time=t)  # type: ignore[arg-type]
        else:
            rec.complete(process=process, type=kind, time=t)  # type: ignore[arg-type]
    return rec.history()


def verdict(*events: Event) -> object:
    return check(hist(*events), time_limit=None).valid


def W(p: int, v: object) -> Event:
    return (p, "invoke", "write", v)


def R(p: int) -> Event:
    return (p, "invoke", "read", None)


def CAS(p: int, expected: object, new: object) -> Event:
    return (p, "invoke", "cas", (expected, new))


# --- classic cases ------------------------------------------------------------------------------


def test_empty_history_is_valid() -> None:
    result = check([], time_limit=None)
    assert result.valid is True
    assert result.keys == ()


def test_sequential_write_then_read() -> None:
    assert verdict(W(0, 1), (0, "ok"), R(0), (0, "ok", 1)) is True
    assert verdict(W(0, 1), (0, "ok"), R(0), (0, "ok", 2)) is False


def test_reading_absent_register_returns_null() -> None:
    assert verdict(R(0), (0, "ok", None)) is True
    assert verdict(W(0, 1), (0, "ok"), R(1), (1, "ok", None)) is False


def test_concurrent_read_may_see_old_or_new_value() -> None:
    for seen in (None, 1):
        assert verdict(W(0, 1), R(1), (1, "ok", seen), (0, "ok")) is True
    assert verdict(W(0, 1), R(1), (1, "ok", 2), (0, "ok")) is False


def test_stale_read_after_overwrite_is_invalid() -> None:
    events = (W(0, 1), (0, "ok"), W(0, 2), (0, "ok"), R(1), (1, "ok", 1))
    assert verdict(*events) is False


def test_reads_must_agree_on_one_order_of_concurrent_writes() -> None:
    # Two concurrent writes; two later sequential reads see them in opposite orders.
    base = (W(0, 1), W(1, 2), (0, "ok"), (1, "ok"))
    assert verdict(*base, R(2), (2, "ok", 1), R(2), (2, "ok", 2)) is False
    assert verdict(*base, R(2), (2, "ok", 2), R(2), (2, "ok", 2)) is True
    # The search tries write 1 before write 2 first; this read needs the other order.
    assert verdict(*base, R(2), (2, "ok", 1), R(2), (2, "ok", 1)) is True
    three = (W(0, 1), W(1, 2), W(3, 3), (0, "ok"), (1, "ok"), (3, "ok"))
    assert verdict(*three, R(2), (2, "ok", 1)) is True
    assert verdict(*three, R(2), (2, "ok", 2)) is True


def test_new_value_seen_then_old_value_seen_is_invalid() -> None:
    # Both reads overlap the write, but once one read returned the new value, a later read
    # (starting after the first completed) may not return the old one.
    events = (W(0, 1), R(1), (1, "ok", 1), R(2), (2, "ok", None), (0, "ok"))
    assert verdict(*events) is False


def test_cas_semantics() -> None:
    assert verdict(CAS(0, None, 1), (0, "ok"), R(0), (0, "ok", 1)) is True
    assert verdict(W(0, 5), (0, "ok"), CAS(0, None, 1), (0, "ok")) is False
    assert verdict(W(0, 5), (0, "ok"), CAS(0, 5, 6), (0, "ok"), R(0), (0, "ok", 6)) is True
    assert verdict(W(0, 4), (0, "ok"), CAS(0, 5, 6), (0, "ok")) is False
    # A cas that failed did not happen, whatever it would have written.
    assert verdict(W(0, 4), (0, "ok"), CAS(0, 5, 6), (0, "fail"), R(0), (0, "ok", 4)) is True
    assert verdict(W(0, 4), (0, "ok"), CAS(0, 4, 6), (0, "fail"), R(0), (0, "ok", 6)) is False


def test_indeterminate_write_may_or_may_not_have_happened() -> None:
    crashed = (W(0, 1), (0, "info"))
    assert verdict(*crashed, R(1), (1, "ok", 1)) is True
    assert verdict(*crashed, R(1), (1, "ok", None)) is True
    # ... and it may take effect late: after a read that missed it.
    assert verdict(*crashed, R(1), (1, "ok", None), R(1), (1, "ok", 1)) is True
    # But once observed it cannot be undone.
    assert verdict(*crashed, R(1), (1, "ok", 1), R(1), (1, "ok", None)) is False


def test_pending_write_behaves_like_info() -> None:
    assert verdict(W(0, 1), R(1), (1, "ok", None), R(1), (1, "ok", 1)) is True
    assert verdict(W(0, 1), R(1), (1, "ok", 1), R(1), (1, "ok", None)) is False


def test_indeterminate_cas_is_only_possible_when_its_comparison_holds() -> None:
    crashed = (W(0, 1), (0, "ok"), CAS(1, 1, 2), (1, "info"))
    assert verdict(*crashed, R(2), (2, "ok", 2)) is True
    assert verdict(*crashed, R(2), (2, "ok", 1)) is True
    wrong = (W(0, 1), (0, "ok"), CAS(1, 7, 2), (1, "info"))
    assert verdict(*wrong, R(2), (2, "ok", 2)) is False


def test_failed_write_is_ignored() -> None:
    failed = (W(0, 1), (0, "fail"))
    assert verdict(*failed, R(1), (1, "ok", 1)) is False
    assert verdict(*failed, R(1), (1, "ok", None)) is True


def test_read_with_unknown_result_constrains_nothing() -> None:
    assert verdict(W(0, 1), (0, "ok"), R(1), (1, "info", 99)) is True
    assert verdict(W(0, 1), (0, "ok"), R(1)) is True


def test_values_compare_by_json_type() -> None:
    assert verdict(W(0, 1), (0, "ok"), R(0), (0, "ok", True)) is False
    assert verdict(W(0, 1), (0, "ok"), R(0), (0, "ok", 1.0)) is False
    assert verdict(W(0, "1"), (0, "ok"), R(0), (0, "ok", 1)) is False
    assert verdict(W(0, True), (0, "ok"), R(0), (0, "ok", True)) is True


def test_keys_are_checked_independently_and_nemesis_is_ignored() -> None:
    rec = HistoryRecorder()
    rec.invoke(process=0, f="write", key="a", value=1, time=0)
    rec.complete(process=0, type="ok", time=1)
    rec.nemesis(f="partition", value="halves", time=2)
    # On key b the read sees a's value: b was never written, so b is invalid, a is fine.
    rec.invoke(process=1, f="read", key="b", time=3)
    rec.complete(process=1, type="ok", value=1, time=4)
    rec.invoke(process=1, f="read", key="a", time=5)
    rec.complete(process=1, type="ok", value=1, time=6)
    result = check(rec.history(), time_limit=None)
    assert result.valid is False
    assert result.failing_keys == ("b",)
    assert [r.key for r in result.keys] == ["a", "b"]
    assert result.keys[0].valid is True
    doc = result.to_json()
    assert doc["failing_keys"] == ["b"]
    assert [r["key"] for r in doc["results"]] == ["b"]  # type: ignore[index, union-attr]


def test_malformed_register_values_raise_naming_the_line() -> None:
    history = hist(CAS(0, 1, 2), (0, "ok"))
    bad = History.of(
        [
            Op(index=0, time=0, process=0, type="invoke", f="cas", key="x", value=5),
            Op(index=1, time=1, process=0, type="ok", f="cas", key="x", value=5),
        ],
        lines=[7, 8],
    )
    assert check(history, time_limit=None).valid is False  # absent register, cas 1 -> 2
    with pytest.raises(HistoryError, match="must be \\[expected, new\\]") as exc:
        check(bad, time_limit=None)
    assert exc.value.line == 7
    with pytest.raises(HistoryError, match="no operation 'append'"):
        check(hist((0, "invoke", "append", 1), (0, "ok")), time_limit=None)
    with pytest.raises(HistoryError, match="JSON scalar"):
        check(hist(W(0, [1]), (0, "ok")), time_limit=None)


# --- counterexamples -----------------------------------------------------------------------------


def _replay_is_legal(result: CheckResult) -> None:
    """A counterexample's prefix must itself be a legal sequential run of the model."""
    model = RegisterModel()
    for key_result in result.keys:
        ce = key_result.counterexample
        if ce is None:
            continue
        state = model.initial()
        for step in ce.linearized:
            arg = model.prepare(step.op)
            assert arg is not None
            legal, state = model.step(state, arg)
            assert legal
            assert model.describe_state(state) == step.state
        assert model.describe_state(state) == ce.state


def test_counterexample_names_the_stale_read_and_the_prefix() -> None:
    events = (W(0, 1), (0, "ok"), W(0, 2), (0, "ok"), R(1), (1, "ok", 1))
    result = check(hist(*events), time_limit=None)
    (key_result,) = result.keys
    ce = key_result.counterexample
    assert ce is not None
    assert [s.op.invoke.value for s in ce.linearized] == [1, 2]
    assert ce.state == 2
    assert ce.blocked is not None
    assert ce.blocked.invoke.f == "read"
    assert ce.blocked.completion is not None
    assert ce.blocked.completion.value == 1
    assert ce.candidates == ()
    _replay_is_legal(result)
    text = "\n".join(result.explain())
    assert "key 'x': not linearizable" in text
    assert "cannot place next: read None -> 1 [ok] process=1 ops #4..#5" in text
    doc = key_result.to_json()
    assert doc["counterexample"]["blocked"]["result"] == 1  # type: ignore[index, call-overload]


def test_counterexample_lists_the_alternatives() -> None:
    # Two concurrent writes then a read of a value neither wrote.
    events = (W(0, 1), W(1, 2), R(2), (2, "ok", 3), (0, "ok"), (1, "ok"))
    result = check(hist(*events), time_limit=None)
    ce = result.keys[0].counterexample
    assert result.valid is False
    assert ce is not None
    assert ce.blocked is not None
    assert ce.blocked.invoke.f == "read"
    placed = {s.op.invoke.value for s in ce.linearized} | {c.invoke.value for c in ce.candidates}
    assert placed == {1, 2}
    _replay_is_legal(result)


# --- budgets ----------------------------------------------------------------------------------


def _hard_invalid(writers: int) -> History:
    """`writers` concurrent writes that never complete, then a read of a value nobody wrote:
    invalid, but only after trying every subset of the writes."""
    events: list[Event] = [W(p, p + 1) for p in range(writers)]
    events += [R(writers), (writers, "ok", 999)]
    return hist(*events)


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        self.now += self.step
        return self.now


def test_time_budget_yields_unknown_never_a_pass() -> None:
    clock = FakeClock(step=1.0)
    result = check(_hard_invalid(12), time_limit=0.5, clock=clock)
    assert result.valid == UNKNOWN
    assert result.unknown_keys == ("x",)
    assert result.keys[0].reason == "time limit"
    assert clock.calls == 2  # the deadline, then the first look after CLOCK_EVERY steps
    assert result.keys[0].counterexample is not None
    _replay_is_legal(result)


def test_generous_time_budget_reaches_the_verdict() -> None:
    clock = FakeClock(step=0.0)
    assert check(_hard_invalid(8), time_limit=1.0, clock=clock).valid is False


def test_step_budget_is_deterministic() -> None:
    a = check(_hard_invalid(10), time_limit=None, step_limit=200)
    b = check(_hard_invalid(10), time_limit=None, step_limit=200)
    assert a == b
    assert a.valid == UNKNOWN
    assert a.keys[0].reason == "step limit"
    assert a.keys[0].steps == 200
    full = check(_hard_invalid(10), time_limit=None)
    assert full.valid is False
    assert full.keys[0].steps > 200


def test_budget_is_per_key() -> None:
    rec = HistoryRecorder()
    rec.invoke(process=100, f="read", key="easy", time=0)
    rec.complete(process=100, type="ok", value=None, time=1)
    for p in range(8):
        rec.invoke(process=p, f="write", key="hard", value=p, time=2 + p)
    rec.invoke(process=200, f="read", key="hard", time=20)
    rec.complete(process=200, type="ok", value=999, time=21)
    result = check(rec.history(), time_limit=None, step_limit=50)
    assert [(r.key, r.valid) for r in result.keys] == [("easy", True), ("hard", UNKNOWN)]
    assert result.valid == UNKNOWN
    assert check(rec.history(), time_limit=None).valid is False


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], True),
        ([True, True], True),
        ([True, UNKNOWN], UNKNOWN),
        ([UNKNOWN, False, True], False),
        ([False, UNKNOWN], False),
    ],
)
def test_merge_verdicts(verdicts: list[object], expected: object) -> None:
    assert merge_verdicts(verdicts) == expected  # type: ignore[arg-type]


def test_long_sequential_history_needs_no_recursion() -> None:
    rec = HistoryRecorder()
    t = 0
    for i in range(3000):
        rec.invoke(process=0, f="write", key="x", value=i, time=t)
        rec.complete(process=0, type="ok", time=t + 1)
        rec.invoke(process=1, f="read", key="x", time=t + 2)
        rec.complete(process=1, type="ok", value=i, time=t + 3)
        t += 4
    result = check(rec.history(), time_limit=None)
    assert result.valid is True
    assert result.ops == 6000

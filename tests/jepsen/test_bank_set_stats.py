"""Bank, set and stats checkers on hand-built histories, plus a hypothesis property each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.jepsen.bank import check_bank
from phalanx.jepsen.checker import UNKNOWN, check_history, check_stats
from phalanx.jepsen.history import History, HistoryError, HistoryRecorder, Value
from phalanx.jepsen.sets import check_set


class H:
    """A tiny history builder: one op at a time, each on its own process."""

    def __init__(self) -> None:
        self.rec = HistoryRecorder()
        self.t = 0
        self.p = 0

    def op(self, f: str, value: object, outcome: str = "ok", result: object = None,
           *, key: str | None = None) -> None:
        self.p += 1
        self.t += 1
        self.rec.invoke(process=self.p, f=f, key=key, value=value, time=self.t)  # type: ignore[arg-type]
        if outcome == "pending":
            return
        self.t += 1
        res: Value = result if result is not None else value  # type: ignore[assignment]
        self.rec.complete(process=self.p, type=outcome, time=self.t, value=res)  # type: ignore[arg-type]

    def history(self) -> History:
        return self.rec.history()


def bank(reads: list[dict[str, int]], *, init: bool = True) -> History:
    h = H()
    if init:
        h.op("init", {"a": 10, "b": 10})
    h.op("transfer", {"from": "a", "to": "b", "amount": 3})
    h.op("transfer", {"from": "b", "to": "a", "amount": 50}, "fail")
    for r in reads:
        h.op("read", None, "ok", r)
    return h.history()


def test_bank_valid_history() -> None:
    r = check_bank(bank([{"a": 10, "b": 10}, {"a": 7, "b": 13}]))
    assert r.valid is True
    assert r.details["total"] == 20
    assert r.details["total_from"] == "init"
    assert r.details["read_count"] == 2
    assert r.details["bad_reads"] == []
    assert r.details["transfers"] == {"ok": 1, "fail": 1, "info": 0}


def test_bank_read_with_broken_total_is_reported() -> None:
    r = check_bank(bank([{"a": 7, "b": 13}, {"a": 7, "b": 10}]))
    assert r.valid is False
    (bad,) = r.details["bad_reads"]  # type: ignore[misc]
    assert bad["problems"] == ["wrong-total"]
    assert bad["total"] == 17
    assert bad["balances"] == {"a": 7, "b": 10}
    assert r.details["bad_read_count"] == 1


def test_bank_negative_balance_is_reported_even_with_the_right_total() -> None:
    r = check_bank(bank([{"a": -1, "b": 21}]))
    assert r.valid is False
    (bad,) = r.details["bad_reads"]  # type: ignore[misc]
    assert bad["problems"] == ["negative"]
    assert bad["negative"] == ["a"]


def test_bank_missing_and_unexpected_accounts() -> None:
    r = check_bank(bank([{"a": 20}, {"a": 10, "b": 5, "c": 5}]))
    kinds = r.details["bad_reads_by_kind"]
    assert kinds == {"missing-accounts": 1, "unexpected-accounts": 1}
    assert r.valid is False


def test_bank_total_inferred_without_init_and_caller_total_wins() -> None:
    h = bank([{"a": 5, "b": 5}, {"a": 4, "b": 6}], init=False)
    r = check_bank(h)
    assert (r.valid, r.details["total"], r.details["total_from"]) == (True, 10, "first read")
    r = check_bank(h, total=20, accounts=("a", "b"))
    assert r.valid is False
    assert r.details["bad_read_count"] == 2


def test_bank_without_reads_is_unknown_and_bad_values_raise() -> None:
    assert check_bank(bank([])).valid == UNKNOWN
    with pytest.raises(HistoryError, match="balance of account 'a'"):
        check_bank(bank([{"a": "x"}]))  # type: ignore[dict-item]


def test_bank_empty_read_before_init_is_not_an_error() -> None:
    h = H()
    h.op("read", None, "ok", {})
    h.op("init", {"a": 1})
    h.op("read", None, "ok", {"a": 1})
    assert check_bank(h.history()).valid is True
    h.op("read", None, "ok", {})  # after init completed: the money vanished
    assert check_bank(h.history()).valid is False


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 5)),
                max_size=30))
def test_bank_serial_transfers_always_pass_and_a_skim_always_fails(
    moves: list[tuple[int, int, int]],
) -> None:
    names = ["a", "b", "c"]
    state = {"a": 10, "b": 10, "c": 10}
    h = H()
    h.op("init", dict(state))
    for src, dst, amount in moves:
        if src == dst:
            continue
        move = {"from": names[src], "to": names[dst], "amount": amount}
        if state[names[src]] < amount:
            h.op("transfer", move, "fail")
            continue
        state[names[src]] -= amount
        state[names[dst]] += amount
        h.op("transfer", move)
        h.op("read", None, "ok", dict(state))
    assert check_bank(h.history()).valid in (True, UNKNOWN)
    skimmed = dict(state, a=state["a"] - 1)
    h.op("read", None, "ok", skimmed)
    assert check_bank(h.history()).valid is False


# --- set -----------------------------------------------------------------------------------


def test_set_all_categories() -> None:
    h = H()
    h.op("add", 1, key="s")  # ok, present
    h.op("add", 2, key="s")  # ok, absent -> lost
    h.op("add", 3, "info", key="s")  # info, present -> recovered
    h.op("add", 4, "info", key="s")  # info, absent -> fine
    h.op("add", 5, "fail", key="s")  # fail, present -> unexpected
    h.op("add", 6, key="s")  # ok, present twice -> duplicated
    h.op("read", None, "ok", [1, 3, 5, 6, 6, 9], key="s")  # 9 never attempted -> unexpected
    r = check_set(h.history())
    assert r.valid is False
    (key,) = r.details["results"]  # type: ignore[misc]
    assert key["lost"] == [2]
    assert key["unexpected"] == [5, 9]
    assert key["duplicated"] == [[6, 2]]
    assert key["recovered"] == [3]
    assert r.details["attempt_count"] == 6
    assert r.details["acknowledged_count"] == 3


def test_set_valid_with_recovered_and_in_flight_adds() -> None:
    h = H()
    h.op("add", 1, key="s")
    h.op("add", 2, "info", key="s")
    h.op("add", 7, "ok", key="t")
    h.op("read", None, "ok", [1, 2], key="s")
    h.op("read", None, "ok", [7], key="t")
    r = check_set(h.history())
    assert r.valid is True
    assert r.details["recovered_count"] == 1
    assert r.details["lost_count"] == 0


def test_set_add_acknowledged_after_the_final_read_began_is_not_lost() -> None:
    rec = HistoryRecorder()
    rec.invoke(process=1, f="add", key="s", value=1, time=0)
    rec.invoke(process=2, f="read", key="s", time=1)
    rec.complete(process=1, type="ok", time=2)
    rec.complete(process=2, type="ok", value=(), time=3)
    assert check_set(rec.history()).valid is True


def test_set_key_without_read_is_unknown_and_bad_values_raise() -> None:
    h = H()
    h.op("add", 1, key="s")
    h.op("read", None, "info", key="s")
    assert check_set(h.history()).valid == UNKNOWN
    h.op("read", None, "ok", [1, "x"], key="s")
    with pytest.raises(HistoryError, match="list of integer"):
        check_set(h.history())


# --- stats ---------------------------------------------------------------------------------


def test_stats_requires_every_kind_to_succeed_once() -> None:
    h = H()
    h.op("read", None, "ok", 1)
    h.op("write", 2, "info")
    h.op("write", 3, "fail")
    r = check_stats(h.history())
    assert r.valid is False
    assert r.details["never_ok"] == ["write"]
    assert r.details["by_f"] == {
        "read": {"ok": 1, "fail": 0, "info": 0},
        "write": {"ok": 0, "fail": 1, "info": 1},
    }
    h.op("write", 4)
    assert check_stats(h.history()).valid is True
    # A kind the workload expects but never invoked also invalidates the run.
    assert check_stats(h.history(), functions=("cas",)).details["never_ok"] == ["cas"]


def test_stats_empty_history_is_invalid_and_merges_into_the_run_verdict() -> None:
    assert check_stats(HistoryRecorder().history()).valid is False
    h = H()
    h.op("add", 1, key="s")
    h.op("read", None, "ok", [1], key="s")
    run = check_history("set", h.history())
    assert run.valid is True
    assert [r.checker for r in run.results] == ["set", "stats"]
    h.op("add", 2, "info", key="s")
    run = check_history("set", h.history(), functions=("add", "read", "remove"))
    assert run.valid is False
    assert run.to_json()["checkers"]["stats"]["never_ok"] == ["remove"]  # type: ignore[index]

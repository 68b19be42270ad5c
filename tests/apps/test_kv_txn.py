"""KV `Txn`: atomic compare/success/failure, absent compares, limits, wire form and hooks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.interface import KeyAccess
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    MAX_KEY_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    Get,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    Txn,
    TxnResult,
    TxnWrite,
    Value,
)


def run(m: KvStateMachine, cmd: Txn | Put | Get) -> KvResult:
    return kv_wire.decode_result(m.apply(kv_wire.encode_command(cmd)))


def state(m: KvStateMachine, *keys: str) -> dict[str, bytes | None]:
    return {k: m.get(k) for k in keys}


def test_success_branch_runs_all_writes_when_every_compare_holds() -> None:
    m = KvStateMachine()
    run(m, Put(key="a", value=b"10"))
    run(m, Put(key="b", value=b"5"))
    txn = Txn(
        compares=(Compare(key="a", expected=b"10"), Compare(key="b", expected=b"5")),
        success=(Put(key="a", value=b"7"), Put(key="b", value=b"8"), Delete(key="c")),
        failure=(Put(key="f", value=b"x"),),
    )
    assert run(m, txn) == TxnResult(succeeded=True, observed=(b"10", b"5"))
    assert state(m, "a", "b", "c", "f") == {"a": b"7", "b": b"8", "c": None, "f": None}


def test_failure_branch_runs_when_one_compare_fails_and_reports_observed_values() -> None:
    m = KvStateMachine()
    run(m, Put(key="a", value=b"10"))
    run(m, Put(key="b", value=b"6"))
    txn = Txn(
        compares=(Compare(key="a", expected=b"10"), Compare(key="b", expected=b"5")),
        success=(Put(key="a", value=b"7"), Put(key="b", value=b"8")),
        failure=(Put(key="f", value=b"x"), Delete(key="a")),
    )
    assert run(m, txn) == TxnResult(succeeded=False, observed=(b"10", b"6"))
    # No success write happened; the failure branch did, in order.
    assert state(m, "a", "b", "f") == {"a": None, "b": b"6", "f": b"x"}


def test_absent_compare_and_empty_compares() -> None:
    m = KvStateMachine()
    create = Txn(compares=(Compare(key="k", expected=None),), success=(Put(key="k", value=b"1"),))
    assert run(m, create) == TxnResult(succeeded=True, observed=(None,))
    assert run(m, create) == TxnResult(succeeded=False, observed=(b"1",))
    assert m.get("k") == b"1"
    # No compares: the success branch always runs.
    assert run(m, Txn(compares=(), success=(Delete(key="k"),))) == TxnResult(
        succeeded=True, observed=()
    )
    assert m.get("k") is None


def test_writes_within_a_branch_apply_in_order() -> None:
    m = KvStateMachine()
    run(m, Put(key="x", value=b"old"))
    # Delete then put of different keys, and a delete of a missing key, are all fine.
    txn = Txn(compares=(), success=(Delete(key="x"), Put(key="y", value=b"1"), Delete(key="z")))
    assert run(m, txn) == TxnResult(succeeded=True, observed=())
    assert state(m, "x", "y", "z") == {"x": None, "y": b"1", "z": None}


_BIG_KEY = "k" * (MAX_KEY_BYTES + 1)


@pytest.mark.parametrize(
    ("txn", "code"),
    [
        (
            Txn(compares=(Compare(key="a", expected=None),) * (MAX_TXN_OPS + 1), success=()),
            KvErrorCode.TXN_TOO_LARGE,
        ),
        (
            Txn(
                compares=(),
                success=tuple(Put(key=f"k{i}", value=b"") for i in range(MAX_TXN_OPS + 1)),
            ),
            KvErrorCode.TXN_TOO_LARGE,
        ),
        (
            Txn(compares=(), success=(), failure=(Delete(key="d"),) * (MAX_TXN_OPS + 1)),
            KvErrorCode.TXN_TOO_LARGE,
        ),
        (
            Txn(compares=(Compare(key=_BIG_KEY, expected=None),), success=()),
            KvErrorCode.KEY_TOO_LARGE,
        ),
        (Txn(compares=(), success=(Delete(key=_BIG_KEY),)), KvErrorCode.KEY_TOO_LARGE),
        (
            Txn(
                compares=(),
                success=(),
                failure=(Put(key="v", value=b"x" * (MAX_VALUE_BYTES + 1)),),
            ),
            KvErrorCode.VALUE_TOO_LARGE,
        ),
        (
            Txn(compares=(), success=(Put(key="a", value=b"1"), Delete(key="a"))),
            KvErrorCode.DUPLICATE_KEY,
        ),
    ],
)
def test_malformed_txn_is_a_typed_error_and_changes_nothing(txn: Txn, code: KvErrorCode) -> None:
    m = KvStateMachine()
    run(m, Put(key="a", value=b"0"))
    before = m.snapshot()
    result = run(m, txn)
    assert isinstance(result, KvError)
    assert result.code == code
    assert m.get("a") == b"0"
    assert len(m) == len(before) == 1
    assert not m.check(kv_wire.encode_command(txn)).accept


def test_same_key_in_both_branches_is_allowed() -> None:
    m = KvStateMachine()
    txn = Txn(
        compares=(Compare(key="a", expected=b"1"),),
        success=(Put(key="a", value=b"2"),),
        failure=(Put(key="a", value=b"1"),),
    )
    assert run(m, txn) == TxnResult(succeeded=False, observed=(None,))
    assert run(m, txn) == TxnResult(succeeded=True, observed=(b"1",))
    assert m.get("a") == b"2"


def test_txn_is_not_a_query_and_a_bare_compare_is_not_a_command() -> None:
    m = KvStateMachine()
    txn = Txn(compares=(), success=(Put(key="a", value=b"1"),))
    result = kv_wire.decode_result(m.query(kv_wire.encode_command(txn)))
    assert isinstance(result, KvError)
    assert result.code == KvErrorCode.NOT_A_QUERY
    assert m.get("a") is None
    raw = kv_wire.REGISTRY.encode(Compare(key="a", expected=None))
    bad = kv_wire.decode_result(m.apply(raw))
    assert isinstance(bad, KvError)
    assert bad.code == KvErrorCode.MALFORMED


def test_access_hook_names_compared_and_written_keys_once() -> None:
    m = KvStateMachine()
    txn = Txn(
        compares=(Compare(key="a", expected=None), Compare(key="a", expected=b"1")),
        success=(Put(key="b", value=b"1"),),
        failure=(Delete(key="b"), Put(key="c", value=b"")),
    )
    # A writing txn writes the keys it compares too (their versions move in transaction
    # mode: test_kv_endorsement.test_a_writing_txn_writes_the_keys_it_compares).
    assert m.access(kv_wire.encode_command(txn)) == KeyAccess(reads=("a",),
                                                              writes=("a", "b", "c"))


_keys = st.sampled_from(["a", "b", "c"])
_vals = st.none() | st.sampled_from([b"0", b"1"])


def _write(key: str, value: bytes | None) -> TxnWrite:
    return Delete(key=key) if value is None else Put(key=key, value=value)


@settings(max_examples=150, deadline=None)
@given(
    initial=st.dictionaries(_keys, st.sampled_from([b"0", b"1"])),
    compares=st.lists(st.tuples(_keys, _vals), max_size=3),
    success=st.dictionaries(_keys, _vals, max_size=3),
    failure=st.dictionaries(_keys, _vals, max_size=3),
)
def test_txn_matches_a_sequential_model_and_round_trips(
    initial: dict[str, bytes],
    compares: list[tuple[str, bytes | None]],
    success: dict[str, bytes | None],
    failure: dict[str, bytes | None],
) -> None:
    m = KvStateMachine()
    for k, v in sorted(initial.items()):
        run(m, Put(key=k, value=v))
    txn = Txn(
        compares=tuple(Compare(key=k, expected=v) for k, v in compares),
        success=tuple(_write(k, v) for k, v in success.items()),
        failure=tuple(_write(k, v) for k, v in failure.items()),
    )
    assert kv_wire.decode_command(kv_wire.encode_command(txn)) == txn
    model = dict(initial)
    held = all(model.get(k) == v for k, v in compares)
    for k, v in (success if held else failure).items():
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v
    result = run(m, txn)
    assert result == TxnResult(
        succeeded=held, observed=tuple(initial.get(k) for k, _ in compares)
    )
    assert {k: m.get(k) for k in "abc"} == {k: model.get(k) for k in "abc"}
    assert run(m, Get(key="a")) == Value(value=model.get("a"))

"""The KV app's promise over arbitrary commands: `apply`, `query`, `access` and `check` never
raise and answer well-formed replies, and replicas applying the same commands stay identical.

Commands are arbitrary bytes, typed KV commands with odd field values (empty and oversized
keys, negative limits, duplicate and unsorted keys, empty or oversized txns, updates with
operands at and past the 64-bit range, on numbers, sets and values that are neither), and codec
frames of KV type ids whose fields have the wrong shapes."""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.interface import KeyAccess, Verdict
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_ops import INT64_MAX, INT64_MIN, encode_set
from phalanx.apps.kv_types import (
    KV_TYPE_IDS,
    MAX_KEY_BYTES,
    MAX_TXN_OPS,
    READ_COMMANDS,
    Add,
    CasResult,
    Compare,
    CompareAndSet,
    Concat,
    CsCompact,
    CsDeliver,
    CsPrune,
    Delete,
    Deleted,
    Done,
    Get,
    GetBaseVersion,
    GetVersion,
    GetVersioned,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Mul,
    Put,
    SAdd,
    Scan,
    ScanResult,
    SRem,
    Txn,
    TxnResult,
    Value,
    VersionedValue,
    VersionResult,
)

# ---------------------------------------------------------------------------------- strategies

_keys = st.one_of(
    st.text(alphabet="ab\u00e9\U0001f600", max_size=3),  # few keys: commands collide
    st.text(max_size=8),
    st.just("k" * MAX_KEY_BYTES),  # at the limit
    st.just("\u00e9" * (MAX_KEY_BYTES // 2 + 1)),  # over it, in bytes only
)
# Values of every kind the updates meet: numbers (canonical or not), sets (canonical or not).
_numbers = st.one_of(st.integers(-5, 5), st.sampled_from([INT64_MIN, INT64_MAX]))
_payloads = st.one_of(
    st.binary(max_size=8),
    _numbers.map(lambda n: str(n).encode()),
    st.sampled_from([b"-0", b"007", b"+1", b" 1", b"9223372036854775808", b"1.5", b""]),
    st.frozensets(st.binary(max_size=3), max_size=3).map(encode_set),
    st.sampled_from([b"\x92\xc4\x01b\xc4\x01a", b"\x92\xc4\x01a\xc4\x01a", b"\x91\xa1a",
                     b"\xdc\x00\x00", b"\x90"]),  # unsorted, duplicate, str, long header
)
_operands = st.one_of(_numbers, st.integers(-(2**63), 2**64 - 1))
_updates = st.one_of(
    st.builds(Add, key=_keys, amount=_operands),
    st.builds(Mul, key=_keys, factor=_operands),
    st.builds(SAdd, key=_keys, member=st.binary(max_size=3)),
    st.builds(SRem, key=_keys, member=st.binary(max_size=3)),
    st.builds(Concat, key=_keys, suffix=st.binary(max_size=8)),
)
_values = st.one_of(st.binary(max_size=8), st.none())
_writes = st.one_of(
    st.builds(Put, key=_keys, value=st.binary(max_size=8)), st.builds(Delete, key=_keys))
_branches = st.one_of(
    st.lists(_writes, max_size=4).map(tuple),
    st.just((Delete(key="d"),) * (MAX_TXN_OPS + 1)),
)
_typed = st.one_of(
    st.builds(Put, key=_keys, value=_payloads),
    _updates,
    st.builds(Get, key=_keys),
    st.builds(GetVersion, key=_keys),
    st.builds(GetVersioned, key=_keys),
    st.builds(Delete, key=_keys),
    st.builds(CompareAndSet, key=_keys, expected=_values, new=st.binary(max_size=8)),
    st.builds(Scan, prefix=_keys, limit=st.integers(-(2**63), 2**63 - 1)),
    st.builds(Scan, prefix=_keys, limit=st.integers(-2, 5)),
    st.builds(Txn, compares=st.lists(st.builds(Compare, key=_keys, expected=_values),
                                      max_size=4).map(tuple),
              success=_branches, failure=_branches),
).map(kv_wire.encode_command)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                     st.text(max_size=4), st.binary(max_size=4), st.floats(allow_nan=False))
_ids = st.sampled_from(sorted(KV_TYPE_IDS))
_frames = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.builds(lambda tid, rest: [tid, *rest], _ids, st.lists(inner, max_size=4)),
    ),
    max_leaves=12,
).map(lambda obj: msgpack.packb(obj, use_bin_type=True))

commands = st.one_of(st.binary(max_size=48), _typed, _frames)

# ---------------------------------------------------------------------------------- checks

_ANSWERS: dict[type, tuple[type, ...]] = {
    Put: (Done,), Get: (Value,), Delete: (Deleted,), CompareAndSet: (CasResult,),
    Scan: (ScanResult,), Txn: (TxnResult,), GetVersion: (VersionResult,),
    GetVersioned: (VersionedValue,), Add: (Done,), Mul: (Done,), SAdd: (Done,), SRem: (Done,),
    Concat: (Done,), CsDeliver: (TxnResult,), CsCompact: (TxnResult,), CsPrune: (TxnResult,),
    GetBaseVersion: (VersionResult,),
}


def test_every_command_type_has_its_expected_answers() -> None:
    """`_ANSWERS` covers the whole `KvCommand` union: a command added without its answer
    here made the property test below raise KeyError once hypothesis drew it."""
    assert set(_ANSWERS) == set(KvCommand.__args__)  # type: ignore[attr-defined]


def _well_formed(command: bytes, answer: bytes, *, as_query: bool) -> KvResult:
    result = kv_wire.decode_result(answer)  # raises on anything but one KV result
    assert isinstance(result, KvResult.__args__)  # type: ignore[attr-defined]
    cmd = kv_wire.decode_command(command)
    if isinstance(cmd, KvError):
        assert result == cmd
    elif as_query and not isinstance(cmd, READ_COMMANDS):
        assert isinstance(result, KvError)
        assert result.code is KvErrorCode.NOT_A_QUERY
    else:
        assert isinstance(result, _ANSWERS[type(cmd)] + (KvError,))
    return result


def _checkpoint(m: KvStateMachine) -> bytes:
    return b"".join(m.snapshot().chunks())


# ---------------------------------------------------------------------------------- tests


def test_access_of_a_txn_with_unsorted_keys_does_not_raise() -> None:
    """Regression: `access` built `KeyAccess` from the txn's keys in the txn's order, and
    `KeyAccess` refuses unsorted keys, so a committed txn over ('b', 'a') raised."""
    m = KvStateMachine()
    txn = Txn(compares=(Compare(key="b", expected=None), Compare(key="a", expected=None),
                        Compare(key="b", expected=b"x")),
              success=(Put(key="b", value=b"1"), Delete(key="a")),
              failure=(Put(key="c", value=b"2"), Put(key="a", value=b"3")))
    access = m.access(kv_wire.encode_command(txn))
    assert access == KeyAccess(reads=("a", "b"), writes=("a", "b", "c"))


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=12))
def test_commands_never_raise_and_replicas_stay_identical(cmds: list[bytes]) -> None:
    a, b = KvStateMachine(), KvStateMachine()
    for command in cmds:
        access = a.access(command)
        assert isinstance(access, KeyAccess)
        assert b.access(command) == access  # a function of the command alone
        assert isinstance(a.check(command), Verdict)
        asked = a.query(command)
        _well_formed(command, asked, as_query=True)
        assert b.query(command) == asked
        answer = a.apply(command)
        _well_formed(command, answer, as_query=False)
        assert b.apply(command) == answer
        assert len(a) == len(b)
    assert _checkpoint(a) == _checkpoint(b)
    c = KvStateMachine()
    c.restore(_checkpoint(a))
    assert _checkpoint(c) == _checkpoint(a)

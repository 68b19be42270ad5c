"""Versions and commuting updates of the KV app (`phalanx.apps.kv_ops`): the encodings, the
results, PnyxDB's conflict matrix through `access`/`commutes`, and the property the leaderless
core relies on: pairwise-commuting commands give the same state and results in every order."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.interface import EndorsementHooks, KeyAccess, KeyUpdate
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_ops import (
    EMPTY_SET,
    INT64_MAX,
    INT64_MIN,
    NO_VERSION,
    commutes,
    decode_int,
    decode_set,
    encode_set,
)
from phalanx.apps.kv_types import (
    MAX_VALUE_BYTES,
    Add,
    Concat,
    Delete,
    Done,
    Get,
    GetVersion,
    GetVersioned,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Mul,
    Put,
    SAdd,
    SRem,
    VersionedValue,
    VersionResult,
)

enc = kv_wire.encode_command


def _run(m: KvStateMachine, cmd: KvCommand) -> KvResult:
    return kv_wire.decode_result(m.apply(enc(cmd)))


def _checkpoint(m: KvStateMachine) -> bytes:
    return b"".join(m.snapshot().chunks())


# ---------------------------------------------------------------------------------- versions


def test_version_is_sha512_of_the_value_and_empty_when_absent() -> None:
    m = KvStateMachine()
    assert kv_wire.decode_result(m.query(enc(GetVersion(key="k")))) == VersionResult(
        version=NO_VERSION)
    assert kv_wire.decode_result(m.query(enc(GetVersioned(key="k")))) == VersionedValue(
        value=None, version=b"")
    _run(m, Put(key="k", value=b"hello"))
    digest = hashlib.sha512(b"hello").digest()
    assert _run(m, GetVersion(key="k")) == VersionResult(version=digest)
    assert kv_wire.decode_result(m.query(enc(GetVersioned(key="k")))) == VersionedValue(
        value=b"hello", version=digest)
    _run(m, Put(key="k", value=b""))  # present but empty: not the absent version
    assert _run(m, GetVersion(key="k")) == VersionResult(version=hashlib.sha512(b"").digest())


def test_new_wire_ids_leave_existing_encodings_alone() -> None:
    # The existing commands' frames are byte-for-byte what they were (ids 400-406, 420-426).
    assert enc(Put(key="k", value=b"v")) == b"\x93\xcd\x01\x90\xa1k\xc4\x01v"
    assert enc(Get(key="k")) == b"\x92\xcd\x01\x91\xa1k"
    assert [kv_wire.REGISTRY.type_id(t) for t in (
        GetVersion, GetVersioned, Add, Mul, SAdd, SRem, Concat, VersionResult, VersionedValue,
    )] == [407, 408, 409, 410, 411, 412, 413, 427, 428]


# ---------------------------------------------------------------------------------- updates


def test_add_and_mul_on_decimal_integers_wrap_at_64_bits() -> None:
    m = KvStateMachine()
    assert _run(m, Add(key="n", amount=5)) == Done()  # absent reads as 0
    assert m.get("n") == b"5"
    assert _run(m, Mul(key="n", factor=-3)) == Done()
    assert m.get("n") == b"-15"
    _run(m, Put(key="big", value=str(INT64_MAX).encode()))
    _run(m, Add(key="big", amount=1))
    assert m.get("big") == str(INT64_MIN).encode()
    _run(m, Mul(key="zero", factor=7))
    assert m.get("zero") == b"0"


@pytest.mark.parametrize("value", [b"x", b"-0", b"007", b"+1", b" 1", b"1.5", b"",
                                   b"9223372036854775808", encode_set({b"a"})])
def test_add_on_a_non_number_is_a_wrong_type_error_and_changes_nothing(value: bytes) -> None:
    m = KvStateMachine()
    _run(m, Put(key="n", value=value))
    for cmd in (Add(key="n", amount=1), Mul(key="n", factor=2)):
        result = _run(m, cmd)
        assert isinstance(result, KvError)
        assert result.code is KvErrorCode.WRONG_TYPE
    assert m.get("n") == value


def test_operands_outside_int64_are_invalid_arguments() -> None:
    m = KvStateMachine()
    for cmd in (Add(key="n", amount=INT64_MAX + 1), Mul(key="n", factor=2**64 - 1)):
        result = _run(m, cmd)
        assert isinstance(result, KvError)
        assert result.code is KvErrorCode.INVALID_ARGUMENT
        assert not m.check(enc(cmd)).accept
    assert m.get("n") is None


def test_sets_are_sorted_unique_msgpack_arrays() -> None:
    m = KvStateMachine()
    for member in (b"b", b"a", b"b", b"c"):
        assert _run(m, SAdd(key="s", member=member)) == Done()
    assert m.get("s") == encode_set({b"a", b"b", b"c"}) == b"\x93\xc4\x01a\xc4\x01b\xc4\x01c"
    assert decode_set(m.get("s")) == [b"a", b"b", b"c"]
    _run(m, SRem(key="s", member=b"b"))
    _run(m, SRem(key="s", member=b"zz"))  # absent member: no change, still Done
    assert decode_set(m.get("s")) == [b"a", b"c"]
    _run(m, SRem(key="s", member=b"a"))
    _run(m, SRem(key="s", member=b"c"))
    assert m.get("s") == EMPTY_SET == b"\x90"
    _run(m, Put(key="t", value=b"\x92\xc4\x01b\xc4\x01a"))  # unsorted: not a set
    result = _run(m, SAdd(key="t", member=b"c"))
    assert isinstance(result, KvError)
    assert result.code is KvErrorCode.WRONG_TYPE
    assert decode_set(b"\xdc\x00\x00") is None  # an empty array, but not the shortest form
    assert decode_int(None) == 0


def test_concat_appends_and_refuses_past_the_value_limit() -> None:
    m = KvStateMachine()
    _run(m, Concat(key="c", suffix=b"ab"))
    _run(m, Concat(key="c", suffix=b"cd"))
    assert m.get("c") == b"abcd"
    result = _run(m, Concat(key="c", suffix=b"x" * (MAX_VALUE_BYTES - 3)))
    assert isinstance(result, KvError)
    assert result.code is KvErrorCode.VALUE_TOO_LARGE
    assert m.get("c") == b"abcd"


def test_updates_are_not_queries() -> None:
    m = KvStateMachine()
    result = kv_wire.decode_result(m.query(enc(Add(key="n", amount=1))))
    assert isinstance(result, KvError)
    assert result.code is KvErrorCode.NOT_A_QUERY
    assert m.get("n") is None


# ---------------------------------------------------------------------------------- conflicts


def _u(op: str, operand: bytes = b"x", key: str = "k") -> KeyUpdate:
    return KeyUpdate(key=key, op=op, operand=operand)


def test_commutes_is_exactly_pnyxdbs_matrix() -> None:
    ops = ("set", "concat", "add", "mul", "sadd", "srem")
    always = {("add", "add"), ("mul", "mul"), ("sadd", "sadd"), ("srem", "srem")}
    for a in ops:
        for b in ops:
            same = commutes(_u(a, b"1"), _u(b, b"1"))
            different = commutes(_u(a, b"1"), _u(b, b"2"))
            assert same == commutes(_u(b, b"1"), _u(a, b"1"))  # symmetric
            if (a, b) in always:
                expected = (True, True)
            elif (a, b) == ("set", "set"):
                expected = (True, False)  # only identical data
            elif {a, b} == {"sadd", "srem"}:
                expected = (False, True)  # only different members
            else:
                expected = (False, False)
            assert (same, different) == expected, (a, b)
    assert commutes(_u("concat", key="a"), _u("concat", key="b"))  # other keys never conflict
    assert not commutes(_u("unknown"), _u("unknown"))


def test_access_exposes_the_matrix_through_key_access() -> None:
    m = KvStateMachine()
    assert isinstance(m, EndorsementHooks)

    def conflict(a: KvCommand, b: KvCommand) -> bool:
        return m.access(enc(a)).conflicts_with(m.access(enc(b)), m.commutes)

    assert m.access(enc(Add(key="n", amount=2))) == KeyAccess(
        writes=("n",), updates=(KeyUpdate(key="n", op="add", operand=b"2"),))
    assert not conflict(Add(key="n", amount=1), Add(key="n", amount=-4))
    assert not conflict(Mul(key="n", factor=2), Mul(key="n", factor=3))
    assert conflict(Add(key="n", amount=1), Mul(key="n", factor=3))
    assert not conflict(SAdd(key="s", member=b"a"), SRem(key="s", member=b"b"))
    assert conflict(SAdd(key="s", member=b"a"), SRem(key="s", member=b"a"))
    assert not conflict(Put(key="k", value=b"v"), Put(key="k", value=b"v"))
    assert conflict(Put(key="k", value=b"v"), Put(key="k", value=b"w"))
    assert conflict(Concat(key="c", suffix=b"a"), Concat(key="c", suffix=b"a"))
    assert conflict(Add(key="n", amount=1), Get(key="n"))  # a read sees the order
    assert conflict(Add(key="n", amount=1), GetVersion(key="n"))
    assert conflict(Add(key="n", amount=1), Delete(key="n"))
    assert not conflict(Concat(key="a", suffix=b"x"), Concat(key="b", suffix=b"x"))
    # Without the app's relation every write conflicts, as before.
    assert m.access(enc(Add(key="n", amount=1))).conflicts_with(
        m.access(enc(Add(key="n", amount=1))))


def test_key_access_refuses_updates_of_keys_it_does_not_write() -> None:
    with pytest.raises(ValueError, match="missing from writes"):
        KeyAccess(updates=(_u("add"),))


# ---------------------------------------------------------------------------------- property

_KEYS = ("n", "s", "c")
_starts = st.lists(st.tuples(st.sampled_from(_KEYS), st.one_of(
    st.none(), st.sampled_from([b"0", b"7", b"-3", str(INT64_MAX).encode(), b"x", b"007"]),
    st.frozensets(st.sampled_from([b"a", b"b", b"c"])).map(encode_set),
)), max_size=3)
_ops = st.one_of(
    st.builds(Add, key=st.sampled_from(_KEYS), amount=st.sampled_from(
        [1, -1, 5, INT64_MAX, INT64_MIN, INT64_MAX + 1])),
    st.builds(Mul, key=st.sampled_from(_KEYS), factor=st.sampled_from([0, -1, 2, 3, INT64_MAX])),
    st.builds(SAdd, key=st.sampled_from(_KEYS), member=st.sampled_from([b"a", b"b", b"d"])),
    st.builds(SRem, key=st.sampled_from(_KEYS), member=st.sampled_from([b"a", b"b", b"d"])),
    st.builds(Concat, key=st.sampled_from(_KEYS), suffix=st.sampled_from([b"", b"z"])),
    st.builds(Put, key=st.sampled_from(_KEYS), value=st.sampled_from([b"1", encode_set({b"a"})])),
)


@st.composite
def _commuting_runs(draw: st.DrawFn) -> tuple[list[tuple[str, bytes | None]], list[KvCommand],
                                               list[KvCommand]]:
    """A start state, a list of pairwise-commuting commands, and a permutation of it."""
    m = KvStateMachine()
    kept: list[KvCommand] = []
    for cmd in draw(st.lists(_ops, max_size=10)):
        access = m.access(enc(cmd))
        if not any(access.conflicts_with(m.access(enc(k)), m.commutes) for k in kept):
            kept.append(cmd)
    return draw(_starts), kept, draw(st.permutations(kept))


@settings(max_examples=300, deadline=None)
@given(_commuting_runs())
def test_pairwise_commuting_commands_give_one_state_in_every_order(
    run: tuple[list[tuple[str, bytes | None]], list[KvCommand], list[KvCommand]],
) -> None:
    start, ops, shuffled = run

    def play(order: list[KvCommand]) -> tuple[bytes, dict[bytes, list[bytes]]]:
        m = KvStateMachine()
        for key, value in start:
            m.apply(enc(Put(key=key, value=value) if value is not None else Delete(key=key)))
        results: dict[bytes, list[bytes]] = {}
        for cmd in order:
            results.setdefault(enc(cmd), []).append(m.apply(enc(cmd)))
        return _checkpoint(m), results

    assert play(ops) == play(shuffled)


def test_transaction_mode_decodes_a_command_once_and_answers_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`access`, `check` and `apply_tx` share one decode of a command (`_command`) and
    `check` remembers its verdict; the answers are those of a machine without the memos."""
    decodes: list[bytes] = []
    real = kv_wire.decode_command

    def counting(data: bytes) -> object:
        decodes.append(data)
        return real(data)

    monkeypatch.setattr(kv_wire, "decode_command", counting)
    m, fresh = KvStateMachine(), KvStateMachine()
    put = enc(Put(key="k", value=b"v"))
    assert m.access(put).writes == ("k",)
    assert m.access(put) == fresh.access(put)
    assert m.check(put).accept
    assert m.check(put).accept
    assert m.apply_tx(b"t" * 32, put) == fresh.apply_tx(b"t" * 32, put)
    assert decodes.count(put) == 2  # one per machine
    assert m.versions(["k"]) == fresh.versions(["k"])
    assert m.get("k") == b"v"
    junk = b"\xc1junk"
    assert m.check(junk) == fresh.check(junk)
    assert not m.check(junk).accept
    assert m.check(junk) is m.check(junk)  # remembered


def test_the_decode_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import phalanx.apps.kv as kv_module
    monkeypatch.setattr(kv_module, "DECODE_MEMO", 4)
    m = KvStateMachine()
    for i in range(20):
        command = enc(Put(key=f"k{i}", value=b"v"))
        assert m.check(command).accept
        assert m.apply_tx(bytes([i]) * 32, command) == kv_wire.encode_result(Done())
    assert len(m._decoded) == 4
    assert len(m._verdicts) == 4
    assert m.access(enc(Put(key="k0", value=b"v"))).writes == ("k0",)  # decoded again


def test_large_commands_stay_out_of_the_memos() -> None:
    """The memos hold command bytes as keys: a command above `MEMO_MAX_BYTES` (a command may
    be ~2 MiB) is decoded and answered, never kept."""
    import phalanx.apps.kv as kv_module
    m, fresh = KvStateMachine(), KvStateMachine()
    big = enc(Put(key="big", value=b"x" * (kv_module.MEMO_MAX_BYTES + 1)))
    assert m.access(big).writes == ("big",)
    assert m.check(big).accept
    assert m.apply_tx(b"b" * 32, big) == fresh.apply_tx(b"b" * 32, big)
    assert (len(m._decoded), len(m._verdicts), len(m._access_memo)) == (0, 0, 0)

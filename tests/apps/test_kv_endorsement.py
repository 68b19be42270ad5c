"""The KV app's endorsement side beyond conflicts: per-key `versions` (as `GetVersion`
answers them) and `needs_requirements` (which keys a leaderless transaction must pin)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.interface import EndorsementHooks
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    Add,
    Compare,
    CompareAndSet,
    Concat,
    Delete,
    Get,
    GetVersion,
    KvCommand,
    Mul,
    Put,
    SAdd,
    Scan,
    SRem,
    Txn,
    VersionResult,
)

enc = kv_wire.encode_command


def test_versions_match_get_version_and_are_empty_when_absent() -> None:
    m = KvStateMachine()
    assert isinstance(m, EndorsementHooks)
    m.apply(enc(Put(key="a", value=b"1")))
    m.apply(enc(SAdd(key="s", member=b"x")))
    got = m.versions(["a", "missing", "s"])
    assert got[1] == b""
    assert got[0] == kv_ops.version_of(b"1")
    for key, version in zip(["a", "missing", "s"], got, strict=True):
        answer = kv_wire.decode_result(m.query(enc(GetVersion(key=key))))
        assert answer == VersionResult(version=version)
    assert m.versions([]) == ()


def test_order_free_updates_need_no_requirement_everything_else_does() -> None:
    m = KvStateMachine()

    def needs(cmd: KvCommand) -> tuple[str, ...]:
        return m.needs_requirements(enc(cmd))

    for free in (Add(key="n", amount=1), Mul(key="n", factor=2), SAdd(key="s", member=b"a"),
                 SRem(key="s", member=b"a")):
        assert needs(free) == ()
    assert needs(Put(key="k", value=b"v")) == ("k",)
    assert needs(Concat(key="c", suffix=b"x")) == ("c",)
    assert needs(Delete(key="k")) == ("k",)
    assert needs(Get(key="k")) == ("k",)
    assert needs(CompareAndSet(key="k", expected=None, new=b"v")) == ("k",)
    assert needs(Txn(compares=(Compare(key="b", expected=None),),
                     success=(Put(key="c", value=b"1"),), failure=(Delete(key="a"),))) == (
        "a", "b", "c")
    assert needs(Scan(prefix="p", limit=10)) == ()  # a prefix cannot be pinned
    assert m.needs_requirements(b"\xc1 not a command") == ()


def test_a_writing_txn_writes_the_keys_it_compares() -> None:
    """So it never shares a compared key's version with a later writer of that key (the
    leaderless core refuses a writer requiring a key outside its writes)."""
    m = KvStateMachine()
    writing = Txn(compares=(Compare(key="b", expected=None),),
                  success=(Put(key="c", value=b"1"),))
    assert m.access(enc(writing)).writes == ("b", "c")
    reading = Txn(compares=(Compare(key="b", expected=None),), success=())
    assert m.access(enc(reading)).writes == ()
    assert m.access(enc(reading)).reads == ("b",)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.binary(max_size=8)),
                max_size=10))
def test_versions_are_a_function_of_the_values(writes: list[tuple[str, bytes]]) -> None:
    one, two = KvStateMachine(), KvStateMachine()
    for key, value in writes:
        one.apply(enc(Put(key=key, value=value)))
    for key, value in reversed(writes):
        two.apply(enc(Put(key=key, value=value)))
    keys = ["a", "b", "c"]
    same = [one.get(k) == two.get(k) for k in keys]
    assert [x == y for x, y in zip(one.versions(keys), two.versions(keys), strict=True)] == same

"""The KV app's versions in transaction mode (`phalanx.apps.kv_versions`): base hash chain,
order-free full versions, the run switch rule, checkpoints of the metadata, and Raft/PBFT
versions and checkpoints unchanged."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.interface import SnapshotFormatError
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Add, Delete, GetBaseVersion, GetVersion, Mul, Put, SAdd, SRem


def enc(cmd: object) -> bytes:
    return kv_wire.encode_command(cmd)  # type: ignore[arg-type]


def tx(n: int) -> bytes:
    return hashlib.sha256(b"tx%d" % n).digest()


def checkpoint(kv: KvStateMachine) -> bytes:
    return b"".join(kv.snapshot().chunks())


def state(kv: KvStateMachine, keys: list[str]) -> tuple[object, ...]:
    return (tuple(kv.get(k) for k in keys), kv.versions(keys), kv.base_versions(keys))


UPDATES = st.sampled_from([Add(key="x", amount=1), Add(key="x", amount=5),
                           SAdd(key="s", member=b"a"), SAdd(key="s", member=b"b"),
                           SRem(key="s", member=b"c")])


@settings(max_examples=60, deadline=None)
@given(st.lists(UPDATES, min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_pairwise_commuting_updates_give_one_full_version_in_any_order(
        updates: list[object], rnd: object) -> None:
    """Within one base, any order of commuting updates (two identical ones included, each
    its own transaction) gives one value, one full version and the unchanged base."""
    numbered = list(enumerate(updates))
    shuffled = numbered[:]
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    runs = []
    for order in (numbered, shuffled):
        kv = KvStateMachine()
        kv.apply_tx(tx(-1), enc(Put(key="x", value=b"0")))
        base = kv.base_versions(["x", "s"])
        for n, cmd in order:
            kv.apply_tx(tx(n), enc(cmd))
        assert kv.base_versions(["x", "s"]) == base
        runs.append(state(kv, ["x", "s"]))
    assert runs[0] == runs[1]


def test_identical_adds_give_distinct_versions() -> None:
    one, two = KvStateMachine(), KvStateMachine()
    one.apply_tx(tx(1), enc(Add(key="x", amount=1)))
    two.apply_tx(tx(2), enc(Add(key="x", amount=1)))
    assert one.get("x") == two.get("x")
    assert one.versions(["x"]) != two.versions(["x"])


def test_no_aba_for_set_0_1_0_nor_through_a_delete() -> None:
    kv = KvStateMachine()
    seen = [kv.versions(["x"])[0]]
    assert seen == [b""]  # never written: the empty version
    for n, cmd in enumerate([Put(key="x", value=b"0"), Put(key="x", value=b"1"),
                             Put(key="x", value=b"0"), Delete(key="x"),
                             Put(key="x", value=b"0")]):
        kv.apply_tx(tx(n), enc(cmd))
        seen.append(kv.versions(["x"])[0])
    assert len(set(seen)) == len(seen)
    assert kv.base_versions(["x"]) == kv.versions(["x"])  # no commuting update since


def test_queries_answer_the_transaction_mode_versions() -> None:
    kv = KvStateMachine()
    kv.apply_tx(tx(1), enc(Put(key="x", value=b"3")))
    kv.apply_tx(tx(2), enc(Add(key="x", amount=1)))
    full, base = kv.versions(["x"])[0], kv.base_versions(["x"])[0]
    assert full != base
    assert kv_wire.decode_result(kv.query(enc(GetVersion(key="x")))).version == full  # type: ignore[union-attr]
    assert kv_wire.decode_result(kv.query(enc(GetBaseVersion(key="x")))).version == base  # type: ignore[union-attr]


def test_outside_transaction_mode_versions_and_checkpoints_are_unchanged() -> None:
    kv = KvStateMachine()
    kv.apply(enc(Put(key="x", value=b"3")))
    kv.apply(enc(Add(key="x", amount=1)))
    assert kv.versions(["x", "y"]) == (kv_ops.version_of(b"4"), b"")
    assert kv.base_versions(["x"]) == kv.versions(["x"])
    data = checkpoint(kv)
    assert data.startswith(b"\x92\xaaphalanx.kv\x03")  # format version 3, as before


@pytest.mark.parametrize(("first", "second", "fits"), [
    (Add(key="x", amount=1), Add(key="x", amount=2), True),
    (Add(key="x", amount=1), Mul(key="x", factor=2), False),
    (Mul(key="x", factor=3), Add(key="x", amount=2), False),
    (SAdd(key="x", member=b"a"), SRem(key="x", member=b"b"), True),
    (SAdd(key="x", member=b"a"), SRem(key="x", member=b"a"), False),
    (SRem(key="x", member=b"a"), SAdd(key="x", member=b"a"), False),
])
def test_the_switch_rule(first: object, second: object, fits: bool) -> None:
    """An update that does not commute with the run needs the full version (`fits_run`
    False) and, applied, moves the base; one that does joins the run."""
    kv = KvStateMachine()
    assert kv.needs_base(enc(second)) == ("x",)
    assert kv.needs_requirements(enc(second)) == ()
    assert kv.fits_run(enc(second), ["x"])  # an empty run fits everything
    kv.apply_tx(tx(1), enc(first))
    base = kv.base_versions(["x"])
    assert kv.fits_run(enc(second), ["x"]) is fits
    kv.apply_tx(tx(2), enc(second))
    assert (kv.base_versions(["x"]) == base) is fits
    if not fits:  # a fresh base: the run is empty again, even the first kind fits
        assert kv.versions(["x"]) == kv.base_versions(["x"])
        assert kv.fits_run(enc(first), ["x"])


@pytest.mark.parametrize("cmd", [Add(key="x", amount=4), SAdd(key="x", member=b"n")])
def test_a_pinned_update_moves_the_base(cmd: object) -> None:
    """Sim seeds 108, 218, 402, 564: U1, a commuting update that fits the run but whose
    transaction requires the key by FULL version (`pinned`), applied; then U2, a commuting
    update requiring only the base read after U1. A lagging replica that learns U2 first
    must not find U2's base there before U1 (else it applies U2 and U1's full requirement
    never holds again: gated forever, the replicas diverge). So a pinned update moves the
    base, as a switch does; an unpinned one still joins the run."""
    first = Add(key="x", amount=1) if isinstance(cmd, Add) else SAdd(key="x", member=b"m")
    ahead, lagging = KvStateMachine(), KvStateMachine()
    for kv in (ahead, lagging):
        kv.apply_tx(tx(1), enc(first))
    base_before = ahead.base_versions(["x"])
    assert ahead.fits_run(enc(cmd), ["x"])  # not a switch: only the requirement pins it
    ahead.apply_tx(tx(2), enc(cmd), ("x",))
    u2_base = ahead.base_versions(["x"])  # what U2, endorsed after U1, requires
    assert u2_base != base_before
    assert lagging.base_versions(["x"]) != u2_base  # U2 waits for U1 at the lagging replica
    assert ahead.versions(["x"]) == u2_base  # a fresh base: the run is empty again
    unpinned = KvStateMachine()
    unpinned.apply_tx(tx(1), enc(first))
    unpinned.apply_tx(tx(2), enc(cmd))
    assert unpinned.base_versions(["x"]) == base_before
    assert unpinned.get("x") == ahead.get("x")  # the value is the same either way


def test_a_put_resets_the_run() -> None:
    kv = KvStateMachine()
    kv.apply_tx(tx(1), enc(Add(key="x", amount=1)))
    kv.apply_tx(tx(2), enc(Put(key="x", value=b"7")))
    assert kv.fits_run(enc(Mul(key="x", factor=2)), ["x"])
    assert not kv.fits_run(enc(Put(key="x", value=b"1")), ["x"])  # not a commuting update


def test_checkpoint_round_trip_keeps_the_version_metadata() -> None:
    kv = KvStateMachine()
    for n, cmd in enumerate([Put(key="a", value=b"1"), Add(key="a", amount=2),
                             SAdd(key="s", member=b"m"), SRem(key="s", member=b"z"),
                             Put(key="gone", value=b"x"), Delete(key="gone"),
                             Add(key="n", amount=3)]):
        kv.apply_tx(tx(n), enc(cmd))
    kv.apply(enc(Put(key="plain", value=b"p")))  # no metadata: value versions
    keys = ["a", "s", "gone", "n", "plain", "never"]
    data = checkpoint(kv)
    assert data.startswith(b"\x92\xaaphalanx.kv\x04")
    back = KvStateMachine()
    back.restore(data)
    assert state(back, keys) == state(kv, keys)
    assert back.fits_run(enc(SAdd(key="s", member=b"z")), ["s"]) is False
    assert checkpoint(back) == data


@pytest.mark.parametrize("chunk", [
    ["versions", ["a", b"", b"", []]],                         # empty entry
    ["versions", ["a", b"x" * 3, b"", []]],                    # bad digest
    ["versions", ["a", b"", b"m" * 32, ["set", b""]]],         # not a run op
    ["versions", ["b", b"b" * 32, b"", [], "a", b"b" * 32, b"", []]],  # order
    ["versions", ["a", b"", b"m" * 32, []]],                   # a mix without a run
])
def test_a_malformed_version_chunk_is_refused(chunk: list[object]) -> None:
    import msgpack  # type: ignore[import-untyped]

    data = (msgpack.packb(["phalanx.kv", 4]) + msgpack.packb(chunk, use_bin_type=True)
            + msgpack.packb(0))
    with pytest.raises(SnapshotFormatError):
        KvStateMachine().restore(data)

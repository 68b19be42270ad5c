"""`LayeredState`: a sorted, sharded dict base under persistent overlays behaves exactly like
one dict, its snapshots never change, folding only moves values between layers, and a
checkpoint is the documented format byte for byte."""

from __future__ import annotations

import gc
import itertools
from array import array
from unittest import mock

import immutables
import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_state
from phalanx.apps.kv import CHUNK_KEYS, KvStateMachine
from phalanx.apps.kv_base import SHARD_KEYS
from phalanx.apps.kv_state import LayeredSnapshot, LayeredState, SortedBase
from phalanx.apps.kv_types import Delete, Put
from phalanx.apps.sorted_steps import sorted_in_steps

KEYS = st.sampled_from([f"k{i}" for i in range(12)] + ["", "a", "ab", "abc"])
VALUES = st.binary(max_size=4)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, VALUES),
        st.tuples(st.just("delete"), KEYS, st.none()),
        st.tuples(st.just("txn"), st.lists(st.tuples(KEYS, st.none() | VALUES), max_size=4),
                  st.none()),
        st.tuples(st.just("snapshot"), st.booleans(), st.none()),  # serialise it or not
    ),
    max_size=80,
)


def serialise(snap: LayeredSnapshot, chunk: int = 3) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    sizes: list[int] = []
    # Tiny windows and steps: many boundaries, and both sides of the merge run dry often.
    for piece in snap.sorted_chunks(chunk=chunk, window=2, run=3, step=2):
        if piece is not None:
            keys, values = piece
            assert len(keys) == len(values)
            sizes.append(len(keys))
            out.extend(zip(keys, values, strict=True))
    # Exactly `chunk` pairs per chunk, the last one shorter (the format depends on it).
    assert all(size == chunk for size in sizes[:-1])
    assert all(0 < size <= chunk for size in sizes[-1:])
    return out


@settings(deadline=None, max_examples=300)
@given(st.dictionaries(KEYS, VALUES, max_size=8), OPS)
def test_behaves_like_one_dict_and_snapshots_are_frozen(
    base: dict[str, bytes], ops: list[tuple[object, object, object]]
) -> None:
    check_against_one_dict(base, ops)


@settings(deadline=None, max_examples=150)
@given(st.dictionaries(KEYS, VALUES, max_size=8), OPS)
def test_replaced_layers_taken_apart_in_many_steps_never_change_a_live_snapshot(
    base: dict[str, bytes], ops: list[tuple[object, object, object]]
) -> None:
    # Two entries per write: old bases and levels are dismantled over many writes,
    # interleaved with snapshots that may still read them.
    with mock.patch.object(kv_state, "REAP_STEP", 2):
        check_against_one_dict(base, ops)


def check_against_one_dict(
    base: dict[str, bytes], ops: list[tuple[object, object, object]]
) -> None:
    state = LayeredState(SortedBase.from_items(base, shard_keys=3))
    model = dict(base)
    taken: list[tuple[LayeredSnapshot, list[tuple[str, bytes]]]] = []
    for op, a, b in ops:
        if op == "set":
            assert isinstance(a, str)
            assert isinstance(b, bytes)
            state.set(a, b)
            model[a] = b
        elif op == "delete":
            assert isinstance(a, str)
            assert state.delete(a) == (a in model)
            model.pop(a, None)
        elif op == "txn":
            assert isinstance(a, list)
            state.write_all(a)
            for key, value in a:
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
        else:
            snap = state.snapshot()
            want = sorted(model.items())
            assert snap.count() == len(want)
            if a:
                assert serialise(snap) == want
            taken.append((snap, want))
        assert len(state) == len(model)
        for key in ("k0", "k1", "a", "", "zz"):
            assert state.get(key) == model.get(key)
    assert state.keys_with_prefix("a") == sorted(k for k in model if k.startswith("a"))
    assert state.keys_with_prefix("") == sorted(model)
    # Every snapshot still reads as it was taken, folds adopted since or not.
    for snap, want in taken:
        assert serialise(snap) == want
    assert state.layers() <= 1 + sum(1 for _ in taken)


def test_a_completed_fold_is_adopted_and_collapses_the_layers() -> None:
    state = LayeredState(SortedBase.from_items({"a": b"1"}))
    for i in range(5):
        state.set(f"k{i}", b"x")
    snap = state.snapshot()
    assert state.layers() == 2  # one frozen level + live
    state.set("later", b"y")
    assert state.layers() == 2  # not serialised yet: nothing to adopt
    serialise(snap)
    assert snap.folded is not None
    assert list(snap.folded.items()) == [("a", b"1"), *((f"k{i}", b"x") for i in range(5))]
    state.set("after", b"z")  # a write adopts the fold
    assert state.layers() == 1
    assert state.get("later") == b"y"
    assert state.get("k3") == b"x"
    assert len(state) == 8


def test_an_older_fold_is_not_adopted_over_a_newer_snapshot() -> None:
    state = LayeredState()
    state.set("a", b"1")
    first = state.snapshot()
    state.set("b", b"2")
    second = state.snapshot()
    serialise(first)  # completes, but a newer snapshot exists: only its fold counts
    state.set("c", b"3")
    assert state.layers() == 3
    serialise(second)
    state.delete("a")
    assert state.layers() == 1
    assert [state.get(k) for k in "abc"] == [None, b"2", b"3"]


def test_checkpoint_bytes_do_not_depend_on_layering() -> None:
    """Two machines with equal contents give equal checkpoint bytes, however their writes
    were spread over layers and folds."""
    one, two = KvStateMachine(), KvStateMachine()
    for i in range(300):
        one.execute(Put(key=f"key{i:03d}", value=b"v%d" % i))
    for i in range(300):
        two.execute(Put(key=f"key{i:03d}", value=b"v%d" % i))
        if i % 37 == 0:
            b"".join(two.snapshot().chunks())  # a checkpoint: its fold is adopted next write
    two.execute(Delete(key="gone"))
    assert b"".join(one.snapshot().chunks()) == b"".join(two.snapshot().chunks())
    again = KvStateMachine()
    again.restore(b"".join(one.snapshot().chunks()))
    assert len(again) == 300
    assert again.get("key123") == b"v123"


def reference_checkpoint(model: dict[str, bytes], version: int = 2) -> bytes:
    """The KV checkpoint format written out from its documentation (`phalanx.apps.kv`):
    version 2 (what is written) or version 1 (still loaded)."""
    pairs = sorted(model.items())
    header = ["phalanx.kv", 1, len(pairs)] if version == 1 else ["phalanx.kv", 2]
    out = [msgpack.packb(header)]
    for lo in range(0, len(pairs), CHUNK_KEYS):
        out.append(msgpack.packb([x for pair in pairs[lo: lo + CHUNK_KEYS] for x in pair]))
    if version == 2:
        out.append(msgpack.packb(len(pairs)))
    return b"".join(out)


def test_checkpoint_bytes_are_the_documented_format_over_base_levels_and_deletes() -> None:
    """Several chunks' worth of keys: a restored base, then overwrites, deletes and new keys
    below, inside and above its range, over two levels and a fold."""
    model = {f"m{i:05d}": b"base%d" % i for i in range(0, 9000, 2)}
    machine = KvStateMachine()
    machine.restore(reference_checkpoint(model, version=1))
    for i in range(0, 9000, 7):
        machine.execute(Put(key=f"m{i:05d}", value=b"new%d" % i))
        model[f"m{i:05d}"] = b"new%d" % i
    first = b"".join(machine.snapshot().chunks())  # one level, folded
    assert first == reference_checkpoint(model)
    for i in range(0, 9000, 5):
        machine.execute(Delete(key=f"m{i:05d}"))
        model.pop(f"m{i:05d}", None)
    for key in ("a", "m", "m04500x", "zz"):
        machine.execute(Put(key=key, value=b"edge"))
        model[key] = b"edge"
    pending = machine.snapshot()  # not serialised yet: its level stays under the next one
    pending_model = dict(model)
    machine.execute(Put(key="m00003", value=b"late"))
    model["m00003"] = b"late"
    assert b"".join(machine.snapshot().chunks()) == reference_checkpoint(model)
    machine.execute(Put(key="m00005", value=b"later"))  # adopts the newer fold
    model["m00005"] = b"later"
    assert len(pending) == len(pending_model)
    assert b"".join(pending.chunks()) == reference_checkpoint(pending_model)
    again = KvStateMachine()
    again.restore(reference_checkpoint(model))
    assert b"".join(again.snapshot().chunks()) == reference_checkpoint(model)
    assert [again.get(k) for k in ("a", "m00003", "m00005", "m00010", "zz")] == [
        b"edge", b"late", b"later", None, b"edge"
    ]


def test_the_collector_stops_walking_restored_and_folded_shards() -> None:
    """After one pass the GC never walks the base again: each shard is one small tracked
    object whose key sample (a tuple of str) gets untracked, and whose keys and values are
    one str and one bytes."""
    machine = KvStateMachine()
    machine.restore(reference_checkpoint({f"k{i:05d}": b"v" for i in range(40_000)}))
    for i in range(0, 40_000, 11):
        machine.execute(Put(key=f"k{i:05d}", value=b"w"))
    snap = machine._data.snapshot()
    for _ in snap.sorted_chunks(chunk=CHUNK_KEYS, window=1000, run=100, step=100):
        pass
    assert snap.folded is not None
    restored = machine._data._base.shards
    full, rest = divmod(40_000, SHARD_KEYS)
    assert [len(shard) for shard in restored] == [SHARD_KEYS] * full + [rest]
    assert [len(shard) for shard in snap.folded.shards] == [SHARD_KEYS] * full + [rest]
    shards = [*restored, *snap.folded.shards]
    gc.collect()
    for shard in shards:
        referents = [r for r in gc.get_referents(shard) if not isinstance(r, type)]
        # the packed keys and their offsets, the key sample, the values and their offsets
        assert sorted(type(r).__name__ for r in referents) == [
            "array", "array", "bytes", "str", "tuple"]
        for r in referents:
            if isinstance(r, array):
                # An array is GC-tracked, but a pass visits nothing through it but its type.
                assert all(isinstance(x, type) for x in gc.get_referents(r))
            else:
                assert not gc.is_tracked(r)


def test_sorted_base_lookup_and_order_checks() -> None:
    base = SortedBase([{"b": b"1", "d": b"2"}, {"f": b"3"}, {"h": b"4", "j": b"5"}])
    assert len(base) == 5
    assert [base.get(k) for k in "abcdefghijk"] == [
        None, b"1", None, b"2", None, b"3", None, b"4", None, b"5", None
    ]
    assert list(base.keys_from("c")) == ["d", "f", "h", "j"]
    assert list(base.keys_from("f")) == ["f", "h", "j"]
    assert list(base.keys_from("k")) == []
    with pytest.raises(ValueError, match="empty shard"):
        SortedBase([{"a": b""}, {}])
    with pytest.raises(ValueError, match="out of key order"):
        SortedBase([{"a": b"", "c": b""}, {"b": b""}])  # overlapping ranges
    with pytest.raises(ValueError, match="out of key order"):
        SortedBase([{"c": b"", "a": b""}])  # a shard filled in descending order
    with pytest.raises(ValueError, match="shard_keys"):
        SortedBase.from_items({}, shard_keys=0)
    assert len(SortedBase.from_items({})) == 0


@settings(deadline=None, max_examples=200)
@given(st.sets(st.text(max_size=4), max_size=60), st.integers(1, 7), st.integers(1, 7))
def test_sorted_in_steps_sorts_in_bounded_pieces(keys: set[str], run: int, step: int) -> None:
    out: list[str] = []
    for piece in sorted_in_steps(sorted(keys, reverse=True), run=run, step=step):
        if piece is not None:
            assert 0 < len(piece) <= step
            out.extend(piece)
    assert out == sorted(keys)


def test_sorted_in_steps_refuses_repeated_keys() -> None:
    with pytest.raises(ValueError, match="distinct"):
        list(sorted_in_steps(["b", "a", "b"], run=3, step=2))
    with pytest.raises(ValueError, match=">= 1"):
        list(sorted_in_steps(["a"], run=0, step=1))


def test_a_folded_base_replaces_the_old_one_which_writes_take_apart() -> None:
    state = LayeredState(SortedBase.from_items({f"k{i:03d}": b"v" for i in range(40)},
                                               shard_keys=8))
    old_shards = state._base.shards  # not the base itself: a reference to it defers reaping
    for i in range(0, 40, 4):
        state.set(f"k{i:03d}", b"w")
    snap = state.snapshot()
    for _ in snap.sorted_chunks(chunk=8, window=3, run=4, step=4):
        pass
    del snap  # nothing reads the old base or the level any more
    with mock.patch.object(kv_state, "REAP_STEP", 3):
        state.set("x", b"1")  # adopts the fold; the old base and level go to the graveyard
        assert state._base.shards is not old_shards
        assert isinstance(state._graveyard[-1], immutables.Map)
        level_sizes: list[int] = []  # no reference kept to the level: it would defer reaping
        while isinstance(state._graveyard[-1], immutables.Map):
            level_sizes.append(len(state._graveyard[-1]))
            state.set("x", b"1")
        sizes = [sum(map(len, old_shards))]
        while state._graveyard:
            state.set("x", b"1")
            sizes.append(sum(map(len, old_shards)))
    # The level, then the old base were dismantled a piece per write, not at once.
    assert level_sizes == [7, 4, 1]  # 10 keys; the adopting write already took 3
    assert sizes == [40, 32, 24, 16, 8, 0]
    assert all(0 <= a - b <= 8 for a, b in itertools.pairwise(sizes))
    assert [state.get(f"k{i:03d}") for i in (0, 1, 4)] == [b"w", b"v", b"w"]


def test_an_idle_state_adopts_its_fold_and_frees_the_old_layers_through_maintain() -> None:
    """No writes after a checkpoint: `maintain` (the runtime calls it on idle ticks) adopts
    the fold and frees the replaced base and level a few pieces per call."""
    machine = KvStateMachine()
    machine.restore(reference_checkpoint({f"k{i:05d}": b"v" for i in range(20)}))
    for i in range(0, 20, 3):
        machine.execute(Put(key=f"k{i:05d}", value=b"w"))
    state = machine._data
    snap = state.snapshot()
    for _ in snap.sorted_chunks(chunk=4, window=3, run=4, step=4):
        pass
    del snap
    before = {f"k{i:05d}": state.get(f"k{i:05d}") for i in range(21)}
    assert state.layers() == 2
    with mock.patch.object(kv_state, "REAP_STEP", 2), \
            mock.patch.object(kv_state, "MAINTAIN_PIECES", 2):
        machine.maintain()
        assert state.layers() == 1  # adopted: one packed base under an empty live map
        calls = 1
        while state._graveyard:
            machine.maintain()
            calls += 1
    assert calls > 1  # freed in pieces, not at once
    assert {k: state.get(k) for k in before} == before
    assert len(state) == 20

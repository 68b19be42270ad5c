"""`LayeredState`: a sorted, sharded dict base under persistent overlays behaves exactly like
one dict, its snapshots never change, folding only moves values between layers, and a
checkpoint is the documented format byte for byte."""

from __future__ import annotations

import gc
import itertools
import sys
import zlib
from array import array
from unittest import mock

import immutables
import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_state
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_base import (
    MAX_SHARD_KEYS_FACTOR,
    SHARD_KEYS,
    PackedShard,
    ShardPacker,
)
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


def reference_cut(keys: list[str], mean: int) -> list[list[str]]:
    """The cut rule of `phalanx.apps.kv_base`, written out from its documentation: a shard
    ends after a key whose CRC-32 is divisible by `mean`, or at 4 x `mean` keys
    (`MAX_SHARD_KEYS_FACTOR`)."""
    shards: list[list[str]] = []
    current: list[str] = []
    for key in keys:
        current.append(key)
        if zlib.crc32(key.encode("utf-8", "surrogatepass")) % mean == 0 or (
            len(current) == MAX_SHARD_KEYS_FACTOR * mean
        ):
            shards.append(current)
            current = []
    return [*shards, current] if current else shards


@settings(max_examples=100, deadline=None)
@given(keys=st.sets(st.text(max_size=6), max_size=120), piece=st.integers(1, 9),
       shard_keys=st.integers(1, 12))
def test_the_packer_cuts_a_stream_by_the_documented_rule_however_it_is_fed(
    keys: set[str], piece: int, shard_keys: int
) -> None:
    ordered = sorted(keys)
    packer = ShardPacker(shard_keys)
    for lo in range(0, len(ordered), piece):
        cut = ordered[lo: lo + piece]
        before = len(packer.shards)
        assert packer.add(cut, [k.encode() for k in cut]) == (len(packer.shards) > before)
        assert packer.pending < MAX_SHARD_KEYS_FACTOR * shard_keys
    packer.flush()
    packer.flush()  # nothing pending: no empty shard
    assert [shard.keys() for shard in packer.shards] == reference_cut(ordered, shard_keys)
    for shard in packer.shards:
        keys = shard.keys()
        assert shard.values() == [k.encode() for k in keys]


def test_the_packer_reuses_a_shard_only_with_nothing_pending() -> None:
    packer = ShardPacker(1000)
    key = next(k for k in map(str, range(10)) if zlib.crc32(k.encode()) % 1000)  # not a cut
    shard = PackedShard.pack(["x"], [b""])
    packer.reuse(shard)
    assert packer.shards == [shard]
    packer.add([key], [b""])
    assert packer.pending == 1
    with pytest.raises(RuntimeError, match="pending"):
        packer.reuse(shard)


def walk(snap: LayeredSnapshot, shard: int = 3) -> list[PackedShard]:
    # Tiny windows and steps: many boundaries, and both sides of the merge run dry often.
    return [piece for piece in snap.shards(window=2, run=3, step=2, shard=shard)
            if piece is not None]


def serialise(snap: LayeredSnapshot, shard: int = 3) -> list[tuple[str, bytes]]:
    made = walk(snap, shard)
    out = [pair for piece in made for pair in zip(piece.keys(), piece.values(), strict=True)]
    # Exactly the shards the cut rule makes of the keys, however the layers lay.
    assert [piece.keys() for piece in made] == reference_cut([k for k, _ in out], shard)
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


def reference_checkpoint(model: dict[str, bytes], version: int = 3) -> bytes:
    """The KV checkpoint format written out from its documentation (`phalanx.apps.kv_checkpoint`):
    version 3 (what is written), or versions 1 and 2 (still loaded)."""
    pairs = sorted(model.items())
    if version == 3:
        out = [msgpack.packb(["phalanx.kv", 3])]
        values = dict(pairs)
        for keys in reference_cut([k for k, _ in pairs], SHARD_KEYS):
            kstr = "".join(keys)
            blob = b"".join(values[k] for k in keys)
            kpos = array("I", itertools.accumulate(map(len, keys), initial=0))
            offsets = array("I", itertools.accumulate((len(values[k]) for k in keys), initial=0))
            for a in (kpos, offsets):
                if sys.byteorder == "big":
                    a.byteswap()
            out.append(msgpack.packb([kstr, kpos.tobytes(), blob, offsets.tobytes()]))
        out.append(msgpack.packb(len(pairs)))
        return b"".join(out)
    header = ["phalanx.kv", 1, len(pairs)] if version == 1 else ["phalanx.kv", 2]
    out = [msgpack.packb(header)]
    for lo in range(0, len(pairs), 4096):
        out.append(msgpack.packb([x for pair in pairs[lo: lo + 4096] for x in pair]))
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
    for _ in snap.shards(window=1000, run=100, step=100):
        pass
    assert snap.folded is not None
    restored = machine._data._base.shards
    keys = [f"k{i:05d}" for i in range(40_000)]
    assert [shard.keys() for shard in restored] == reference_cut(keys, SHARD_KEYS)
    assert [shard.keys() for shard in snap.folded.shards] == reference_cut(keys, SHARD_KEYS)
    shards = [*restored, *snap.folded.shards]
    gc.collect()
    for shard in shards:
        referents = [r for r in gc.get_referents(shard) if not isinstance(r, type)
                     and r is not None and r is not shard.ckpt_digest]
        # the packed keys and their offsets, the key sample, the values and their offsets,
        # and the mean of the cut rule it follows (and the checkpoint digest, once known:
        # bytes, untracked)
        assert shard.ckpt_digest is None or not gc.is_tracked(shard.ckpt_digest)
        assert sorted(type(r).__name__ for r in referents) == [
            "array", "array", "bytes", "int", "str", "tuple"]
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
    old_sizes = [len(shard) for shard in old_shards]
    assert len(old_sizes) > 2
    for i in range(0, 40, 4):
        state.set(f"k{i:03d}", b"w")
    snap = state.snapshot()
    for _ in snap.shards(window=3, run=4, step=4, shard=8):
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
    assert sizes == [sum(old_sizes[:n]) for n in range(len(old_sizes), -1, -1)]
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
    for _ in snap.shards(window=3, run=4, step=4):
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


@pytest.mark.parametrize("change", ["update", "insert", "delete a cut key", "append"])
def test_a_fold_reuses_every_shard_a_change_does_not_reach(change: str) -> None:
    """Content-defined cuts: one changed key re-cuts its own shard (a deleted cut key also
    merges the next one in), and every other shard of the base comes out as the very same
    object, with no work per key."""
    model = {f"k{i:06d}": b"v%d" % i for i in range(0, 40_000, 2)}
    machine = KvStateMachine()
    machine.restore(reference_checkpoint(model))
    state = machine._data
    old = list(state._base.shards)
    assert len(old) > 10
    middle = old[len(old) // 2]
    if change == "update":
        key, value = middle.key_at(3), b"new"
    elif change == "insert":
        key = next(k for k in (middle.key_at(j)[:-1] + "1" for j in range(len(middle) - 1))
                   if zlib.crc32(k.encode()) % SHARD_KEYS)  # odd: not in the base, not a cut
        value = b"new"
    elif change == "delete a cut key":
        key, value = middle.key_at(len(middle) - 1), None
        assert zlib.crc32(key.encode()) % SHARD_KEYS == 0
    else:
        key, value = "zzz", b"new"
    if value is None:
        state.delete(key)
        del model[key]
    else:
        state.set(key, value)
        model[key] = value
    snap = state.snapshot()
    made = [piece for piece in snap.shards(window=100, run=64, step=64) if piece is not None]
    assert [p.keys() for p in made] == reference_cut(sorted(model), SHARD_KEYS)
    assert [v for p in made for v in p.values()] == [model[k] for k in sorted(model)]
    fresh = [p for p in made if not any(p is o for o in old)]
    assert len(fresh) == 1
    # A rewrite keeps the keys: the new shard shares them, only its values were spliced.
    assert (fresh[0].packed()[0] is middle.packed()[0]) == (change == "update")
    assert len(made) - len(fresh) == len(old) - (2 if change == "delete a cut key" else 1)
    assert snap.folded is not None
    assert snap.folded.shards == made


def test_a_shard_not_cut_by_the_packer_is_checked_once_then_reused_or_re_cut() -> None:
    """A checkpoint's shards (or shards built by hand) are not known to follow the rule: the
    first fold checks each one it would reuse, reuses those that follow it and re-cuts the
    others."""
    keys = [f"k{i:05d}" for i in range(3000)]
    canonical = reference_cut(keys, 3)
    # The rule's own shards, but built by hand; the same keys cut every 10 keys; and the
    # rule's shards with a full one (4 x 3 keys, no cut key) joined to the next: one shard
    # over the size limit whose only cut key is its last, still not the rule's.
    by_hand = SortedBase([dict.fromkeys(cut, b"v") for cut in canonical])
    wrong = SortedBase([dict.fromkeys(keys[lo:lo + 10], b"v") for lo in range(0, 3000, 10)])
    def is_cut(key: str) -> bool:
        return zlib.crc32(key.encode()) % 3 == 0

    full = next(j for j, cut in enumerate(canonical[:-2]) if len(cut) == 12 and not any(
        map(is_cut, cut)) and is_cut(canonical[j + 1][-1]))
    joined = SortedBase([*(dict.fromkeys(cut, b"v") for cut in canonical[:full]),
                         dict.fromkeys(canonical[full] + canonical[full + 1], b"v"),
                         *(dict.fromkeys(cut, b"v") for cut in canonical[full + 2:])])
    # A shard of `wrong` is reused only if it happens to be one of the rule's.
    by_chance = sum(shard.keys() in canonical[:-1] for shard in wrong.shards)
    assert by_chance < len(wrong.shards) // 2
    for base, reused in ((by_hand, len(canonical) - 1), (wrong, by_chance),
                         (joined, len(canonical) - 3)):
        assert all(shard.cut_by == 0 for shard in base.shards)
        state = LayeredState(base)
        state.set(canonical[-1][0], b"w")  # touches the last shard
        snap = state.snapshot()
        made = [p for p in snap.shards(window=4, run=4, step=4, shard=3) if p is not None]
        assert [p.keys() for p in made] == canonical
        assert sum(any(p is o for o in base.shards) for p in made) == reused
        assert all(p.cut_by == 3 for p in made)

"""`LayeredState`: a dict base under persistent overlays behaves exactly like one dict, its
snapshots never change, and folding only moves values between layers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_state import LayeredSnapshot, LayeredState, SortedBase
from phalanx.apps.kv_types import Delete, Put

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
            assert snap.length == len(want)
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

"""The packed base: it must read exactly like the dict it replaces, in every access path."""

from __future__ import annotations

import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.kv_base import PackedShard, ShardPacker, SortedBase

ITEMS = st.dictionaries(st.text(max_size=6), st.binary(max_size=40), max_size=80)


@settings(max_examples=150, deadline=None)
@given(items=ITEMS, shard_keys=st.integers(1, 9), probes=st.lists(st.text(max_size=6)),
       size=st.integers(1, 7))
def test_a_sorted_base_reads_like_a_dict(
    items: dict[str, bytes], shard_keys: int, probes: list[str], size: int
) -> None:
    base = SortedBase.from_items(items, shard_keys=shard_keys)
    ordered = sorted(items.items())
    assert len(base) == len(items)
    assert list(base.items()) == ordered
    for key in [*items, *probes]:
        assert base.get(key) == items.get(key)
    for start in [*probes, ""]:
        assert list(base.keys_from(start)) == [k for k, _ in ordered if k >= start]
    windows = list(base.windows(size))
    assert all(0 < len(keys) == len(values) <= size for keys, values in windows)
    assert [(k, v) for keys, values in windows for k, v in zip(keys, values, strict=True)
            ] == ordered


@settings(max_examples=100, deadline=None)
@given(items=ITEMS, piece=st.integers(1, 5), shard_keys=st.integers(1, 12))
def test_the_packer_cuts_an_ordered_stream_into_ordered_shards(
    items: dict[str, bytes], piece: int, shard_keys: int
) -> None:
    ordered = sorted(items.items())
    packer = ShardPacker(shard_keys)
    for lo in range(0, len(ordered), piece):
        cut = ordered[lo: lo + piece]
        packer.add([k for k, _ in cut], [v for _, v in cut])
    packer.flush()
    packer.flush()  # nothing pending: no empty shard
    assert all(0 < len(s) < shard_keys + piece for s in packer.shards)
    assert list(SortedBase(packer.shards).items()) == ordered


def test_a_shard_holds_values_without_an_object_apiece() -> None:
    keys = [f"k{i:06d}" for i in range(10_000)]
    values = [bytes([i % 251]) * 100 for i in range(10_000)]
    shard = PackedShard.pack(keys, values)
    assert shard.nbytes() == 100 * 10_000 + 8 * 10_001
    as_objects = sum(map(sys.getsizeof, values))
    # 108 bytes a key packed, against a 133-byte object (144 once the allocator rounds it)
    # plus a ~36-byte dict slot.
    assert shard.nbytes() < 0.82 * as_objects
    assert shard.values(10, 12) == values[10:12]
    assert shard.get("k000009") == values[9]
    assert shard.get("k0000091") is None


def test_bad_shards_are_refused() -> None:
    with pytest.raises(ValueError, match="offsets"):
        PackedShard(("a", "b"), b"xy", array("Q", [0, 1]))
    with pytest.raises(ValueError, match="offsets"):
        PackedShard(("a",), b"xy", array("Q", [0, 1]))
    with pytest.raises(ValueError, match="out of key order"):
        SortedBase([{"b": b""}, {"a": b""}])
    with pytest.raises(ValueError, match="shard_keys"):
        ShardPacker(0)


def test_a_packed_shard_key_tuple_is_untracked_at_once() -> None:
    """The writer packs shards between rare young GC passes; the packer untracks each key
    tuple itself so no later pass walks dozens of them at once."""
    import gc

    packer = ShardPacker(4)
    packer.add([f"k{i}" for i in range(5)], [b"v"] * 5)
    (shard,) = packer.shards
    assert not gc.is_tracked(shard.keys)

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


def test_a_shard_holds_keys_and_values_without_an_object_apiece() -> None:
    keys = [f"k{i:06d}" for i in range(10_000)]
    values = [bytes([i % 251]) * 100 for i in range(10_000)]
    shard = PackedShard.pack(keys, values)
    assert shard.nbytes() == 100 * 10_000 + 4 * 10_001 + 7 * 10_000 + 4 * 10_001
    as_objects = sum(map(sys.getsizeof, values)) + sum(map(sys.getsizeof, keys))
    # ~115 bytes a key packed, against a 133-byte value object (144 once the allocator rounds
    # it) and a 56-byte key object (64), before any dict or tuple slot.
    assert shard.nbytes() < 0.62 * as_objects
    assert shard.values(10, 12) == values[10:12]
    assert shard.keys(10, 12) == keys[10:12]
    assert shard.get("k000009") == values[9]
    assert shard.get("k0000091") is None
    assert shard.get("k009999") == values[-1]
    assert shard.get("k010000") is None
    assert shard.get("") is None


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(max_size=5), unique=True, max_size=70),
       probes=st.lists(st.text(max_size=5), max_size=20))
def test_a_shard_finds_keys_like_bisect_over_its_keys(keys: list[str], probes: list[str]) -> None:
    """Any text (non-ASCII, empty keys, NUL characters) and any size around the sample
    stride: the sample bisect plus the packed binary search is `bisect_left`."""
    import bisect

    keys.sort()
    values = [k.encode("utf-8", "surrogatepass") + b"!" for k in keys]
    shard = PackedShard.pack(keys, values)
    assert len(shard) == len(keys)
    assert shard.keys() == keys
    for probe in [*keys, *probes]:
        assert shard.index_from(probe) == bisect.bisect_left(keys, probe)
        expected = values[keys.index(probe)] if probe in keys else None
        assert shard.get(probe) == expected


def test_bad_shards_are_refused() -> None:
    with pytest.raises(ValueError, match="offsets"):
        PackedShard(("a", "b"), b"xy", array("I", [0, 1]))
    with pytest.raises(ValueError, match="offsets"):
        PackedShard(("a",), b"xy", array("Q", [0, 1]))
    with pytest.raises(ValueError, match="out of key order"):
        SortedBase([{"b": b""}, {"a": b""}])
    with pytest.raises(ValueError, match="shard_keys"):
        ShardPacker(0)


def test_a_packed_shard_holds_nothing_the_gc_tracks() -> None:
    """The writer packs shards between rare young GC passes; the packer untracks each
    shard's sample tuple itself so no later pass walks dozens of them at once."""
    import gc

    packer = ShardPacker(1000)
    packer.add([f"k{i:02d}" for i in range(40)], [b"v"] * 40)
    packer.flush()
    (shard,) = packer.shards
    held = [r for r in gc.get_referents(shard) if not isinstance(r, type)]
    assert any(isinstance(r, tuple) for r in held)  # the sample
    # Arrays are GC-tracked, but a pass visits nothing through them but their type.
    assert not any(gc.is_tracked(r) for r in held if not isinstance(r, array))

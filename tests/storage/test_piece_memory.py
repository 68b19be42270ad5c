"""Checkpoint pieces kept in memory (`phalanx.storage.piece_memory`): a store with a budget
serves its peers' piece ranges from memory, not its packs; stays within the budget keeping the
newest checkpoint's pieces; forgets what it collected; fills memory when it loads; and a node's
budget comes from `PHALANX_PIECE_MEMORY_MB`.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.interface import StorageError
from phalanx.storage.memory import MemoryDirectory
from phalanx.storage.piece_memory import PieceMemory
from phalanx.storage.volatile import PIECE_MEMORY_ENV, PIECE_MEMORY_MB, piece_memory_bytes


class Shard:
    __slots__ = ("digest", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.digest = hashlib.sha256(raw).digest()

    def data(self) -> bytes:
        return self.raw


class CountingDirectory(MemoryDirectory):
    """Counts reads of pack files (what serving from memory avoids)."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.pack_reads = 0

    def read_at(self, name: str, offset: int, length: int) -> bytes:
        if name.startswith("ckpack-"):
            self.pack_reads += 1
        return super().read_at(name, offset, length)


def shards(n: int, seed: int, size: int = 2000) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


def save(store: FileCheckpointStore, index: int, raws: list[bytes]) -> None:
    store.save_stream(index, b"meta", [b"head", *map(Shard, raws), b"tail"])


@pytest.mark.parametrize("budget", [1 << 20, 0])
def test_ranges_are_served_from_memory_without_reading_the_packs(budget: int) -> None:
    directory = CountingDirectory("served")
    store = FileCheckpointStore(directory, keep=2, memory_bytes=budget)
    raws = shards(20, seed=1)
    save(store, 5, raws)
    directory.pack_reads = 0
    for raw in raws:
        digest = hashlib.sha256(raw).digest()
        assert store.read_piece_range(digest, 100, 500) == raw[100:600]
        assert store.read_piece(digest) == raw
    if budget:  # every piece from memory
        assert directory.pack_reads == 0
        assert store.memory.hits == 40
        assert store.memory.hit_bytes == 20 * 500
    else:  # the control: from the packs
        assert directory.pack_reads == 40
        assert len(store.memory) == 0


def test_memory_stays_within_its_budget_keeping_the_newest_checkpoints_pieces() -> None:
    store = FileCheckpointStore(MemoryDirectory("budget"), keep=3, memory_bytes=30 * 2000)
    old, new = shards(40, seed=2), shards(25, seed=3)
    save(store, 1, old)
    assert store.memory.size <= 30 * 2000
    save(store, 2, old[-5:] + new)  # reuses 5 old pieces: used again, so kept
    assert store.memory.size <= 30 * 2000
    newest = {hashlib.sha256(r).digest() for r in old[-5:] + new}
    assert all(d in store.memory for d in newest)
    assert not any(hashlib.sha256(r).digest() in store.memory for r in old[:-5])


def test_collected_pieces_leave_memory_and_are_not_served() -> None:
    store = FileCheckpointStore(MemoryDirectory("collect"), keep=1, memory_bytes=1 << 20)
    first, second = shards(10, seed=4), shards(10, seed=5)
    save(store, 1, first)
    save(store, 2, second)  # keep=1: checkpoint 1 and its pieces are collected
    gone = hashlib.sha256(first[0]).digest()
    assert gone not in store.memory
    assert all(hashlib.sha256(r).digest() in store.memory for r in second)
    with pytest.raises(StorageError, match="not held"):
        store.read_piece_range(gone, 0, 10)


def test_a_reopened_store_fills_memory_when_it_loads() -> None:
    directory = CountingDirectory("reload")
    raws = shards(12, seed=6)
    save(FileCheckpointStore(directory, memory_bytes=0), 3, raws)
    reopened = FileCheckpointStore(directory, memory_bytes=1 << 20)
    loaded = reopened.load_latest().checkpoint
    assert loaded is not None
    assert loaded.data == b"head" + b"".join(raws) + b"tail"
    reopened.lacks([])  # reads its catalogue (the groups) from the packs
    directory.pack_reads = 0
    digest = hashlib.sha256(raws[7]).digest()
    assert reopened.read_piece_range(digest, 0, 2000) == raws[7]
    assert directory.pack_reads == 0


def test_a_piece_larger_than_the_budget_is_not_held_and_the_budget_is_checked() -> None:
    memory = PieceMemory(100)
    memory.put(b"a" * 32, bytes(101))
    memory.put(b"b" * 32, bytes(60))
    memory.put(b"c" * 32, bytes(60))  # evicts b
    assert len(memory) == 1
    assert memory.size == 60
    assert b"c" * 32 in memory
    memory.keep_only(set())
    assert len(memory) == 0
    assert memory.size == 0
    with pytest.raises(ValueError, match=">= 0"):
        PieceMemory(-1)


def test_a_nodes_budget_comes_from_the_environment() -> None:
    assert piece_memory_bytes({}) == PIECE_MEMORY_MB << 20
    assert piece_memory_bytes({PIECE_MEMORY_ENV: "0"}) == 0
    assert piece_memory_bytes({PIECE_MEMORY_ENV: " 16 "}) == 16 << 20
    with pytest.raises(ValueError, match=f"{PIECE_MEMORY_ENV}='lots'"):
        piece_memory_bytes({PIECE_MEMORY_ENV: "lots"})

"""Checkpoint format v3 (content-addressed pieces in packs under a manifest): a save writes only
the pieces the store does not hold, packs no retained checkpoint needs are collected, every
damage (torn piece, flipped bit in a piece or in the manifest, a missing pack) is detected and
the previous checkpoint loads, crashes at every step leave the old or the new checkpoint, and
checkpoints written by the previous formats (v1, v2) still load.
"""

from __future__ import annotations

import gc
import hashlib
import pathlib
import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.storage.checkpoint import (
    MAX_SMALL_PACKS,
    FileCheckpointStore,
    checkpoint_name,
    encode_header,
)
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import StorageError, StoredCheckpoint
from phalanx.storage.memory import MemoryDirectory, SimulatedCrash
from phalanx.storage.packs import (
    GROUP_MAX,
    PACK_PREFIX,
    PIECE_BYTES,
    REF_SIZE,
    decode_manifest,
    pack_name,
    parse_pack_name,
    pieces_of,
    resolve,
)


@dataclass(frozen=True)
class Shard:
    """A piece as an app hands it: known by its digest; counts how often its bytes are made."""

    raw: bytes
    made: list[int]

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.raw).digest()

    def data(self) -> bytes:
        self.made.append(1)
        return self.raw


def shards(n: int, *, size: int = 3000, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


def stream(raws: list[bytes], made: list[int], index: int) -> list[bytes | Shard]:
    """A checkpoint stream like the replica's: a small header that changes every time, the
    shards as pieces, a trailer."""
    return [b"header %d" % index, *(Shard(r, made) for r in raws), b"count"]


def data_of(raws: list[bytes], index: int) -> bytes:
    return b"header %d" % index + b"".join(raws) + b"count"


def packs(directory: MemoryDirectory) -> list[str]:
    return [n for n in directory.list() if n.startswith(PACK_PREFIX)]


def used_packs(directory: MemoryDirectory, index: int) -> set[str]:
    manifest = decode_manifest(directory.read(checkpoint_name(index)))
    assert not isinstance(manifest, str)
    refs = resolve(directory, manifest)
    assert not isinstance(refs, str)
    return {pack_name(r.pack) for r in [*refs, *manifest.groups]}


def test_a_save_writes_only_the_pieces_the_store_lacks() -> None:
    directory = MemoryDirectory("d")
    store = FileCheckpointStore(directory, keep=2)
    raws = shards(200)
    made: list[int] = []
    assert store.save_stream(1, b"m1", stream(raws, made, 1)) == len(data_of(raws, 1))
    assert store.stats.new_pieces == 202
    assert len(made) == 200
    raws[57] = b"changed" + raws[57][7:]
    made.clear()
    store.save_stream(2, b"m2", stream(raws, made, 2))
    assert len(made) == 1  # only the changed shard's bytes were even made
    assert store.stats.reused_pieces == 199 + 1  # the unchanged shards and the trailer
    # the shard, the header, the groups around them and the manifest: a fraction of the data
    assert store.stats.written < 3000 + 2 * GROUP_MAX * REF_SIZE + 1000
    loaded = store.load_latest()
    assert loaded.problems == ()
    assert loaded.checkpoint == StoredCheckpoint(2, data_of(raws, 2), b"m2")
    assert store.read_view(2)[:] == data_of(raws, 2)
    assert store.read_view(2)[2990:9010] == data_of(raws, 2)[2990:9010]


def test_unreferenced_packs_are_collected_but_a_live_view_keeps_its_own() -> None:
    directory = MemoryDirectory("d")
    store = FileCheckpointStore(directory, keep=1)
    made: list[int] = []
    store.save_stream(1, b"", stream(shards(50, seed=1), made, 1))
    view = store.read_view(1)
    store.save_stream(2, b"", stream(shards(50, seed=2), made, 2))  # nothing shared
    assert store.indexes() == [2]
    assert len(packs(directory)) == 2  # checkpoint 1's pack lives on for the view
    assert view[:] == data_of(shards(50, seed=1), 1)
    del view
    gc.collect()
    store.save_stream(3, b"", stream(shards(50, seed=2), made, 3))
    assert len(packs(directory)) == 2  # checkpoint 2's pack (shared) and 3's (its header)
    assert store.load_latest().checkpoint == StoredCheckpoint(3, data_of(shards(50, seed=2), 3))


def test_a_sparse_pack_is_copied_forward_then_collected() -> None:
    directory = MemoryDirectory("d")
    store = FileCheckpointStore(directory, keep=1)
    raws = shards(40)
    made: list[int] = []
    store.save_stream(1, b"", stream(raws, made, 1))
    first = min(p for p in map(parse_pack_name, directory.list()) if p is not None)
    for i in range(31):  # rewrite 31 of 40 shards: the first pack is under 1/4 used
        raws[i] = bytes(3000 - 1) + bytes([i + 1])
        store.save_stream(2 + i, b"", stream(raws, made, 2 + i))
    store.save_stream(40, b"", stream(raws, made, 40))  # copies the 9 left out of it
    store.save_stream(41, b"", stream(raws, made, 41))
    assert first not in {parse_pack_name(n) for n in directory.list()}
    assert store.load_latest().checkpoint == StoredCheckpoint(41, data_of(raws, 41))


def _two_checkpoints() -> tuple[MemoryDirectory, FileCheckpointStore, list[bytes], str]:
    """Checkpoint 1, then checkpoint 2 with one shard of its own; returns the directory, the
    store, checkpoint 2's shards and the pack only checkpoint 2 uses."""
    directory = MemoryDirectory("d")
    store = FileCheckpointStore(directory, keep=3)
    raws = shards(100)
    made: list[int] = []
    store.save_stream(1, b"m1", stream(raws, made, 1))
    before = set(packs(directory))
    changed = list(raws)
    changed[10] = b"only in checkpoint 2".ljust(3000, b".")
    store.save_stream(2, b"m2", stream(changed, made, 2))
    (newest,) = set(packs(directory)) - before
    return directory, store, raws, newest


def _flip(directory: MemoryDirectory, name: str, offset: int) -> None:
    raw = bytearray(directory.read(name))
    raw[offset] ^= 0x10
    directory.create(name)
    directory.append(name, bytes(raw))


def _cut(directory: MemoryDirectory, name: str, length: int) -> None:
    directory.tear(name, length)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        # a torn shard: the pack ends inside the changed shard (its first piece)
        (lambda d, pack: _cut(d, pack, 100), "ends inside a piece"),
        # a flipped bit inside that shard
        (lambda d, pack: _flip(d, pack, 50), "fails its SHA-256"),
        # a flipped bit in a group (the last piece of the pack)
        (lambda d, pack: _flip(d, pack, d.size(pack) - 1), "fails its SHA-256"),
        # a flipped bit in the manifest, and a manifest cut short
        (lambda d, pack: _flip(d, checkpoint_name(2), 30), "manifest checksum mismatch"),
        (lambda d, pack: _cut(d, checkpoint_name(2), 80), "no end marker"),
        # a missing pack
        (lambda d, pack: d.remove(pack), "unreadable"),
    ],
    ids=["torn-shard", "flipped-shard", "flipped-group", "flipped-manifest", "torn-manifest",
         "missing-pack"],
)
def test_damage_is_detected_and_the_previous_checkpoint_loads(damage: object,
                                                               problem: str) -> None:
    directory, _store, raws, newest = _two_checkpoints()
    assert callable(damage)
    damage(directory, newest)
    reopened = FileCheckpointStore(directory, keep=3)
    loaded = reopened.load_latest()
    assert loaded.checkpoint == StoredCheckpoint(1, data_of(raws, 1), b"m1")
    assert len(loaded.problems) == 1
    assert problem in loaded.problems[0]
    assert checkpoint_name(2) in loaded.problems[0]
    # the next save does not reuse anything of the damaged checkpoint, and loads
    made: list[int] = []
    reopened.save_stream(3, b"m3", stream(raws, made, 3))
    assert reopened.load_latest().checkpoint == StoredCheckpoint(3, data_of(raws, 3), b"m3")


def test_previous_formats_still_load_beside_v3() -> None:
    directory = MemoryDirectory("d")
    v1 = StoredCheckpoint(1, b"written by version 1", b"meta 1")
    directory.create(checkpoint_name(1))
    directory.append(checkpoint_name(1), encode_header(v1) + v1.meta + v1.data)
    old = FileCheckpointStore(directory, keep=3, layout=2)  # the previous writer path
    old.save_stream(2, b"meta 2", iter([b"written by ", b"version 2"]))
    store = FileCheckpointStore(directory, keep=3)
    assert store.load_latest().checkpoint == StoredCheckpoint(2, b"written by version 2",
                                                              b"meta 2")
    assert store.read_view(1)[:] == v1.data
    made: list[int] = []
    store.save_stream(3, b"meta 3", stream(shards(5), made, 3))
    store.save_stream(4, b"meta 4", stream(shards(5), made, 4))
    assert store.indexes() == [2, 3, 4]
    assert store.read_view(2)[:] == b"written by version 2"
    directory.remove(checkpoint_name(4))
    directory.remove(checkpoint_name(3))
    assert store.load_latest().checkpoint == StoredCheckpoint(2, b"written by version 2",
                                                              b"meta 2")


def test_a_crash_at_any_step_leaves_the_old_or_the_new_checkpoint() -> None:
    raws = shards(80, size=500)
    changed = list(raws)
    changed[3] = bytes(500)
    changed.append(b"a new last shard")
    rng = random.Random(7)
    step = 0
    while True:
        directory = MemoryDirectory("c")
        store = FileCheckpointStore(directory, keep=1)
        made: list[int] = []
        store.save_stream(1, b"", stream(raws, made, 1))
        directory.crash_after(step)
        try:
            store.save_stream(2, b"", stream(changed, made, 2))
            finished = True
        except SimulatedCrash:
            finished = False
        directory.crash_after(None)
        directory.crash(rng)
        reopened = FileCheckpointStore(directory, keep=1)
        loaded = reopened.load_latest()
        assert loaded.problems == (), (step, loaded.problems)
        assert loaded.checkpoint in (StoredCheckpoint(1, data_of(raws, 1)),
                                     StoredCheckpoint(2, data_of(changed, 2))), step
        reopened.save_stream(3, b"", stream(changed, made, 3))  # collects the strays
        assert reopened.load_latest().checkpoint == StoredCheckpoint(3, data_of(changed, 3))
        assert set(packs(directory)) == used_packs(directory, 3)  # the strays are gone
        if finished:
            break
        step += 1
    assert step > 5


def test_plain_bytes_are_cut_into_pieces_whatever_the_chunking() -> None:
    data = random.Random(3).randbytes(3 * PIECE_BYTES + 123)
    for cuts in ([data], [data[:10], data[10:PIECE_BYTES + 5], data[PIECE_BYTES + 5:]]):
        pieces = [p for p in pieces_of(cuts) if p is not None]
        assert [len(p.data()) for p in pieces] == [PIECE_BYTES] * 3 + [123]
        assert b"".join(p.data() for p in pieces) == data


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=30), min_size=1, max_size=6))
def test_any_sequence_of_saves_loads_the_last_and_keeps_only_what_it_needs(
        states: list[list[int]]) -> None:
    directory = MemoryDirectory("h")
    store = FileCheckpointStore(directory, keep=2)
    made: list[int] = []
    for index, state in enumerate(states, 1):
        raws = [bytes([v]) * (100 + v) for v in state]
        store.save_stream(index, b"", stream(raws, made, index))
        assert store.load_latest().checkpoint == StoredCheckpoint(index, data_of(raws, index))
        # no garbage: every pack left is one a retained checkpoint uses
        assert set(packs(directory)) == set().union(
            *(used_packs(directory, i) for i in store.indexes()))


def test_the_small_packs_of_many_small_saves_merge() -> None:
    directory = MemoryDirectory("m")
    store = FileCheckpointStore(directory, keep=1)
    raws = shards(100, size=200)
    made: list[int] = []
    for index in range(1, 90):  # each save rewrites one shard: one small pack each
        raws[index % 100] = bytes(199) + bytes([index % 256])
        store.save_stream(index, b"", stream(raws, made, index))
    assert len(packs(directory)) <= MAX_SMALL_PACKS + 2
    assert store.load_latest().checkpoint == StoredCheckpoint(89, data_of(raws, 89))


def test_real_files_keep_no_descriptor_per_pack(tmp_path: pathlib.Path) -> None:
    directory = OsDirectory(str(tmp_path))
    store = FileCheckpointStore(directory, keep=2)
    made: list[int] = []
    for index in range(1, 6):
        store.save_stream(index, b"", stream(shards(20, seed=index), made, index))
    assert not [n for n in directory._fds if n.startswith(PACK_PREFIX)]
    assert FileCheckpointStore(OsDirectory(str(tmp_path))).load_latest().checkpoint == (
        StoredCheckpoint(5, data_of(shards(20, seed=5), 5)))


@dataclass(frozen=True)
class Fetched:
    """A piece a follower assembles a checkpoint from: its own copy if it holds one, else the
    bytes fetched from the leader (counted), each checked against its digest."""

    digest: bytes
    own: FileCheckpointStore
    fetched: dict[bytes, bytes]

    def data(self) -> bytes:
        raw = self.fetched.get(self.digest)
        if raw is None:
            return self.own.read_piece(self.digest)
        assert hashlib.sha256(raw).digest() == self.digest
        return raw


def test_a_follower_assembles_the_leaders_checkpoint_from_the_pieces_it_lacks() -> None:
    made: list[int] = []
    raws = shards(300, size=1000)
    leader = FileCheckpointStore(MemoryDirectory("leader"), keep=2)
    follower = FileCheckpointStore(MemoryDirectory("follower"), keep=2)
    follower.save_stream(5, b"f", stream(raws, made, 5))
    changed = list(raws)
    for i in (3, 150, 151):  # the follower missed writes to 1% of the shards
        changed[i] = bytes(1000)[: 999] + bytes([i % 256])
    leader.save_stream(4, b"l", stream(raws, made, 4))
    leader.save_stream(9, b"meta 9", stream(changed, made, 9))
    meta, pieces = leader.piece_list(9)
    missing = follower.lacks(d for d, _ in pieces)
    fetched = {d: leader.read_piece(d) for d in missing}
    follower.save_stream(9, meta, [Fetched(d, follower, fetched) for d, _ in pieces])
    assert follower.load_latest().checkpoint == StoredCheckpoint(9, data_of(changed, 9), b"meta 9")
    sent = sum(map(len, fetched.values()))
    assert sent < 5 * 1000  # three shards and the header, not the 300 KB state
    with pytest.raises(StorageError, match="not held"):
        follower.read_piece(bytes(32))


def test_two_store_objects_on_one_directory_never_reuse_a_collected_piece() -> None:
    directory = MemoryDirectory("two")
    made: list[int] = []
    first = FileCheckpointStore(directory, keep=1)
    first.save_stream(1, b"", stream(shards(30, seed=1), made, 1))
    second = FileCheckpointStore(directory, keep=1)  # e.g. reopened after a restart
    second.save_stream(2, b"", stream(shards(30, seed=2), made, 2))  # collects 1's pack
    second.save_stream(3, b"", stream(shards(30, seed=3), made, 3))
    first.save_stream(4, b"", stream(shards(30, seed=1), made, 4))  # its catalogue is stale
    assert first.load_latest().checkpoint == StoredCheckpoint(4, data_of(shards(30, seed=1), 4))
    assert set(packs(directory)) == used_packs(directory, 4)

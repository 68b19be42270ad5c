"""Hard state and checkpoints: atomic replacement, checksums, keep-K, and crashes at every
file-system step of a save (memory backend), plus the same behaviour on real files."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

from phalanx.storage.checkpoint import checkpoint_name
from phalanx.storage.files import open_file_storage
from phalanx.storage.hardstate import HARD_STATE_NAME
from phalanx.storage.interface import CorruptionError, StoredCheckpoint
from phalanx.storage.memory import MemoryDisk, SimulatedCrash


def test_hard_state_roundtrip_and_corruption() -> None:
    disk = MemoryDisk()
    hs = disk.hard_state()
    assert hs.load() is None
    hs.save(b"term=3")
    hs.save(b"term=4")
    assert disk.hard_state().load() == b"term=4"
    flip = disk.flip_bit(random.Random(0), HARD_STATE_NAME)
    assert flip is not None
    with pytest.raises(CorruptionError) as info:
        disk.hard_state().load()
    assert info.value.path == disk.directory.path(HARD_STATE_NAME)


@pytest.mark.parametrize("step", range(6))
def test_hard_state_crash_at_every_step_keeps_old_or_new(step: int) -> None:
    seen = set()
    for seed in range(8):
        disk = MemoryDisk()
        disk.hard_state().save(b"old")
        disk.directory.crash_after(step)
        with contextlib.suppress(SimulatedCrash):
            disk.hard_state().save(b"new")
        disk.directory.crash_after(None)
        disk.crash(random.Random(seed))
        value = disk.hard_state().load()
        assert value in (b"old", b"new")
        seen.add(value)
    if step >= 5:  # the save completed (4 steps) before the crash was due
        assert seen == {b"new"}


def test_checkpoints_keep_newest_k_and_replace_same_index() -> None:
    store = MemoryDisk(keep_checkpoints=2).checkpoints()
    assert store.load_latest().checkpoint is None
    for i in (5, 10, 15):
        store.save(StoredCheckpoint(index=i, data=b"d%d" % i, meta=b"m"))
    assert store.indexes() == [10, 15]
    store.save(StoredCheckpoint(index=15, data=b"again"))
    assert store.load_latest() == (type(store.load_latest()))(
        checkpoint=StoredCheckpoint(index=15, data=b"again"), problems=())


def test_corrupt_newest_checkpoint_is_reported_and_older_loaded() -> None:
    disk = MemoryDisk(keep_checkpoints=3)
    store = disk.checkpoints()
    for i in (1, 2, 3):
        store.save(StoredCheckpoint(index=i, data=b"state%d" % i * 20, meta=b"meta"))
    disk.flip_bit(random.Random(1), checkpoint_name(3))
    loaded = store.load_latest()
    assert loaded.checkpoint == StoredCheckpoint(index=2, data=b"state2" * 20, meta=b"meta")
    assert len(loaded.problems) == 1
    assert checkpoint_name(3) in loaded.problems[0]
    disk.directory.tear(checkpoint_name(2), 10)
    disk.directory.tear(checkpoint_name(1), 0)
    loaded = store.load_latest()
    assert loaded.checkpoint is None
    assert len(loaded.problems) == 3


@pytest.mark.parametrize("step", range(8))
def test_checkpoint_crash_at_every_step(step: int) -> None:
    for seed in range(6):
        disk = MemoryDisk(keep_checkpoints=1)
        disk.checkpoints().save(StoredCheckpoint(index=1, data=b"one"))
        disk.directory.crash_after(step)
        with contextlib.suppress(SimulatedCrash):
            disk.checkpoints().save(StoredCheckpoint(index=2, data=b"two"))
        disk.directory.crash_after(None)
        disk.crash(random.Random(seed))
        loaded = disk.checkpoints().load_latest()
        assert loaded.problems == ()
        assert loaded.checkpoint in (StoredCheckpoint(index=1, data=b"one"),
                                     StoredCheckpoint(index=2, data=b"two"))
        disk.checkpoints().save(StoredCheckpoint(index=3, data=b"three"))  # cleans stray temp files
        assert [n for n in disk.directory.list() if n.endswith(".tmp")] == []


def test_file_storage_hard_state_and_checkpoints(tmp_path: Path) -> None:
    st = open_file_storage(str(tmp_path), keep_checkpoints=2)
    st.hard_state.save(b"hs")
    for i in (1, 2, 3):
        st.checkpoints.save(StoredCheckpoint(index=i, data=b"x" * i, meta=b"m"))
    st.close()
    (tmp_path / "checkpoint-00000000000000000009.ckpt.tmp").write_bytes(b"partial")
    again = open_file_storage(str(tmp_path), keep_checkpoints=2)
    assert again.hard_state.load() == b"hs"
    assert again.checkpoints.indexes() == [2, 3]
    assert again.checkpoints.load_latest().checkpoint == StoredCheckpoint(index=3, data=b"xxx",
                                                                    meta=b"m")
    path = tmp_path / checkpoint_name(3)
    raw = bytearray(path.read_bytes())
    raw[-21] ^= 4  # in the manifest's last reference: its CRC and end mark (12 bytes) follow
    path.write_bytes(bytes(raw))
    loaded = again.checkpoints.load_latest()
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.index == 2
    assert loaded.problems == (f"{path}: manifest checksum mismatch",)
    again.close()

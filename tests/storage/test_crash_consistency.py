"""Crash-consistency properties of the WAL, hard state and checkpoints, on both backends.

Random sequences of append / sync / truncate / compact / checkpoint / hard-state saves, then a
crash (memory: lazyfs-style loss of un-fsynced writes and directory operations, optionally in
the middle of an operation; files: real files cut at random offsets past their last fsync),
optionally after a bit flip. After recovery:
- the first index is the compaction point (old or new if the compaction was in flight);
- every record returned was written at that index (nothing corrupt is ever returned);
- every record synced before the crash, and not truncated since, is present and intact;
- with no truncation since the last sync, the recovered log is a prefix of the written one;
- hard state and the newest checkpoint are the last saved (or, if in flight, the previous);
- a process that dies without a power loss (`restart`, `process_dies_during`) and restarts
  makes durable what it read: a later power loss keeps all of it;
- after a bit flip, recovery either raises `CorruptionError` naming the flipped file (then
  `repair_wal` restores a clean prefix) or satisfies all of the above: never silent loss.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from typing import Protocol

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import Directory, OsDirectory
from phalanx.storage.files import Storage
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import CorruptionError, StoredCheckpoint
from phalanx.storage.memory import MemoryDisk, SimulatedCrash
from phalanx.storage.repair import repair_wal
from phalanx.storage.wal import META_NAME, Wal, parse_segment_name

SEGMENT_BYTES = 160
KEEP = 2
payloads = st.binary(max_size=48)


class TrackingOsDirectory(OsDirectory):
    """Real files that remember each file's size at its last fsync, so a test can cut files
    back to any length a power failure allows. fsync itself is skipped (the cut emulates the
    loss, and skipping keeps the test fast); `tests/storage/test_os_directory.py` covers the
    real call."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.durable: dict[str, int] = {n: self.size(n) for n in self.list()}

    def create(self, name: str) -> None:
        super().create(name)
        self.durable[name] = 0

    def truncate(self, name: str, length: int) -> None:
        super().truncate(name, length)
        self.durable[name] = min(self.durable.get(name, 0), length)

    def fsync(self, name: str) -> None:
        self.durable[name] = self.size(name)

    def fsync_dir(self) -> None:
        pass

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self.durable[dst] = self.durable.pop(src, 0)

    def remove(self, name: str) -> None:
        super().remove(name)
        self.durable.pop(name, None)

    def power_cut(self, rng: random.Random) -> None:
        self.close()
        for name in self.list():
            size = self.size(name)
            cut = rng.randint(min(self.durable.get(name, 0), size), size)
            os.truncate(self.path(name), cut)
        self.durable = {n: self.size(n) for n in self.list()}


def _is_wal_file(name: str) -> bool:
    return name == META_NAME or parse_segment_name(name) is not None


class _Base(RuleBasedStateMachine):
    """The model and the rules; subclasses provide the backend."""

    directory: Directory

    def __init__(self, backend: _Backend) -> None:
        self.backend = backend
        self.directory = backend.directory
        super().__init__()
        self.compacted = 0
        self.compacted_alts = {0}
        self.last = 0
        self.log: dict[int, bytes] = {}  # index -> payload, compaction does not delete
        self.synced: dict[int, bytes] = {}
        self.t_min: float = math.inf
        self.written: dict[int, set[bytes]] = {}
        self.hard_state: set[bytes | None] = {None}
        self.ckpt: set[StoredCheckpoint | None] = {None}
        self.storage = backend.open()

    # -- operations on storage and model --------------------------------------------------------
    def _append(self, batch: list[bytes]) -> None:
        records = [(self.last + 1 + k, p) for k, p in enumerate(batch)]
        for i, p in records:
            self.log[i] = p
            self.written.setdefault(i, set()).add(p)
        self.last += len(records)
        self.storage.wal.append_many(records)

    def _sync(self) -> None:
        self.storage.wal.sync()
        self.synced = {i: self.log[i] for i in range(self.compacted + 1, self.last + 1)}
        self.t_min = math.inf

    def _truncate(self, from_index: int) -> None:
        for i in range(from_index, self.last + 1):
            del self.log[i]
        self.last = min(self.last, from_index - 1)
        self.t_min = min(self.t_min, from_index)
        self.storage.wal.truncate_suffix(from_index)

    def _compact(self, upto: int) -> None:
        self.compacted_alts = {self.compacted, upto}
        self.compacted = upto
        self.last = max(self.last, upto)
        self.storage.wal.compact_prefix(upto)
        self.compacted_alts = {upto}

    def _save_ckpt(self, cp: StoredCheckpoint) -> None:
        newest = max(self.ckpt, key=lambda c: -1 if c is None else c.index)
        self.ckpt = {newest, cp} if newest is None or cp.index >= newest.index else {newest}
        self.storage.checkpoints.save(cp)
        self.ckpt = {cp} if newest is None or cp.index >= newest.index else {newest}

    def _save_hard_state(self, value: bytes) -> None:
        self.hard_state = {*self.hard_state, value}
        self.storage.hard_state.save(value)
        self.hard_state = {value}

    # -- rules -----------------------------------------------------------------------------
    @rule(batch=st.lists(payloads, min_size=1, max_size=5))
    def append(self, batch: list[bytes]) -> None:
        self._append(batch)

    @rule()
    def sync(self) -> None:
        self._sync()

    @precondition(lambda self: self.last > self.compacted)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        self._truncate(data.draw(st.integers(self.compacted + 1, self.last)))

    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        self._compact(data.draw(st.integers(self.compacted + 1, self.last + 2)))

    @rule(delta=st.integers(-2, 1), blob=st.binary(max_size=24))
    def checkpoint(self, delta: int, blob: bytes) -> None:
        self._save_ckpt(StoredCheckpoint(index=max(0, self.last + delta), data=blob, meta=b"m"))

    @rule(value=st.binary(max_size=16))
    def save_hard_state(self, value: bytes) -> None:
        self._save_hard_state(value)

    @rule(seed=st.integers(0, 2**32))
    def crash(self, seed: int) -> None:
        self.storage.close()
        self.backend.power_cut(random.Random(seed))
        self.recover_and_check()

    @rule()
    def restart(self) -> None:
        """The process dies (the machine does not: every write stays readable) and starts
        again. What the new process reads becomes the model's durable state, so a later
        power loss checks that recovery made it durable (issue 15 item 5)."""
        self.storage.close()
        self.recover_and_check()

    @rule(seed=st.integers(0, 2**32))
    def flip_then_crash(self, seed: int) -> None:
        rng = random.Random(seed)
        self.storage.close()
        flipped = self.backend.flip(rng)
        self.backend.power_cut(rng)
        error: CorruptionError | None = None
        try:
            self.recover_and_check()
        except CorruptionError as e:
            error = e
        if error is not None:
            assert flipped is not None
            assert error.path == self.directory.path(flipped), (error.path, flipped)
            report = repair_wal(self.directory)
            assert report.changed
            self.recover_and_check(lost_from=report.lost_from_index,
                                   meta_reset=report.meta_reset is not None)

    @invariant()
    def log_reads_back(self) -> None:
        wal = self.storage.wal
        assert (wal.first_index(), wal.last_index()) == (self.compacted + 1, self.last)
        got = wal.read(self.compacted + 1, self.last + 1)
        assert got == [self.log[i] for i in range(self.compacted + 1, self.last + 1)]

    # -- the oracle ------------------------------------------------------------------------
    def recover_and_check(self, *, lost_from: int | None = None, meta_reset: bool = False
                          ) -> None:
        self.storage = storage = self.backend.open()
        wal = storage.wal
        first, last = wal.first_index(), wal.last_index()
        if not meta_reset:
            assert first - 1 in self.compacted_alts, (first, self.compacted_alts)
        got = dict(zip(range(first, last + 1), wal.read(first, last + 1), strict=True))
        floor = min(self.compacted_alts) + 1  # a reset meta file may expose older records
        for i, p in got.items():
            assert p in self.written.get(i, set()), f"index {i}: never-written payload"
            if floor <= i < self.t_min and lost_from is None:
                assert self.log.get(i) == p, f"index {i}: not a prefix of the written log"
        limit = self.t_min if lost_from is None else min(self.t_min, lost_from)
        for i, p in self.synced.items():
            if max(first, floor) <= i < limit:
                assert got.get(i) == p, f"synced index {i} lost or changed"
        assert storage.hard_state.load() in self.hard_state
        loaded = storage.checkpoints.load_latest()
        assert loaded.problems == ()
        assert loaded.checkpoint in self.ckpt
        # The recovered state is durable now: it is the new model.
        self.compacted = first - 1
        self.compacted_alts = {self.compacted}
        self.last = last
        self.log = got
        self.synced = dict(got)
        self.t_min = math.inf
        self.hard_state = {storage.hard_state.load()}
        self.ckpt = {loaded.checkpoint}

    def teardown(self) -> None:
        self.storage.close()
        self.backend.close()


class _Backend(Protocol):
    directory: Directory

    def open(self) -> Storage: ...

    def power_cut(self, rng: random.Random) -> None: ...

    def flip(self, rng: random.Random) -> str | None: ...

    def close(self) -> None: ...


class _MemoryBackend:
    def __init__(self) -> None:
        self.disk = MemoryDisk("n1", segment_bytes=SEGMENT_BYTES, keep_checkpoints=KEEP)
        self.directory = self.disk.directory

    def open(self) -> Storage:
        return self.disk.open()

    def power_cut(self, rng: random.Random) -> None:
        self.disk.crash(rng)

    def flip(self, rng: random.Random) -> str | None:
        names = [n for n in self.directory.list()
                 if _is_wal_file(n) and self.directory.size(n) > 0]
        if not names:
            return None
        flip = self.disk.flip_bit(rng, rng.choice(names))
        return None if flip is None else flip.name

    def close(self) -> None:
        pass


class MemoryMachine(_Base):
    def __init__(self) -> None:
        self.disk_backend = _MemoryBackend()
        self.disk = self.disk_backend.disk
        super().__init__(self.disk_backend)

    @rule(op=st.sampled_from(["append", "sync", "truncate", "compact", "checkpoint",
                              "hard_state"]),
          countdown=st.integers(0, 6), seed=st.integers(0, 2**32), blob=payloads)
    def crash_during(self, op: str, countdown: int, seed: int, blob: bytes) -> None:
        """Die inside an operation, at any of its file-system steps."""
        self._die_during(op, countdown, seed, blob, power_cut=True)

    @rule(op=st.sampled_from(["append", "sync", "truncate", "compact", "checkpoint",
                              "hard_state"]),
          countdown=st.integers(0, 6), seed=st.integers(0, 2**32), blob=payloads)
    def process_dies_during(self, op: str, countdown: int, seed: int, blob: bytes) -> None:
        """The process dies inside an operation, the machine keeps running (nothing is
        lost yet), and a new process recovers: e.g. between a write and its fsync, or a
        rename and the directory fsync."""
        self._die_during(op, countdown, seed, blob, power_cut=False)

    def _die_during(self, op: str, countdown: int, seed: int, blob: bytes, *,
                    power_cut: bool) -> None:
        self.disk.directory.crash_after(countdown)
        t_min, synced = self.t_min, self.synced
        try:
            if op == "append":
                self._append([blob, blob[:3]])
            elif op == "sync":
                self._sync()
            elif op == "truncate" and self.last > self.compacted:
                self._truncate(self.compacted + 1 + seed % (self.last - self.compacted))
            elif op == "compact":
                self._compact(self.compacted + 1 + seed % (self.last - self.compacted + 2))
            elif op == "checkpoint":
                self._save_ckpt(StoredCheckpoint(index=self.last, data=blob))
            elif op == "hard_state":
                self._save_hard_state(blob)
        except SimulatedCrash:
            if op == "sync":  # in flight: nothing more is known durable
                self.t_min, self.synced = t_min, synced
            self.disk.directory.crash_after(None)
            if power_cut:
                self.disk.crash(random.Random(seed))
            self.recover_and_check()
        finally:
            self.disk.directory.crash_after(None)


class _FileBackend:
    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="phalanx-wal-")
        self.directory = self.tracking = TrackingOsDirectory(self.root)

    def open(self) -> Storage:
        d = self.tracking
        return Storage(wal=Wal.open(d, segment_bytes=SEGMENT_BYTES),
                       hard_state=FileHardStateStore(d),
                       checkpoints=FileCheckpointStore(d, keep=KEEP), directory=d)

    def power_cut(self, rng: random.Random) -> None:
        self.tracking.power_cut(rng)

    def flip(self, rng: random.Random) -> str | None:
        names = [n for n in self.tracking.list()
                 if _is_wal_file(n) and self.tracking.size(n) > 0]
        if not names:
            return None
        name = rng.choice(names)
        path = self.tracking.path(name)
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            f.seek(0)
            f.write(data)
        return name

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class FileMachine(_Base):
    def __init__(self) -> None:
        super().__init__(_FileBackend())


_settings = settings(max_examples=100, stateful_step_count=40, deadline=None,
                     derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TestMemoryCrashConsistency = MemoryMachine.TestCase
TestMemoryCrashConsistency.settings = _settings
TestFileCrashConsistency = FileMachine.TestCase
TestFileCrashConsistency.settings = settings(_settings, max_examples=50)

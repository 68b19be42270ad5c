"""In-memory storage for the simulator, with lazyfs-style crash and corruption injection.

Owns: `MemoryDirectory` (a `Directory` of bytearrays that tracks what is durable) and
`MemoryDisk` (one per simulated node; it survives a simulated crash and reopens the same
WAL, hard-state and checkpoint code the file backend uses).
Must not import: `phalanx.consensus`, `os`-level I/O, clocks or global randomness; every
random choice comes from the `random.Random` the caller passes in.

Crash model (`MemoryDirectory.crash`), after lazyfs "lose un-fsynced writes" and ALICE:
- A file's contents survive up to its last `fsync`. Of the bytes appended since, a crash
  keeps any prefix (possibly cutting a record in half: a torn write).
- A truncation not yet fsynced is either lost entirely (the file reverts to its durable
  contents) or kept together with a prefix of the bytes appended after it.
- Creations, renames and removals since the last `fsync_dir` are applied in order up to a
  random point (a journaling file system commits metadata in order); the rest are lost.
  A file whose name is lost is gone.
Corruption (`flip_bit`, `tear`) changes durable bytes: it models media faults, which no
fsync protects against.

Determinism: iteration is over sorted names or insertion-ordered lists only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import Directory
from phalanx.storage.files import Storage
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import SyncPolicy
from phalanx.storage.records import HEADER_SIZE, scan
from phalanx.storage.wal import SEGMENT_PREFIX, Wal


class SimulatedCrash(Exception):
    """Raised by a `MemoryDirectory` operation armed with `crash_after`: the process 'died'
    during that operation. The caller must `crash()` the directory before reusing it."""


class _Inode:
    __slots__ = ("data", "durable", "min_len")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable = bytearray()
        # Lowest length a truncation left since the last fsync; None if only appends.
        # Invariant: when None, `durable` is a prefix of `data`.
        self.min_len: int | None = None

    def fsync(self) -> None:
        if self.min_len is None:
            self.durable += self.data[len(self.durable):]
        else:
            self.durable = bytearray(self.data)
            self.min_len = None

    def crash(self, rng: random.Random) -> None:
        if self.min_len is None:
            keep = rng.randint(len(self.durable), len(self.data))
            del self.data[keep:]
        elif rng.random() < 0.5:
            self.data = bytearray(self.durable)
        else:
            keep = rng.randint(min(self.min_len, len(self.data)), len(self.data))
            del self.data[keep:]
        self.durable = bytearray(self.data)
        self.min_len = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Flip:
    """Where `flip_bit` flipped: file name, byte offset and bit (0-7)."""

    name: str
    offset: int
    bit: int


class MemoryDirectory:
    """A `Directory` held in memory; see the module docstring for its crash model."""

    __slots__ = ("_crash_countdown", "_durable_names", "_names", "_pending", "label")

    def __init__(self, label: str = "mem") -> None:
        self.label = label
        self._names: dict[str, _Inode] = {}
        self._durable_names: dict[str, _Inode] = {}
        # Directory operations since the last fsync_dir: (op, name, inode-or-target).
        self._pending: list[tuple[str, str, _Inode | str | None]] = []
        self._crash_countdown: int | None = None

    def __repr__(self) -> str:
        return f"MemoryDirectory({self.label!r}, files={self.list()})"

    # -- fault injection ------------------------------------------------------------------

    def crash_after(self, operations: int | None) -> None:
        """Arm (or, with None, disarm) a crash *during* the n-th next mutating operation:
        that operation raises `SimulatedCrash` before taking effect."""
        self._crash_countdown = operations

    def crash(self, rng: random.Random) -> None:
        """Simulate power loss: keep what is durable plus a random part of the rest."""
        names = dict(self._durable_names)
        applied = rng.randint(0, len(self._pending))
        for op, name, arg in self._pending[:applied]:
            if op == "link":
                assert isinstance(arg, _Inode)  # our own bookkeeping, never input
                names[name] = arg
            elif op == "unlink":
                names.pop(name, None)
            else:
                assert isinstance(arg, str)
                inode = names.pop(name, None)
                if inode is not None:
                    names[arg] = inode
        for name in sorted(names):  # one name per inode: there are no hard links
            names[name].crash(rng)
        self._names = names
        self._durable_names = dict(names)
        self._pending = []
        self._crash_countdown = None

    def flip_bit(self, rng: random.Random, name: str | None = None) -> Flip | None:
        """Flip one random bit of a (random, non-empty) file, in memory and on 'media'.
        Returns where, or None when there is no non-empty file to damage."""
        candidates = [n for n in self.list() if self._names[n].data] if name is None else [name]
        if not candidates:
            return None
        target = rng.choice(candidates)
        inode = self._names[target]
        offset = rng.randrange(len(inode.data))
        bit = rng.randrange(8)
        inode.data[offset] ^= 1 << bit
        if offset < len(inode.durable):
            inode.durable[offset] ^= 1 << bit
        return Flip(name=target, offset=offset, bit=bit)

    def tear(self, name: str, length: int) -> None:
        """Cut a file to `length` bytes, durably (a torn write the crash model would not
        produce on its own, e.g. of an already-synced record)."""
        inode = self._names[name]
        del inode.data[length:]
        del inode.durable[length:]

    def durable_size(self, name: str) -> int:
        return len(self._names[name].durable)

    # -- Directory --------------------------------------------------------------------------

    def _tick(self) -> None:
        if self._crash_countdown is not None:
            if self._crash_countdown <= 0:
                raise SimulatedCrash(f"{self.label}: simulated crash")
            self._crash_countdown -= 1

    def _inode(self, name: str) -> _Inode:
        inode = self._names.get(name)
        if inode is None:
            raise FileNotFoundError(self.path(name))
        return inode

    def path(self, name: str) -> str:
        return f"mem:{self.label}/{name}"

    def list(self) -> list[str]:
        return sorted(self._names)

    def size(self, name: str) -> int:
        return len(self._inode(name).data)

    def read(self, name: str) -> bytes:
        return bytes(self._inode(name).data)

    def read_at(self, name: str, offset: int, length: int) -> bytes:
        return bytes(self._inode(name).data[offset:offset + length])

    def view(self, name: str, offset: int, length: int) -> bytes:
        """A copy: in memory there is nothing to save by reading lazily."""
        data = self._inode(name).data
        if offset < 0 or length < 0 or offset + length > len(data):
            raise ValueError(f"range {offset}+{length} is past the end of {self.path(name)}")
        return bytes(data[offset:offset + length])

    def create(self, name: str) -> None:
        self._tick()
        inode = self._names.get(name)
        if inode is None:
            inode = _Inode()
            self._names[name] = inode
            self._pending.append(("link", name, inode))
        elif inode.data:
            self._truncate(inode, 0)

    def append(self, name: str, data: bytes | bytearray) -> None:
        # `_inode(name)` then `_tick()`, inlined (every WAL write of the simulator).
        inode = self._names.get(name)
        if inode is None:
            raise FileNotFoundError(self.path(name))
        if self._crash_countdown is not None:
            self._tick()
        inode.data += data

    def truncate(self, name: str, length: int) -> None:
        inode = self._inode(name)
        self._tick()
        self._truncate(inode, length)

    @staticmethod
    def _truncate(inode: _Inode, length: int) -> None:
        if length < len(inode.data):
            del inode.data[length:]
        else:
            inode.data += bytes(length - len(inode.data))
        inode.min_len = length if inode.min_len is None else min(inode.min_len, length)

    def fsync(self, name: str) -> None:
        # `_inode(name)`, `_tick()` and the common case of `inode.fsync()`, inlined.
        inode = self._names.get(name)
        if inode is None:
            raise FileNotFoundError(self.path(name))
        if self._crash_countdown is not None:
            self._tick()
        if inode.min_len is None:
            inode.durable += inode.data[len(inode.durable):]
        else:
            inode.fsync()

    def rename(self, src: str, dst: str) -> None:
        inode = self._inode(src)
        self._tick()
        del self._names[src]
        self._names[dst] = inode
        self._pending.append(("rename", src, dst))

    def remove(self, name: str) -> None:
        self._inode(name)
        self._tick()
        del self._names[name]
        self._pending.append(("unlink", name, None))

    def fsync_dir(self) -> None:
        self._tick()
        self._durable_names = dict(self._names)
        self._pending = []

    def release(self, name: str) -> None:
        """Nothing to release (no descriptors)."""

    def close(self) -> None:
        """Nothing to release; the contents stay (they are the simulated disk)."""


class MemoryDisk:
    """One simulated node's disk: survives `crash()`, reopened with `open()`.

    Example:
        disk = MemoryDisk("n1")
        st = disk.open()
        st.wal.append(1, b"x"); st.wal.sync()
        disk.crash(rng)            # the node died; `st` must not be used any more
        st = disk.open()           # recovery runs here
    """

    __slots__ = ("directory", "keep_checkpoints", "segment_bytes", "sync")

    def __init__(self, label: str = "mem", *, sync: SyncPolicy = SyncPolicy.GROUP,
                 segment_bytes: int = 1 << 20, keep_checkpoints: int = 3) -> None:
        self.directory = MemoryDirectory(label)
        self.sync = sync
        self.segment_bytes = segment_bytes
        self.keep_checkpoints = keep_checkpoints

    def open(self) -> Storage:
        """Open (and recover) the WAL, hard state and checkpoints on this disk."""
        return Storage(wal=self.wal(), hard_state=self.hard_state(),
                       checkpoints=self.checkpoints(), directory=self.directory)

    def wal(self) -> Wal:
        return Wal.open(self.directory, sync=self.sync, segment_bytes=self.segment_bytes)

    def hard_state(self) -> FileHardStateStore:
        return FileHardStateStore(self.directory, sync=self.sync)

    def checkpoints(self) -> FileCheckpointStore:
        return FileCheckpointStore(self.directory, keep=self.keep_checkpoints, sync=self.sync)

    def crash(self, rng: random.Random) -> None:
        """Power loss: un-fsynced data is lost or kept in part (see `MemoryDirectory.crash`)."""
        self.directory.crash(rng)

    def flip_bit(self, rng: random.Random, name: str | None = None) -> Flip | None:
        return self.directory.flip_bit(rng, name)

    def tear_last_record(self, rng: random.Random) -> bool:
        """Durably cut the newest WAL segment inside its last record. False if none."""
        segments = [n for n in self.directory.list() if n.startswith(SEGMENT_PREFIX)]
        if not segments:
            return False
        name = segments[-1]
        data = self.directory.read(name)
        offsets = scan(data, _first_index_unchecked(name)).offsets
        if not offsets:
            return False
        last = offsets[-1]  # a record is >= HEADER_SIZE bytes, so the range is non-empty
        self.directory.tear(name, rng.randrange(last + 1, last + HEADER_SIZE))
        return True


def _first_index_unchecked(name: str) -> int:
    digits = name[len(SEGMENT_PREFIX):].split(".", 1)[0]
    return int(digits) if digits.isdigit() else 0


__all__ = ["Flip", "MemoryDirectory", "MemoryDisk", "SimulatedCrash"]


def _conformance(directory: MemoryDirectory) -> Directory:
    """Never called: makes mypy prove `MemoryDirectory` is a `Directory`."""
    return directory

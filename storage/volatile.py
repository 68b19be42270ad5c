"""Test mode: a file `Directory` whose un-fsynced appends live only in process memory.

Owns: `VolatileDirectory`, `open_volatile_storage`, and `open_node_storage`, the one place a
node opens its storage, which picks the volatile layer only when both ``PHALANX_TEST_HOOKS=1``
and ``PHALANX_VOLATILE_WRITES=1`` are in the environment (the Jepsen harness sets them for a
``lose-unfsynced`` run), and `open_file_storage` otherwise; either with the checkpoint
store's piece memory budget from ``PHALANX_PIECE_MEMORY_MB`` (`piece_memory_bytes`).

Why: SIGKILL is a *process* crash; the OS keeps every written page, so it cannot show what
a *machine* crash does (un-fsynced writes vanish). Keeping appended bytes in memory until
`fsync(name)` writes and syncs them makes a SIGKILL lose exactly what a power cut may lose,
on real processes and real files, with no kernel help (the real-cluster counterpart of
`phalanx.storage.memory.MemoryDirectory`'s crash model).

Model (a subset of the POSIX outcomes `directory.Directory` allows, so every recovery path
the product relies on must cope with it):
- `append` buffers in memory; reads, sizes and `truncate` see file = disk prefix + buffer.
- `fsync(name)` appends the buffer to the real file and fsyncs it.
- `create`, `truncate` below the disk length, `rename` and `remove` act on the real files at
  once (a crash may keep such changes; the directory itself is `OsDirectory`'s); a renamed
  file's buffer moves with it.
- `close()` writes buffers without syncing (a graceful stop loses nothing).

Must not import: `phalanx.consensus`. Invariant: bytes reach the real file only in order, and
only through `fsync` or `close`; a file's disk length never exceeds its logical length.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import ByteView, OsDirectory
from phalanx.storage.files import Storage, open_file_storage
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import SyncPolicy
from phalanx.storage.wal import DEFAULT_SEGMENT_BYTES, Wal

HOOKS_ENV = "PHALANX_TEST_HOOKS"
PIECE_MEMORY_ENV = "PHALANX_PIECE_MEMORY_MB"
PIECE_MEMORY_MB = 16
"""A node's default budget of checkpoint pieces in memory: the most recently written or
reused ones, which are what a lagging follower lacks (a wiped one fetches the rest from the
packs: the page cache or the disk). Small because it is resident memory: a 1M-key KV state of
100-byte values is ~117 MB of pieces, and holding all of it would take a node past the RSS
target of 3x the raw data (docs/BENCHMARKS.md); set `PIECE_MEMORY_ENV` to 128 for that."""
VOLATILE_ENV = "PHALANX_VOLATILE_WRITES"


class VolatileDirectory:
    """See the module docstring. Thread-safe (the checkpoint writer shares the directory)."""

    __slots__ = ("_buffers", "_disk", "_lock")

    def __init__(self, root: str) -> None:
        self._disk = OsDirectory(root)
        self._buffers: dict[str, bytearray] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"VolatileDirectory({self._disk.root!r})"

    @property
    def root(self) -> str:
        return self._disk.root

    def pending(self) -> int:
        """Bytes appended and not yet fsynced, over every file (what a SIGKILL loses)."""
        with self._lock:
            return sum(len(b) for b in self._buffers.values())

    def path(self, name: str) -> str:
        return self._disk.path(name)

    def list(self) -> list[str]:
        return self._disk.list()

    def size(self, name: str) -> int:
        with self._lock:
            return self._disk.size(name) + len(self._buffers.get(name, b""))

    def read(self, name: str) -> bytes:
        with self._lock:
            return self._disk.read(name) + bytes(self._buffers.get(name, b""))

    def read_at(self, name: str, offset: int, length: int) -> bytes:
        with self._lock:
            disk_len = self._disk.size(name)
            out = self._disk.read_at(name, offset, length) if offset < disk_len else b""
            rest = length - len(out)
            buf = self._buffers.get(name)
            if rest > 0 and buf:
                start = max(0, offset - disk_len)
                out += bytes(buf[start:start + rest])
            return out

    def view(self, name: str, offset: int, length: int) -> ByteView:
        """The file's view when the range is on disk; a copy while part of it is buffered."""
        with self._lock:
            if not self._buffers.get(name):
                return self._disk.view(name, offset, length)
        data = self.read_at(name, offset, length)
        if len(data) != length:
            raise ValueError(f"range {offset}+{length} is past the end of {self.path(name)}")
        return data

    def create(self, name: str) -> None:
        with self._lock:
            self._buffers.pop(name, None)
            self._disk.create(name)

    def append(self, name: str, data: bytes | bytearray) -> None:
        with self._lock:
            if name not in self._buffers and not os.path.exists(self._disk.path(name)):
                raise FileNotFoundError(self._disk.path(name))
            self._buffers.setdefault(name, bytearray()).extend(data)

    def truncate(self, name: str, length: int) -> None:
        with self._lock:
            disk_len = self._disk.size(name)
            if length >= disk_len:
                buf = self._buffers.get(name)
                if buf is not None:
                    del buf[length - disk_len:]
            else:
                self._buffers.pop(name, None)
                self._disk.truncate(name, length)

    def fsync(self, name: str) -> None:
        with self._lock:
            buf = self._buffers.pop(name, None)
            if buf:
                self._disk.append(name, buf)
            self._disk.fsync(name)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            self._disk.rename(src, dst)
            self._buffers.pop(dst, None)
            buf = self._buffers.pop(src, None)
            if buf is not None:
                self._buffers[dst] = buf

    def remove(self, name: str) -> None:
        with self._lock:
            self._buffers.pop(name, None)
            self._disk.remove(name)

    def fsync_dir(self) -> None:
        self._disk.fsync_dir()

    def release(self, name: str) -> None:
        """The real file's descriptor (a buffer not yet fsynced stays in memory)."""
        with self._lock:
            self._disk.release(name)

    def close(self) -> None:
        with self._lock:
            for name, buf in sorted(self._buffers.items()):
                if buf:
                    self._disk.append(name, buf)
            self._buffers.clear()
            self._disk.close()


def open_volatile_storage(path: str, *, sync: SyncPolicy = SyncPolicy.GROUP,
                          segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                          keep_checkpoints: int = 3, piece_memory_bytes: int = 0) -> Storage:
    """`open_file_storage` over a `VolatileDirectory` (test mode; see the module docstring)."""
    directory = VolatileDirectory(path)
    try:
        wal = Wal.open(directory, sync=sync, segment_bytes=segment_bytes)
    except BaseException:
        directory.close()
        raise
    return Storage(wal=wal, hard_state=FileHardStateStore(directory, sync=sync),
                   checkpoints=FileCheckpointStore(directory, keep=keep_checkpoints, sync=sync,
                                                   memory_bytes=piece_memory_bytes),
                   directory=directory)


def volatile_selected(environ: Mapping[str, str] | None = None) -> bool:
    """True iff both ``PHALANX_TEST_HOOKS=1`` and ``PHALANX_VOLATILE_WRITES=1`` are set."""
    env = os.environ if environ is None else environ
    return env.get(HOOKS_ENV) == "1" and env.get(VOLATILE_ENV) == "1"


def piece_memory_bytes(environ: Mapping[str, str] | None = None, *,
                       default_mb: int = PIECE_MEMORY_MB) -> int:
    """A node's budget of checkpoint pieces kept in memory to serve its peers
    (`PIECE_MEMORY_ENV` in MiB, else `default_mb`; 0 serves every piece from disk).

    Raises:
        ValueError: the variable is not a whole number of MiB >= 0 (one line, for the operator).
    """
    env = os.environ if environ is None else environ
    raw = env.get(PIECE_MEMORY_ENV, "").strip()
    if not raw:
        return default_mb << 20
    if not raw.isdigit():
        raise ValueError(f"{PIECE_MEMORY_ENV}={raw!r}: expected a whole number of MiB >= 0")
    return int(raw) << 20


def open_node_storage(path: str, *, sync: SyncPolicy = SyncPolicy.GROUP,
                      keep_checkpoints: int = 3,
                      environ: Mapping[str, str] | None = None,
                      piece_memory: int | None = None) -> Storage:
    """A node's storage: `open_volatile_storage` in test mode (`volatile_selected`), else
    `open_file_storage`; with `piece_memory` bytes of pieces kept in memory (None:
    `piece_memory_bytes(environ)`)."""
    memory = piece_memory_bytes(environ) if piece_memory is None else piece_memory
    if volatile_selected(environ):
        return open_volatile_storage(path, sync=sync, keep_checkpoints=keep_checkpoints,
                                     piece_memory_bytes=memory)
    return open_file_storage(path, sync=sync, keep_checkpoints=keep_checkpoints,
                             piece_memory_bytes=memory)

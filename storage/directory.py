"""The tiny file-system abstraction every storage structure is written against.

Owns: the `Directory` protocol (one flat directory of named files) and `OsDirectory`, its
implementation on real files. `phalanx.storage.memory.MemoryDirectory` is the other
implementation, with crash and corruption injection; the WAL, hard-state and checkpoint code
is written once over `Directory`, so both backends share every line of recovery logic.
Must not import: `phalanx.consensus`, trio (calls are blocking; drivers run them in a thread).

Durability model (POSIX, as lazyfs enforces it):
- `append`, `truncate` and `create` change a file's contents; only `fsync(name)` makes them
  durable. A crash may keep any prefix of un-fsynced appended bytes.
- `create` (of a new name), `rename` and `remove` change the directory; only `fsync_dir()`
  makes them durable.
- `rename` atomically replaces `dst`.
Errors: every method raises `OSError` subclasses as the OS does (`FileNotFoundError`, ...);
callers translate them.
"""

from __future__ import annotations

import os
from typing import Protocol


class ByteView(Protocol):
    """Read-only bytes that may live on disk: `len()` and slicing (to `bytes`) only.

    `bytes` is one; `FileRange` is the on-disk one. The same shape as
    `phalanx.consensus.core.SnapshotData`, which is what the views are handed on as.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes: ...


class FileRange:
    """A read-only byte range of a file, read with `pread` on demand (never held in memory).

    It keeps its own descriptor, so the range stays readable after the file is renamed over
    or removed (the inode lives while the descriptor is open); the descriptor is closed when
    the view is garbage-collected or `close`d. Only valid over a file nobody modifies in place
    (checkpoint files are written once, to a temp name, then renamed). Slices with a step are
    refused (`ValueError`); reads past the range come back short, as `bytes` slices do.
    """

    __slots__ = ("_fd", "_length", "_start")

    def __init__(self, path: str, start: int, length: int) -> None:
        self._fd: int | None = None
        if start < 0 or length < 0:
            raise ValueError(f"bad file range {start}+{length} of {path}")
        self._fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        if start + length > size:
            self.close()
            raise ValueError(f"range {start}+{length} is past the end of {path} ({size} bytes)")
        self._start = start
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, key: slice, /) -> bytes:
        if not isinstance(key, slice):
            raise TypeError("FileRange supports slices only")
        lo, hi, step = key.indices(self._length)
        if step != 1:
            raise ValueError("FileRange slices must be contiguous (step 1)")
        if self._fd is None:
            raise ValueError("read from a closed FileRange")
        want = max(0, hi - lo)
        parts: list[bytes] = []
        offset = self._start + lo
        while want > 0:
            piece = os.pread(self._fd, want, offset)
            if not piece:
                raise OSError(f"file range ended early at offset {offset}")
            parts.append(piece)
            offset += len(piece)
            want -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def __repr__(self) -> str:
        return f"FileRange(start={self._start}, length={self._length})"

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class Directory(Protocol):
    """One flat directory of files, with explicit durability."""

    def path(self, name: str) -> str:
        """The name as shown in errors (a real path, or `mem:<dir>/<name>`)."""
        ...

    def list(self) -> list[str]:
        """Names of the files present, sorted."""
        ...

    def size(self, name: str) -> int: ...

    def read(self, name: str) -> bytes:
        """A file's whole contents."""
        ...

    def read_at(self, name: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes from `offset` (fewer at end of file)."""
        ...

    def view(self, name: str, offset: int, length: int) -> ByteView:
        """`length` bytes from `offset` as a read-only view that outlives a later rename or
        removal of the file. For files that are never modified in place (checkpoints).
        Raises `ValueError` if the range is past the end of the file."""
        ...

    def create(self, name: str) -> None:
        """Create an empty file, or truncate an existing one to zero length."""
        ...

    def append(self, name: str, data: bytes | bytearray) -> None:
        """Append to an existing file."""
        ...

    def truncate(self, name: str, length: int) -> None: ...

    def fsync(self, name: str) -> None:
        """Make the file's contents durable."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename, replacing `dst` if present."""
        ...

    def remove(self, name: str) -> None: ...

    def fsync_dir(self) -> None:
        """Make creations, renames and removals durable."""
        ...

    def release(self, name: str) -> None:
        """Close any descriptor kept open for `name` (the file and its contents stay; a later
        write reopens it). For files written once and then only read (checkpoint packs)."""
        ...

    def close(self) -> None:
        """Release OS resources (open descriptors). The directory stays usable."""
        ...


class OsDirectory:
    """`Directory` on a real directory, with cached `O_APPEND` descriptors.

    Creates the directory if missing. Not thread-safe: one owner at a time.
    """

    __slots__ = ("_fds", "root")

    def __init__(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.root = root
        self._fds: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"OsDirectory({self.root!r})"

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def list(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.root) if e.is_file())

    def size(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is not None:
            return os.fstat(fd).st_size
        return os.stat(self.path(name)).st_size

    def read(self, name: str) -> bytes:
        with open(self.path(name), "rb") as f:
            return f.read()

    def read_at(self, name: str, offset: int, length: int) -> bytes:
        fd = self._fds.get(name)
        if fd is not None:
            return os.pread(fd, length, offset)
        with open(self.path(name), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def view(self, name: str, offset: int, length: int) -> ByteView:
        return FileRange(self.path(name), offset, length)

    def _fd(self, name: str, *, flags: int = 0) -> int:
        fd = self._fds.get(name)
        if fd is None:
            fd = os.open(self.path(name), os.O_RDWR | os.O_APPEND | flags, 0o644)
            self._fds[name] = fd
        return fd

    def create(self, name: str) -> None:
        self._drop_fd(name)
        self._fd(name, flags=os.O_CREAT | os.O_TRUNC)

    def append(self, name: str, data: bytes | bytearray) -> None:
        fd = self._fd(name)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def truncate(self, name: str, length: int) -> None:
        os.ftruncate(self._fd(name), length)

    def fsync(self, name: str) -> None:
        os.fsync(self._fd(name))

    def rename(self, src: str, dst: str) -> None:
        self._drop_fd(dst)
        os.replace(self.path(src), self.path(dst))
        fd = self._fds.pop(src, None)
        if fd is not None:
            self._fds[dst] = fd

    def remove(self, name: str) -> None:
        self._drop_fd(name)
        os.remove(self.path(name))

    def fsync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def release(self, name: str) -> None:
        self._drop_fd(name)

    def _drop_fd(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        fds = list(self._fds.values())
        self._fds.clear()
        for fd in fds:
            os.close(fd)

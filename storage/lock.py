"""The data directory's exclusive lock: one node process per directory.

Owns: `DirectoryLock` (acquire with `lock_data_dir`) and `DirectoryLocked`.
Must not import: `phalanx.consensus`, trio.

Why: two processes on one data directory would both run WAL recovery, truncate each other's
torn tails and append interleaved records: silent corruption. The node takes the lock
BEFORE it reads anything in the directory (`phalanx.runtime.node.open_node`), so a second
`phalanx node run` on a live node's directory stops at once, naming the holder, without
opening the WAL.

Mechanism: `fcntl.flock(LOCK_EX | LOCK_NB)` on `DIR/LOCK`. The kernel drops the lock when the
holder's descriptor closes, including on SIGKILL, so a crashed node never leaves a stale
lock; the file itself stays (its contents are informational only: the holder's pid, written
best-effort, so a full disk does not stop a node from locking its directory).
"""

from __future__ import annotations

import errno
import fcntl
import os

from phalanx.storage.interface import StorageError

LOCK_NAME = "LOCK"


class DirectoryLocked(StorageError):
    """Another process holds the data directory's lock."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"data directory {path} is in use by another process ({holder}); "
                         "stop that node first, or check the configuration's data_dir")
        self.path = path
        self.holder = holder


class DirectoryLock:
    """A held lock on one data directory; `release()` (or process exit) drops it."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_data_dir(root: str) -> DirectoryLock:
    """Lock directory `root` (created if missing) for this process, or fail at once.

    Raises:
        DirectoryLocked: another process holds it (the message names its pid).
        StorageError: the lock file cannot be opened.
    """
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot open the lock file {path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DirectoryLocked(root, holder) from None
        raise StorageError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    try:  # informational only: a full disk must not stop the node from locking
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return DirectoryLock(root, fd)


def probe_data_dir(root: str) -> DirectoryLocked | None:
    """Whether another process holds `root`'s lock, without taking it or writing anything:
    for a command-line front end that wants to name the holder before any other check (a
    busy listen port would otherwise be the first thing it sees). None when the directory
    or its LOCK file does not exist, or nobody holds it (`lock_data_dir` still decides)."""
    path = os.path.join(root, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return DirectoryLocked(root, _holder(fd))
        return None
    finally:
        os.close(fd)  # closing drops the probe's own lock, if it got one
    return None


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "holder pid unknown"

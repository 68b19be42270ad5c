"""Opening one node's storage: the WAL, hard state and checkpoints in one directory.

Owns: the `Storage` bundle and `open_file_storage`. `phalanx.storage.memory.MemoryDisk`
builds the same bundle over a `MemoryDirectory`.
Must not import: `phalanx.consensus`, `phalanx.storage.memory` (memory imports this).

All three structures share one flat directory; their file names do not overlap
(`wal-*.seg`, `wal.meta`, `hardstate`, `checkpoint-*.ckpt` and the checkpoints' pieces in
`ckpack-*.pack`, plus `*.tmp` while saving).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import Directory, OsDirectory
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import (
    CheckpointStore,
    HardStateStore,
    SyncPolicy,
    WriteAheadLog,
)
from phalanx.storage.wal import DEFAULT_SEGMENT_BYTES, Wal


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    """One node's durable state. `wal.recovery` says what opening found (e.g. a torn tail
    that was cut off); `checkpoints.load_latest().problems` must be reported by the caller."""

    wal: Wal
    hard_state: FileHardStateStore
    checkpoints: FileCheckpointStore
    directory: Directory | None = None

    def close(self) -> None:
        """Close the WAL (without syncing) and release descriptors."""
        self.wal.close()
        if self.directory is not None:
            self.directory.close()


def open_file_storage(path: str, *, sync: SyncPolicy = SyncPolicy.GROUP,
                      segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                      keep_checkpoints: int = 3, piece_memory_bytes: int = 0) -> Storage:
    """Open (creating if needed) and recover the storage in directory `path`; the
    checkpoint store keeps up to `piece_memory_bytes` of pieces in memory (to serve peers).

    Raises:
        CorruptionError: the WAL holds corruption a crash cannot explain; run
            `phalanx.storage.repair.repair_wal` deliberately, then open again.
    """
    directory = OsDirectory(path)
    try:
        wal = Wal.open(directory, sync=sync, segment_bytes=segment_bytes)
    except BaseException:
        directory.close()
        raise
    return Storage(wal=wal, hard_state=FileHardStateStore(directory, sync=sync),
                   checkpoints=FileCheckpointStore(directory, keep=keep_checkpoints, sync=sync,
                                                   memory_bytes=piece_memory_bytes),
                   directory=directory)


def _conformance(wal: Wal, hard_state: FileHardStateStore, checkpoints: FileCheckpointStore,
                 os_dir: OsDirectory) -> tuple[WriteAheadLog, HardStateStore, CheckpointStore,
                                               Directory]:
    """Never called: makes mypy prove the implementations satisfy the Protocols."""
    return wal, hard_state, checkpoints, os_dir

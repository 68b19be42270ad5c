"""Crash-safe storage: write-ahead log, hard state and checkpoints, on files or in memory
(with fault injection for the simulator). See `interface.py` for the contracts.

Modules: `records` (record format, torn-vs-corrupt scanner), `directory` (the `Directory`
file-system abstraction, `OsDirectory`), `wal`, `hardstate`, `checkpoint` (written once over
`Directory`; `checkpoint_v2`: the single-file formats v1 and v2; `packs`: format v3's
content-addressed pieces, pack files and manifest), `memory` (`MemoryDirectory` crash
model, `MemoryDisk`), `files` (`open_file_storage`, the `Storage` bundle), `repair`
(`repair_wal`).
"""

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import Directory, OsDirectory
from phalanx.storage.files import Storage, open_file_storage
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import (
    CheckpointStore,
    CorruptionError,
    HardStateStore,
    LoadedCheckpoint,
    StorageError,
    StoredCheckpoint,
    SyncPolicy,
    WriteAheadLog,
)
from phalanx.storage.memory import MemoryDirectory, MemoryDisk, SimulatedCrash
from phalanx.storage.repair import RepairReport, repair_wal
from phalanx.storage.wal import Wal, WalRecovery

__all__ = [
    "CheckpointStore",
    "CorruptionError",
    "Directory",
    "FileCheckpointStore",
    "FileHardStateStore",
    "HardStateStore",
    "LoadedCheckpoint",
    "MemoryDirectory",
    "MemoryDisk",
    "OsDirectory",
    "RepairReport",
    "SimulatedCrash",
    "Storage",
    "StorageError",
    "StoredCheckpoint",
    "SyncPolicy",
    "Wal",
    "WalRecovery",
    "WriteAheadLog",
    "open_file_storage",
    "repair_wal",
]

"""Ready persistence: step 1 of the `Ready` ordering rule over the storage interfaces, and
the reload of what a core restarts from.

Owns: `ReadyPersister`, shared by every driver (the deterministic simulator now, the trio
runtime later): `persist(ready)` installs a snapshot, truncates, appends encoded entries and
writes the hard state (and `core_state`, in its own store), and syncs when `must_sync`;
`load()` returns the `DurableState` a core restarts from. Checkpoints the replica layer
takes, and the log compaction under them, are the replica layer's (`phalanx.apps.replica`);
the metadata format is shared (`phalanx.apps.envelope.encode_meta` is the codec's
`SnapshotMeta` frame).

Rules:
- Storage backends and the codec are injected; this module imports no backend, no trio and
  no clock. Entries, hard state and snapshot metadata are encoded with the codec (never
  pickle); a record that fails to decode is disk corruption and raises `StorageError`.
- Invariant kept in the WAL: records are the log entries after the newest stored checkpoint
  (possibly overlapping it before compaction), contiguous by index; `load()` drops the
  overlap and raises `StorageError` on a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from phalanx.consensus.core import Ready
from phalanx.consensus.types import Entry, HardState, LocalProtocolError, SnapshotMeta
from phalanx.storage.interface import (
    Checkpoint,
    CheckpointStore,
    HardStateStore,
    StorageError,
    WriteAheadLog,
)

T = TypeVar("T")


class Codec(Protocol):
    """The part of `phalanx.net.codec.Registry` persistence needs."""

    def encode(self, obj: object) -> bytes: ...

    def decode(self, data: bytes) -> object: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableState:
    """Everything that survived: the restart point of one replica.

    Attributes:
        hard_state: the last saved hard state, None if never saved.
        snapshot: metadata of the newest valid checkpoint, None if none.
        snapshot_data: that checkpoint's bytes (the state machine after `snapshot.index`).
        entries: the log entries after the checkpoint, contiguous, in index order.
        problems: checkpoints skipped as corrupt (to report, never to hide).
        core_state: the last `Ready.core_state` written (decoded), for cores that use one.
    """

    hard_state: HardState | None
    snapshot: SnapshotMeta | None
    snapshot_data: bytes | None
    entries: tuple[Entry, ...]
    problems: tuple[str, ...] = ()
    core_state: object | None = None


class ReadyPersister:
    """Carries out the persistence part of `Ready` on injected storage backends."""

    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        hard_state: HardStateStore,
        checkpoints: CheckpointStore,
        codec: Codec,
        core_state: HardStateStore | None = None,
    ) -> None:
        self.core_state = core_state
        self.wal = wal
        self.hard_state = hard_state
        self.checkpoints = checkpoints
        self.codec = codec
        self.syncs = 0

    def persist(
        self, ready: Ready, *, install: Callable[[SnapshotMeta, bytes], None] | None = None
    ) -> None:
        """Step 1 of the ordering rule. Returns once durable if `ready.must_sync`.

        Args:
            install: restores the state machine from `ready.snapshot` and stores the
                checkpoint durably (the replica layer's `install`). Without it, the
                checkpoint is stored here and restoring the state is the caller's job.
        """
        wal = self.wal
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            if install is not None:
                install(meta, ready.snapshot.data)
            else:
                self.checkpoints.save(
                    Checkpoint(
                        index=meta.index, data=ready.snapshot.data, meta=self.codec.encode(meta)
                    )
                )
            # Reset the log: nothing at or before the snapshot survives; later entries come
            # with this Ready or later ones.
            if wal.last_index() >= wal.first_index():
                wal.truncate_suffix(wal.first_index())
            wal.compact_prefix(meta.index)
        if ready.truncate_from is not None and ready.truncate_from <= wal.last_index():
            wal.truncate_suffix(ready.truncate_from)
        if ready.entries:
            encode = self.codec.encode
            wal.append_many([(e.index, encode(e)) for e in ready.entries])
        if ready.hard_state is not None:
            self.hard_state.save(self.codec.encode(ready.hard_state))
        if ready.core_state is not None:
            if self.core_state is None:
                raise LocalProtocolError(
                    "this core writes Ready.core_state; give ReadyPersister a core_state store"
                )
            self.core_state.save(self.codec.encode(ready.core_state))
        if ready.must_sync:
            wal.sync()
            self.syncs += 1

    def load(self) -> DurableState:
        """The durable restart point. Raises `StorageError` on undecodable records or a gap."""
        raw_hs = self.hard_state.load()
        hs = None if raw_hs is None else self._decode(raw_hs, HardState, "hard state")
        loaded = self.checkpoints.load_latest()
        meta: SnapshotMeta | None = None
        data: bytes | None = None
        if loaded.checkpoint is not None:
            meta = self._decode(loaded.checkpoint.meta, SnapshotMeta, "checkpoint metadata")
            data = loaded.checkpoint.data
        after = 0 if meta is None else meta.index
        first, last = self.wal.first_index(), self.wal.last_index()
        lo = max(first, after + 1)
        if lo > after + 1 and lo <= last:
            raise StorageError(
                f"log starts at {first} but the newest checkpoint covers only up to {after}"
            )
        entries: list[Entry] = []
        if lo <= last:
            for offset, payload in enumerate(self.wal.read(lo, last + 1)):
                entry = self._decode(payload, Entry, f"log record {lo + offset}")
                if entry.index != lo + offset:
                    raise StorageError(
                        f"log record {lo + offset} holds entry index {entry.index}"
                    )
                entries.append(entry)
        core_state: object | None = None
        if self.core_state is not None:
            raw_cs = self.core_state.load()
            if raw_cs is not None:
                core_state = self._decode(raw_cs, object, "core state")
        return DurableState(
            core_state=core_state,
            hard_state=hs,
            snapshot=meta,
            snapshot_data=data,
            entries=tuple(entries),
            problems=loaded.problems,
        )

    def _decode(self, data: bytes, cls: type[T], what: str) -> T:
        try:
            obj = self.codec.decode(data)
        except Exception as exc:  # the codec raises its own DecodeError; any is corruption
            raise StorageError(f"{what} does not decode: {exc}") from exc
        if not isinstance(obj, cls):
            raise StorageError(f"{what} decodes to {type(obj).__name__}, not {cls.__name__}")
        return obj

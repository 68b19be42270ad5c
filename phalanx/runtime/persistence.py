"""Ready persistence: step 1 of the `Ready` ordering rule over the storage interfaces, and
the reload of what a core restarts from.

Owns: `ReadyPersister`, shared by every driver (the deterministic simulator and the trio
runtime): `persist(ready)` installs a snapshot, truncates, appends encoded entries and
writes the hard state (and `core_state`, in its own store), and syncs when `must_sync`;
`load()` returns the `DurableState` a core restarts from; and `StateJournal`, the
append-only store of a core's `Ready.core_state` (one fsync per save, deltas computed by
the core's injected `DeltaRules`). Checkpoints the replica layer takes, and the log
compaction under them, are the replica layer's (`phalanx.apps.replica`); the metadata format
is shared (`phalanx.apps.envelope.encode_meta` is the codec's `SnapshotMeta` frame).

Rules:
- Storage backends, the codec and a core's delta rules are injected; this module imports no
  backend (only the `Directory` protocol and the legacy hard-state file format, to upgrade
  a PBFT replica's old whole-file core state), no consensus core, no trio and no clock.
  Entries, hard state and snapshot metadata are encoded with the codec (never
  pickle); a record that fails to decode is disk corruption and raises `StorageError`.
- Invariant kept in the WAL: records are the log entries after the newest stored checkpoint
  (possibly overlapping it before compaction), contiguous by index; `load()` drops the
  overlap. A log that cannot continue from the newest valid checkpoint is reset to start
  right after it (`WriteAheadLog.reset`) so the next append lines up, never left for the
  first append to trip over: one that ends behind the checkpoint (a crash between installing
  a snapshot and compacting, or `repair_wal` cut it below the checkpoint), or one separated
  from it by a gap (the newer checkpoints, or all of them, are corrupt). The gap loses state
  the node held: the reset records it (`wal.lost`), and `DurableState.lost_reason` reports
  every such loss, including a repair's, until `clear_log_lost()`. With
  `load(recover_lost=False)` a gap raises `LostStateError` instead, touching nothing.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from phalanx.consensus.core import Ready, SnapshotData, snapshot_bytes
from phalanx.consensus.types import Entry, HardState, LocalProtocolError, SnapshotMeta
from phalanx.storage.directory import Directory
from phalanx.storage.hardstate import HARD_STATE_NAME, decode_hard_state
from phalanx.storage.interface import (
    CheckpointStore,
    CorruptionError,
    HardStateStore,
    StorageError,
    StoredCheckpoint,
    SyncPolicy,
    WriteAheadLog,
)

T = TypeVar("T")


def commit_only_change(saved: HardState, new: HardState) -> bool:
    """Whether `new` differs from the durable `saved` at most in `commit`. Such a hard state
    may be deferred: restoring `commit` is an optimisation, never a safety requirement (the
    runtime's group commit and the simulator both defer it)."""
    return new.term == saved.term and new.vote == saved.vote and new.view == saved.view


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
        snapshot_data: that checkpoint's bytes (the state machine after `snapshot.index`), as
            a view that reads the checkpoint file on demand when the store is on disk.
        entries: the log entries after the checkpoint, contiguous, in index order.
        problems: checkpoints skipped as corrupt (to report, never to hide).
        core_state: the last `Ready.core_state` written (decoded), for cores that use one.
        lost_reason: why this node's durable log lost entries it once held (a WAL repair
            cut it, or it could not continue from any valid checkpoint and was dropped), or
            None. Such a node may have acknowledged entries it no longer has (amnesia): it
            must catch up from its peers (AppendEntries / InstallSnapshot) before its log
            counts, and should not vote until then. Persisted until
            `ReadyPersister.clear_log_lost()`.
        recovering: the node lost durable state it once had (`phalanx.runtime.identity.amnesia`
            decides, from `lost_reason` among others; `load` always says False): the core
            starts in recovery mode.
    """

    hard_state: HardState | None
    snapshot: SnapshotMeta | None
    snapshot_data: SnapshotData | None
    entries: tuple[Entry, ...]
    problems: tuple[str, ...] = ()
    core_state: object | None = None
    lost_reason: str | None = None
    recovering: bool = False

    @property
    def log_lost(self) -> bool:
        """Whether the durable log lost entries it once held (see `lost_reason`)."""
        return self.lost_reason is not None

    def snapshot_bytes(self) -> bytes | None:
        """`snapshot_data` read into memory (for cores that keep the checkpoint as bytes)."""
        return None if self.snapshot_data is None else snapshot_bytes(self.snapshot_data)


class LostStateError(StorageError):
    """`load(recover_lost=False)`: the log cannot continue from any valid checkpoint."""


class DeltaRules(Protocol):
    """How a core's durable record changes: `phalanx.consensus.pbft.durable.PbftDeltaRules`."""

    def diff(self, old: object, new: object) -> object | None: ...

    def apply(self, state: object, delta: object) -> object: ...


JOURNAL_NAME = "journal"
_JOURNAL_TMP = "journal.tmp"
_JOURNAL_MAGIC = b"PHXSJ001"
_RECORD = struct.Struct("<IIB")  # payload length, crc32(kind byte + payload), kind
_FULL, _DELTA = 0, 1
MAX_JOURNAL_RECORD = 64 << 20


class StateJournal:
    """`Ready.core_state` as an append-only, checksummed journal: ONE fsync per save.

    A `HardStateStore` rewrites its whole value through a temp file, a rename and two fsyncs;
    this journal appends only the delta from the previous record (`DeltaRules.diff`) and
    fsyncs the journal file once. When the journal outgrows `compact_bytes` (and four times
    its last full record), the next save rewrites it as one full record (temp file, fsync,
    rename, directory fsync): rare, and still atomic.

    File format (`journal`): ``b"PHXSJ001"`` then records ``u32 length | u32 crc32(kind,
    payload) | u8 kind | payload``, kind 0 = the codec-encoded full record, 1 = a delta. The
    first record is full.

    Crash safety: a save returns only once its record is durable (under `SyncPolicy.OFF`
    the record is written but not synced). A crash during an append leaves a torn final
    record: it was never acknowledged (the caller sends nothing before `save_state`
    returns), so `load_state` drops it and truncates the file there. A checksum failure
    followed by further bytes is corruption: `CorruptionError`, never a silently shorter
    history (a forgotten signed vote could let the replica sign a conflicting one).

    Load: `load_state` fsyncs the file it read and the directory before returning (durable
    policy). A previous process may have died between an append and its fsync, or between a
    compaction's rename and the directory fsync: that record is readable but not durable,
    and the restarted replica must not act on it (re-send a vote it holds, say) until it is.

    A replica upgraded from the whole-file store finds its old `hardstate` value and starts
    the journal from it.

    Not thread-safe: one owner at a time (the driver's persistence thread).
    """

    def __init__(
        self,
        directory: Directory,
        *,
        codec: Codec,
        rules: DeltaRules,
        sync: SyncPolicy = SyncPolicy.GROUP,
        compact_bytes: int = 8 << 20,
    ) -> None:
        if compact_bytes < 1:
            raise ValueError(f"compact_bytes must be >= 1, got {compact_bytes}")
        self._dir = directory
        self._codec = codec
        self._rules = rules
        self._durable = sync is not SyncPolicy.OFF
        self._compact_bytes = compact_bytes
        self._last: object | None = None
        self._loaded = False
        self._size = 0
        self._full_size = 0
        self.appends = 0
        self.compactions = 0

    def load_state(self) -> object | None:
        """The last record saved (None if none); repairs a torn final record."""
        self._loaded = True
        names = self._dir.list()
        if JOURNAL_NAME not in names:
            self._last = None
            if HARD_STATE_NAME in names:
                raw = decode_hard_state(
                    self._dir.read(HARD_STATE_NAME), path=self._dir.path(HARD_STATE_NAME)
                )
                self._last = self._decode(raw, "legacy core state")
                self._settle(HARD_STATE_NAME)
            self._size = 0
            return self._last
        data = self._dir.read(JOURNAL_NAME)
        path = self._dir.path(JOURNAL_NAME)
        if len(data) < len(_JOURNAL_MAGIC):
            # Torn during its creation: nothing in it was ever acknowledged.
            self._dir.remove(JOURNAL_NAME)
            return self.load_state()
        if data[: len(_JOURNAL_MAGIC)] != _JOURNAL_MAGIC:
            raise CorruptionError("core-state journal has a bad magic number", path=path,
                                  offset=0)
        state: object | None = None
        offset = len(_JOURNAL_MAGIC)
        while offset < len(data):
            end = offset + _RECORD.size
            if end > len(data):
                break  # torn header
            length, crc, kind = _RECORD.unpack_from(data, offset)
            if end + length > len(data):
                break  # torn payload
            payload = data[end : end + length]
            if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
                if end + length == len(data):
                    break  # a torn last record (its sectors only partly written)
                raise CorruptionError("core-state journal record fails its checksum",
                                      path=path, offset=offset)
            obj = self._decode(payload, f"journal record at {offset}")
            if kind == _FULL:
                state = obj
                self._full_size = length
            elif kind == _DELTA and state is not None:
                try:
                    state = self._rules.apply(state, obj)
                except ValueError as exc:
                    raise StorageError(f"journal record at {offset}: {exc}") from exc
            else:
                raise CorruptionError(f"journal record of kind {kind} at {offset}",
                                      path=path, offset=offset)
            offset = end + length
        if offset < len(data):
            self._dir.truncate(JOURNAL_NAME, offset)
        self._settle(JOURNAL_NAME)
        self._size = offset
        self._last = state
        return state

    def _settle(self, name: str) -> None:
        """Make what `load_state` read from `name` durable (class docstring, load)."""
        if not self._durable:
            return
        try:
            self._dir.fsync(name)
            self._dir.fsync_dir()
        except OSError as exc:
            raise StorageError(f"making {self._dir.path(name)} durable failed: {exc}") from exc

    def save_state(self, state: object) -> None:
        """Record `state` (replacing the previous one) durably. Raises `StorageError`."""
        if not self._loaded:
            self.load_state()
        try:
            if self._last is None or self._size == 0 or self._compaction_due():
                self._rewrite(state)
            else:
                delta = self._rules.diff(self._last, state)
                if delta is None:
                    return
                record = self._record(_DELTA, self._codec.encode(delta))
                self._dir.append(JOURNAL_NAME, record)
                if self._durable:
                    self._dir.fsync(JOURNAL_NAME)
                self._size += len(record)
                self.appends += 1
        except OSError as exc:
            raise StorageError(f"writing the core-state journal failed: {exc}") from exc
        self._last = state

    def _compaction_due(self) -> bool:
        return self._size > max(self._compact_bytes, 4 * self._full_size)

    def _rewrite(self, state: object) -> None:
        payload = self._codec.encode(state)
        record = _JOURNAL_MAGIC + self._record(_FULL, payload)
        self._dir.create(_JOURNAL_TMP)
        self._dir.append(_JOURNAL_TMP, record)
        if self._durable:
            self._dir.fsync(_JOURNAL_TMP)
        self._dir.rename(_JOURNAL_TMP, JOURNAL_NAME)
        if self._durable:
            self._dir.fsync_dir()
        self._size = len(record)
        self._full_size = len(payload)
        self.compactions += 1

    @staticmethod
    def _record(kind: int, payload: bytes) -> bytes:
        if len(payload) > MAX_JOURNAL_RECORD:
            raise StorageError(f"core-state record of {len(payload)} bytes is too large")
        crc = zlib.crc32(payload, zlib.crc32(bytes([kind])))
        return _RECORD.pack(len(payload), crc, kind) + payload

    def _decode(self, data: bytes, what: str) -> object:
        try:
            return self._codec.decode(data)
        except Exception as exc:  # the codec raises its own DecodeError; any is corruption
            raise StorageError(f"{what} does not decode: {exc}") from exc


class ReadyPersister:
    """Carries out the persistence part of `Ready` on injected storage backends."""

    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        hard_state: HardStateStore,
        checkpoints: CheckpointStore,
        codec: Codec,
        core_state: HardStateStore | StateJournal | None = None,
    ) -> None:
        self.core_state = core_state
        self.wal = wal
        self.hard_state = hard_state
        self.checkpoints = checkpoints
        self.codec = codec
        self.syncs = 0

    def persist(
        self,
        ready: Ready,
        *,
        install: Callable[[SnapshotMeta, bytes], None] | None = None,
        defer_hard_state: bool = False,
    ) -> None:
        """Step 1 of the ordering rule. Returns once durable if `ready.must_sync`.

        Args:
            install: restores the state machine from `ready.snapshot` and stores the
                checkpoint durably (the replica layer's `install`). Without it, the
                checkpoint is stored here and restoring the state is the caller's job.
            defer_hard_state: do not write `ready.hard_state` (the caller judged it a
                commit-only change, which need not be durable: see `phalanx.runtime.group_commit`).
        """
        self.persist_log(ready, install=install)
        if ready.hard_state is not None and not defer_hard_state:
            self.hard_state.save(self.codec.encode(ready.hard_state))
        if ready.core_state is not None:
            if self.core_state is None:
                raise LocalProtocolError(
                    "this core writes Ready.core_state; give ReadyPersister a core_state store"
                )
            if isinstance(self.core_state, StateJournal):
                self.core_state.save_state(ready.core_state)  # appends a delta, syncs
            else:
                self.core_state.save(self.codec.encode(ready.core_state))
        if ready.must_sync:
            self.wal.sync()
            self.syncs += 1

    def persist_log(
        self,
        ready: Ready,
        *,
        install: Callable[[SnapshotMeta, bytes], None] | None = None,
        again: bool = False,
    ) -> None:
        """The log part of step 1, without syncing: install `ready.snapshot`, truncate from
        `ready.truncate_from`, append `ready.entries` (`persist` minus the hard state, the
        core state and the sync; group commit writes those once per batch).

        `again`: this Ready was (partly) written before a storage failure and the WAL was
        rewound (`WriteAheadLog.rewind`) since: entries it still holds are written again."""
        wal = self.wal
        if again and ready.entries and wal.last_index() >= ready.entries[0].index:
            wal.truncate_suffix(ready.entries[0].index)
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            if install is not None:
                install(meta, snapshot_bytes(ready.snapshot.data))
            else:
                self.checkpoints.save(
                    StoredCheckpoint(
                        index=meta.index, data=snapshot_bytes(ready.snapshot.data),
                        meta=self.codec.encode(meta),
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

    def load(self, *, recover_lost: bool = True) -> DurableState:
        """The durable restart point; makes the WAL continue from the newest valid checkpoint
        (see the module docstring).

        Args:
            recover_lost: when the log cannot continue from any valid checkpoint, drop it and
                start after the checkpoint (the node catches up from its peers); False raises
                `LostStateError` instead (a node with no peers has no one to recover from).

        Raises:
            StorageError: undecodable records; `LostStateError` as above.
        """
        raw_hs = self.hard_state.load()
        hs = None if raw_hs is None else self._decode(raw_hs, HardState, "hard state")
        loaded = self.checkpoints.load_latest()
        meta: SnapshotMeta | None = None
        data: SnapshotData | None = None
        if loaded.checkpoint is not None:
            meta = self._decode(loaded.checkpoint.meta, SnapshotMeta, "checkpoint metadata")
            # A view, not the bytes just verified: the core keeps it for lagging peers.
            data = self.checkpoints.read_view(loaded.checkpoint.index)
        after = 0 if meta is None else meta.index
        wal = self.wal
        first, last = wal.first_index(), wal.last_index()
        if first > after + 1:  # a gap: what lay between is gone from this node
            held = "no valid checkpoint" if meta is None else f"checkpoint {after}"
            skipped = (f"; {len(loaded.problems)} corrupt checkpoint(s) skipped, first: "
                       f"{loaded.problems[0]}" if loaded.problems else "")
            why = (f"the log starts at index {first} but the newest valid state is {held}"
                   f"{skipped}")
            if not recover_lost:
                raise LostStateError(why)
            wal.reset(after, lost=f"dropped the log after index {after}: {why}")
        elif last < after:  # ends behind the checkpoint: nothing of it is needed
            wal.reset(after)
        first, last = wal.first_index(), wal.last_index()
        lo = max(first, after + 1)
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
        if isinstance(self.core_state, StateJournal):
            core_state = self.core_state.load_state()
        elif self.core_state is not None:
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
            lost_reason=wal.lost(),
        )

    def clear_log_lost(self) -> None:
        """The node recovered what its log lost from its peers: stop reporting it
        (`DurableState.lost_reason`). For the core's recovering mode to call."""
        self.wal.clear_lost()

    def _decode(self, data: bytes, cls: type[T], what: str) -> T:
        try:
            obj = self.codec.decode(data)
        except Exception as exc:  # the codec raises its own DecodeError; any is corruption
            raise StorageError(f"{what} does not decode: {exc}") from exc
        if not isinstance(obj, cls):
            raise StorageError(f"{what} decodes to {type(obj).__name__}, not {cls.__name__}")
        return obj

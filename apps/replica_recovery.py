"""Recovery for the replica layer: the newest checkpoint plus WAL replay, and installing a
checkpoint obtained from peers.

Owns: `ReplicaRecovery`, the base class of `phalanx.apps.replica.Replica` holding
`restore_latest`, `install` and their helpers; `REPLAY_BATCH`. The state it reads and
writes is the replica's (declared below, set by `Replica.__init__`); the invariants are the
replica's (module docstring of `phalanx.apps.replica`): a load jumps `applied_index` to the
checkpoint's index, replay applies each WAL entry exactly as `Replica.apply` would (the
session rule, transaction mode, batch hooks) without building replies. With a
`RecoveryTarget`, the load (reading and restoring the checkpoint) and the replay are timed by
its injected clock and reported to it as load and replay-rate samples.

Must not import: trio, sockets, clocks, random, any consensus core.
"""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from phalanx.apps.envelope import decode_meta, encode_meta, parse_envelope
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.interface import BatchHooks, SnapshotFormatError, StateMachine
from phalanx.apps.recovery_target import RecoveryTarget
from phalanx.apps.replica_types import ApplyStatus, RecoveryError, RecoveryReport
from phalanx.apps.sessions import SessionTable, Verdict
from phalanx.apps.transactions import TransactionTable
from phalanx.apps.writer import CheckpointJob
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    SnapshotMeta,
)
from phalanx.storage.interface import CheckpointStore, Piece, StoredCheckpoint, WriteAheadLog

REPLAY_BATCH = 1024
"""WAL records read per batch during replay."""


class ReplicaRecovery(ABC):
    """`restore_latest` and `install` over the replica's state (see the module docstring)."""

    _machine: StateMachine
    _store: CheckpointStore
    _wal: WriteAheadLog | None
    _decode_entry: Callable[[bytes], Entry] | None
    _config: Configuration | None
    _gc_pacer: GcPacer | None
    _applied: int
    _applied_term: int
    _table: SessionTable
    _txs: TransactionTable | None
    _entries_since: int
    _bytes_since: int
    _checkpoint_index: int
    _queued: CheckpointJob | None
    _recovery: RecoveryTarget | None

    # The apply path's steps replay shares, defined by `Replica`.
    @abstractmethod
    def _apply_transaction(self, command: bytes, read_only: bool) -> tuple[ApplyStatus, bytes]:
        """Run one transaction-mode command exactly once (`Replica._apply_transaction`)."""

    @abstractmethod
    def _begin_block(self, entry: Entry) -> BatchHooks | None:
        """Open `entry`'s block for an app with batch hooks (`Replica._begin_block`)."""

    @abstractmethod
    def _compact(self, index: int) -> None:
        """Compact the WAL below a durable checkpoint at `index` (`Replica._compact`)."""

    def restore_latest(self, *, replay_upto: int | None = None) -> RecoveryReport:
        """Load the newest valid checkpoint, then replay the WAL suffix after it.

        Args:
            replay_upto: the highest index known committed (entries past it may be
                uncommitted and must not be applied); default: the end of the WAL.

        Raises:
            RecoveryError: the WAL starts after the checkpoint (entries missing) or holds a
                record that does not decode.
            SnapshotFormatError: the stored checkpoint does not parse.
        """
        recovery = self._recovery
        started = recovery.clock() if recovery is not None else 0.0
        loaded = self._store.load_latest()
        checkpoint_index = 0
        if loaded.checkpoint is not None:
            ckpt = loaded.checkpoint
            meta = decode_meta(ckpt.meta) if ckpt.meta else None
            self._load(ckpt.index, ckpt.data, meta)
            checkpoint_index = ckpt.index
            if recovery is not None:
                recovery.note_load(len(ckpt.data), recovery.clock() - started)
        started = recovery.clock() if recovery is not None else 0.0
        replayed, replayed_bytes = self._replay(replay_upto)
        if recovery is not None and replayed:
            recovery.note_apply(replayed_bytes, recovery.clock() - started, replay=True)
        if self._gc_pacer is not None:
            self._gc_pacer.settle()
        return RecoveryReport(
            checkpoint_index=checkpoint_index,
            replayed=replayed,
            applied_index=self._applied,
            problems=loaded.problems,
        )

    def _replay(self, replay_upto: int | None) -> tuple[int, int]:
        """Replay the WAL after the state; (entries replayed, their command bytes if a
        recovery target counts them, else 0)."""
        if self._wal is None or self._decode_entry is None:
            return 0, 0
        hi = self._wal.last_index()
        if replay_upto is not None:
            hi = min(hi, replay_upto)
        lo = self._applied + 1
        if lo > hi:
            return 0, 0
        counting = self._recovery is not None
        size = 0
        if self._wal.first_index() > lo:
            raise RecoveryError(
                f"WAL starts at {self._wal.first_index()} but state is at {self._applied}: "
                f"entries {lo}..{self._wal.first_index() - 1} are missing"
            )
        # NB: replay allocates steadily next to a large, acyclic state; full cyclic-GC passes
        # over millions of map nodes would dominate recovery time, so the collector is paused.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        # `apply` of each entry, lean: nobody awaits these replies, so no `Applied` is built
        # and read-only requests (no state change) are not even run; no checkpoint starts
        # (the caller decides after the replay).
        decode, machine_apply = self._decode_entry, self._machine.apply
        table = self._table
        verdict_of, record, end_entry = table.verdict, table.record, table.end_entry
        txs = self._txs
        try:
            for start in range(lo, hi + 1, REPLAY_BATCH):
                stop = min(start + REPLAY_BATCH, hi + 1)
                for index, payload in enumerate(self._wal.read(start, stop), start):
                    try:
                        entry = decode(payload)
                    except Exception as exc:
                        raise RecoveryError(f"WAL record {index}: {exc}") from exc
                    if entry.index != index:
                        raise RecoveryError(f"WAL record {index} holds entry {entry.index}")
                    if entry.kind is EntryKind.CONFIG:
                        self._config = entry.config
                    if counting:
                        size += sum(len(r.command) for r in entry.requests)
                    if txs is not None:
                        for request in entry.requests:
                            if not request.read_only:
                                self._apply_transaction(request.command, False)
                        txs.end_entry()
                    block = self._begin_block(entry) if txs is None else None
                    for request in () if txs is not None else entry.requests:
                        if request.read_only:
                            continue
                        # the session rule of `_apply_request`: only a newer request runs
                        cid, number = request.client_id, request.request_no
                        if verdict_of(cid, number)[0] is Verdict.RUN:
                            record(cid, number, machine_apply(request.command), index)
                    if block is not None:
                        block.end_batch()
                    end_entry()
                    self._applied = entry.index
                    self._applied_term = entry.term
        finally:
            if gc_was_enabled:
                gc.enable()
        self._entries_since = self._bytes_since = 0
        return hi - lo + 1, size

    def install(self, meta: SnapshotMeta, data: bytes, *,
                pieces: Sequence[Piece] | None = None) -> None:
        """Install a checkpoint obtained from peers (Raft InstallSnapshot, PBFT state
        transfer): restore the state, store the checkpoint durably, compact the WAL below it.
        `pieces`: `data` as the checked pieces it was fetched as (shard-level state
        transfer, `phalanx.runtime.piece_transfer`), stored as such (a content-addressed
        store then holds them under their digests, and writes only those it lacked).

        Raises:
            SnapshotFormatError: `data` does not parse or is not at `meta.index`.
            LocalProtocolError: it would move the state backwards.
        """
        if meta.index <= self._applied:
            raise LocalProtocolError(
                f"checkpoint at {meta.index} is not ahead of applied index {self._applied}"
            )
        self._load(meta.index, data, meta)
        # NB: a checkpoint still in flight (older) completes normally; it is just superseded.
        if pieces is None:
            self._store.save(StoredCheckpoint(meta.index, data, encode_meta(meta)))
        else:
            self._store.save_stream(meta.index, encode_meta(meta), pieces)
        self._checkpoint_index = meta.index
        if self._recovery is not None:
            self._recovery.note_checkpoint(len(data))
        self._compact(meta.index)
        if self._gc_pacer is not None:
            self._gc_pacer.settle()

    def _load(self, index: int, data: bytes, meta: SnapshotMeta | None) -> None:
        parsed = parse_envelope(data)
        if parsed.index != index:
            raise SnapshotFormatError(
                f"checkpoint data is at index {parsed.index}, expected {index}"
            )
        if self._txs is None and parsed.transactions:
            raise SnapshotFormatError(
                f"checkpoint at {index} holds a transaction table: it was taken by a replica "
                "in transaction mode (another protocol?)")
        self._machine.restore(parsed.app_data)
        self._table.load(parsed.sessions, parsed.tombstones)
        if self._txs is not None:
            self._txs.load(parsed.transactions, parsed.max_deadline_ms)
        self._queued = None  # an older state's boundary: superseded
        self._applied = index
        self._checkpoint_index = index
        self._entries_since = self._bytes_since = 0
        if meta is not None:
            self._applied_term = meta.term
            self._config = meta.config

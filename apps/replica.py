"""The replica layer: the checkpoint-and-replay engine between a consensus core and an app.

Owns: applying committed entries to a `StateMachine` exactly once and in index order; the
session table that deduplicates client retries by (client id, request number) and answers them
from a cached reply; checkpoints every N entries or B bytes of commands, taken in O(1) and
serialised and written off the hot path; WAL prefix compaction once a checkpoint is durable;
recovery (newest checkpoint + WAL suffix replay) and installing a checkpoint from a peer, in
`phalanx.apps.replica_recovery` (`ReplicaRecovery`, its base class). Its
value types (`Applied`, `ApplyStatus`, `CheckpointPolicy`, the reports) live in
`phalanx.apps.replica_types` and are re-exported here.

Must not import: trio, sockets, clocks, random, any consensus core. It is consensus-agnostic:
drivers (the simulator, the runtime, the local demo) call it with committed entries, in the
`Ready` order of `phalanx.consensus.core`, and route the returned results to clients.

Invariants:
- applied_index only grows by one per `apply`, or jumps to a checkpoint's index in
  `restore_latest`/`install`. An entry at or below applied_index is skipped (and counted); one
  beyond applied_index + 1 is our caller's bug (`LocalProtocolError`).
- A write request (client_id, n) changes state at most once: it runs iff n is greater than the
  client's last applied request number. n equal to it gets the cached reply; a smaller n gets
  `EXPIRED` (its reply is gone; the client has moved on). The session table is part of every
  checkpoint, so this holds across restarts and state transfer.
- Transaction mode (`transactions=`, for cores that apply non-conflicting transactions in
  different orders on different replicas, the leaderless one): every command is an encoded
  transaction, which runs iff its id was never applied (`phalanx.apps.transactions`: a
  retry or a re-released one gets the cached reply as DUPLICATE, a malformed one INVALID,
  one older than the table's horizon EXPIRED); the session rule is not used. The table is
  part of every checkpoint (envelope version 3). A machine that is `TransactionAware` runs
  each transaction through `apply_tx(tx_id, command, pinned)`, else `apply(command)`.
- Determinism: with `InlineCheckpointWriter`, the same entries give the same results,
  checkpoints and WAL calls; nothing depends on set order, `id()` or time. The one
  exception is opt-in: with a `RecoveryTarget` (`phalanx.apps.recovery_target`, its clock
  injected), WHEN checkpoints are taken follows measured apply and load rates (never what
  is applied); only for protocols whose checkpoints are local (not `aligned` ones).
- Blocks: a machine with `BatchHooks` (outside transaction mode) sees each committed COMMAND
  entry holding a write as one batch: `begin_batch(BatchInfo(index=entry.index,
  timestamp=entry.timestamp, proposer=entry.proposer or proposer_of(entry.term)))`, its
  requests, `end_batch()`, in `apply` and in replay alike; an entry of reads only, a NOOP
  or a CONFIG entry makes none. The entry's block stamp (timestamp, proposer) is what the
  core agreed (`phalanx.apps.interface.wants_block_stamp`), so it is the same everywhere.
  Checkpoints fall between entries, so never inside a batch.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.apps.checkpoint_digest import CheckpointDigests
from phalanx.apps.envelope import (
    Session,
    encode_meta,
    envelope_pieces,
)
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.interface import (
    Admission,
    BatchHooks,
    BatchInfo,
    Housekeeping,
    StateMachine,
    TransactionAware,
)
from phalanx.apps.recovery_target import RecoveryTarget
from phalanx.apps.replica_recovery import REPLAY_BATCH, ReplicaRecovery
from phalanx.apps.replica_types import (
    Applied,
    ApplyStatus,
    CheckpointPolicy,
    RecoveryError,
    RecoveryReport,
    ReplicaStatus,
)
from phalanx.apps.sessions import DEFAULT_MAX_SESSIONS, SessionTable, Verdict
from phalanx.apps.transactions import TransactionLayer, TransactionTable
from phalanx.apps.writer import (
    ApplyProgress,
    CheckpointJob,
    CheckpointWriter,
    InlineCheckpointWriter,
)
from phalanx.consensus.core import CheckpointTaken
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    SnapshotMeta,
)
from phalanx.storage.interface import (
    CheckpointStore,
    WriteAheadLog,
)

__all__ = ["MAX_CLIENT_ID_BYTES", "REPLAY_BATCH", "Applied", "ApplyStatus", "CheckpointPolicy",
           "RecoveryError", "RecoveryReport", "Replica", "ReplicaStatus"]

TIMED_EVERY = 8
"""With a `RecoveryTarget`, the apply of entries whose index is a multiple of this is timed
(a sample of the replay rate; the rate is per byte, so a sample of entries serves)."""

MAX_CLIENT_ID_BYTES = 128
"""Longest client id (UTF-8 bytes) a node admits on arrival (`Replica.admit`): a session
table entry is keyed by it. A uuid4 hex id with a lane suffix takes ~36."""


class Replica(ReplicaRecovery):
    """Applies committed entries to `machine`, deduplicates retries, checkpoints and recovers.

    Args:
        machine: the application.
        checkpoints: where checkpoints go (and come from on restart).
        wal: the log the driver appends entries to; compacted after durable checkpoints and
            replayed on restart. Optional (a replica without one never compacts or replays).
        decode_entry: turns a WAL payload back into its `Entry` (the driver's encoding).
        writer: how checkpoints are written; default `InlineCheckpointWriter(checkpoints)`.
        policy: when to checkpoint.
        config: the membership in force before the first CONFIG entry (for `SnapshotMeta`).
        gc_pacer: opt-in (`phalanx.apps.gc_pacer`): keeps the cyclic collector's full passes
            short next to a large state; told of every apply and of every state load.
        transactions: transaction mode (module docstring): how to read a command as a
            transaction; None (default) for the session rule.
        proposer_of: a batch's proposer from its entry's term, the same on every replica
            (`phalanx.protocols.ProtocolSpec.proposer_of`); default: none ("").
        recovery: a recovery-time objective (`phalanx.apps.recovery_target`): replaces the
            policy's `every_entries`/`every_bytes` triggers (and the idle rule's quarter of
            them) by the interval its measured rates allow. Not with an `aligned` policy.
    """

    def __init__(
        self,
        machine: StateMachine,
        *,
        checkpoints: CheckpointStore,
        wal: WriteAheadLog | None = None,
        decode_entry: Callable[[bytes], Entry] | None = None,
        writer: CheckpointWriter | None = None,
        policy: CheckpointPolicy | None = None,
        config: Configuration | None = None,
        gc_pacer: GcPacer | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        transactions: TransactionLayer | None = None,
        proposer_of: Callable[[int], str] | None = None,
        recovery: RecoveryTarget | None = None,
    ) -> None:
        if wal is not None and decode_entry is None:
            raise LocalProtocolError("a replica with a WAL needs decode_entry to replay it")
        if recovery is not None and policy is not None and policy.aligned:
            raise ValueError("an aligned checkpoint policy checkpoints at fixed sequence "
                             "numbers; a recovery target cannot move them")
        self._recovery = recovery
        self._machine = machine
        self._maintain = machine.maintain if isinstance(machine, Housekeeping) else None
        self._admit = machine.admit if isinstance(machine, Admission) else None
        self._hooks = (machine if isinstance(machine, BatchHooks) and transactions is None
                       else None)
        self._apply_tx = machine.apply_tx if isinstance(machine, TransactionAware) else None
        """Taken once: an isinstance on a runtime Protocol costs ~50 us (it ran per apply)."""
        self._proposer_of = proposer_of
        self._store = checkpoints
        self._wal = wal
        self._decode_entry = decode_entry
        self._writer = writer if writer is not None else InlineCheckpointWriter(checkpoints)
        self._policy = policy if policy is not None else CheckpointPolicy()
        self._config = config
        self._gc_pacer = gc_pacer
        self._progress = ApplyProgress()  # read by a threaded writer between its steps
        self._idle_since = 0  # applied index at the start of the current idle stretch
        self._idle_calls = 0  # `maintain` calls since then
        # Invariant: the state of `machine` and `_sessions` is exactly that after `_applied`.
        self._applied = 0
        self._applied_term = 0
        self._table = SessionTable(max_sessions=max_sessions)
        self._tx = transactions
        self._txs = (TransactionTable(horizon_ms=transactions.horizon_ms)
                     if transactions is not None else None)
        self._entries_since = 0
        self._bytes_since = 0
        self._checkpoint_index = 0
        self._in_flight: int | None = None
        self._queued: CheckpointJob | None = None  # aligned policy: next boundary to write
        self._digests = CheckpointDigests(machine)
        self._cut_sum = -1  # the table's `id_sum` at the last content-defined cut taken
        self._taken: list[CheckpointTaken] = []
        self._written = 0
        self._failures = 0
        self._last_error: str | None = None
        self._skipped = 0

    # ---------------------------------------------------------------- reading

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def machine(self) -> StateMachine:
        return self._machine

    @property
    def recovery(self) -> RecoveryTarget | None:
        """The recovery-time objective choosing the interval, if any (read its `estimate`)."""
        return self._recovery

    def session(self, client_id: str) -> Session | None:
        """The client's deduplication record, if it has one (never in transaction mode)."""
        return self._table.get(client_id)

    @property
    def transactions(self) -> TransactionTable | None:
        """The transaction table (transaction mode), else None. Read only."""
        return self._txs

    def applied_result(self, command: bytes) -> bytes | None:
        """Transaction mode: the cached result of the writing transaction `command` encodes
        if it was applied here (its record is in the table), else None (and always None
        outside transaction mode). A client's retry of it is answered from this, as a
        session-mode retry is from `session`."""
        if self._tx is None or self._txs is None:
            return None
        unwrapped = self._tx.unwrap(command)
        if unwrapped is None:
            return None
        done = self._txs.get(unwrapped[0])
        return None if done is None else done.result

    def admit(self, client_id: str, command: bytes, read_only: bool, *,
              local: bool = False) -> str | None:
        """Arrival checks for a client request (before it is proposed): None to admit it,
        else a one-line reason. Client ids over `MAX_CLIENT_ID_BYTES`, and whatever the
        machine's `Admission.admit` refuses. Never raises. `local`: a STALE read, answered by
        `query` from this replica's state: a plain command even in transaction mode."""
        if len(client_id) * 4 > MAX_CLIENT_ID_BYTES and len(
                client_id.encode("utf-8", "surrogatepass")) > MAX_CLIENT_ID_BYTES:
            return f"client id longer than {MAX_CLIENT_ID_BYTES} bytes"
        if self._tx is not None and not local:
            unwrapped = self._tx.unwrap(command)
            if unwrapped is None:
                return "malformed transaction"
            command = unwrapped[2]
        if self._admit is None:
            return None
        return self._admit(command, read_only)

    @property
    def max_command_bytes(self) -> int | None:
        """The machine's `Admission.max_command_bytes` (None without the hook)."""
        return self._machine.max_command_bytes if isinstance(self._machine, Admission) else None

    def snapshot_meta(self) -> SnapshotMeta | None:
        """Where the current state sits in the log (None until a configuration is known)."""
        if self._config is None:
            return None
        return SnapshotMeta(index=self._applied, term=self._applied_term, config=self._config)

    def query(self, request: bytes) -> bytes:
        """Answer a read-only request against the applied state (a `ReadState`'s answer, once
        `applied_index` reached its index)."""
        return self._machine.query(request)

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            applied_index=self._applied,
            sessions=len(self._table),
            checkpoint_index=self._checkpoint_index,
            checkpoint_in_flight=self._in_flight,
            checkpoints_written=self._written,
            checkpoint_failures=self._failures,
            last_checkpoint_error=self._last_error,
            skipped_entries=self._skipped,
            expired_sessions=self._table.expired,
            transactions=len(self._txs) if self._txs is not None else 0,
        )

    # ---------------------------------------------------------------- applying

    def apply(self, entry: Entry) -> tuple[Applied, ...]:
        """Apply one committed entry; return the outcome of each of its client requests.

        Ordering: entries must come in index order. A re-delivered entry (index <=
        applied_index) is skipped and returns (). Raises `LocalProtocolError` on a gap.
        """
        if entry.index <= self._applied:
            self._skipped += 1
            return ()
        if entry.index != self._applied + 1:
            raise LocalProtocolError(
                f"entry {entry.index} applied after {self._applied}: committed entries must be "
                "applied in order without gaps"
            )
        progress = self._progress
        progress.busy = True
        try:
            return self._apply_entry(entry)
        finally:
            progress.busy = False
            progress.applies += 1

    def _apply_entry(self, entry: Entry) -> tuple[Applied, ...]:
        # A recovery target's replay rate: every TIMED_EVERY-th entry's apply is timed (two
        # clock reads per entry cost up to ~8% of a small put's apply).
        recovery = self._recovery if entry.index % TIMED_EVERY == 0 else None
        started = recovery.clock() if recovery is not None else 0.0
        out: list[Applied] = []
        size = 0
        if entry.kind is EntryKind.CONFIG:
            self._config = entry.config
        block = self._begin_block(entry)
        for request in entry.requests:
            size += len(request.command)
            out.append(self._apply_request(entry.index, request.client_id,
                                           request.request_no, request.command,
                                           request.read_only))
        if block is not None:
            block.end_batch()
        self._table.end_entry()
        if self._txs is not None:
            self._txs.end_entry()
        self._applied = entry.index
        self._applied_term = entry.term
        self._entries_since += 1
        self._bytes_since += size
        if recovery is not None:
            recovery.note_apply(size, recovery.clock() - started)
        self._collect()
        if self._due():
            self._start_due()
        if self._gc_pacer is not None:  # per command: a batched entry holds up to 256
            self._gc_pacer.note_apply(len(entry.requests) or 1)
        return tuple(out)

    def _begin_block(self, entry: Entry) -> BatchHooks | None:
        """Open `entry`'s batch on a machine with hooks if it holds a write (module
        docstring); the machine to close it on, else None."""
        hooks = self._hooks
        if hooks is None or not any(not r.read_only for r in entry.requests):
            return None
        proposer = entry.proposer
        if not proposer and self._proposer_of is not None:
            proposer = self._proposer_of(entry.term)
        hooks.begin_batch(BatchInfo(index=entry.index, timestamp=entry.timestamp,
                                    proposer=proposer))
        return hooks

    def _apply_request(
        self, index: int, client_id: str, request_no: int, command: bytes, read_only: bool
    ) -> Applied:
        if self._tx is not None:
            status, result = self._apply_transaction(command, read_only)
        elif read_only:
            status, result = ApplyStatus.READ, self._machine.query(command)
        else:
            verdict, session = self._table.verdict(client_id, request_no)
            if verdict is Verdict.RUN:
                status, result = ApplyStatus.APPLIED, self._machine.apply(command)
                self._table.record(client_id, request_no, result, index)
            elif verdict is Verdict.DUPLICATE and session is not None:
                status, result = ApplyStatus.DUPLICATE, session.result
            elif verdict is Verdict.EXPIRED:
                status, result = ApplyStatus.EXPIRED, b""
            else:
                status, result = ApplyStatus.SESSION_EXPIRED, b""
        return Applied(
            index=index, client_id=client_id, request_no=request_no, status=status, result=result
        )

    def _apply_transaction(self, command: bytes, read_only: bool) -> tuple[ApplyStatus, bytes]:
        """Transaction mode: run `command`'s transaction iff its id never ran."""
        layer, table = self._tx, self._txs
        assert layer is not None  # our caller checked
        assert table is not None
        unwrapped = layer.unwrap(command)
        if unwrapped is None:
            return ApplyStatus.INVALID, b""
        tx_id, deadline_ms, app_command, pinned = unwrapped
        if read_only:
            return ApplyStatus.READ, self._machine.query(app_command)
        done = table.get(tx_id)
        if done is not None:
            return ApplyStatus.DUPLICATE, done.result
        if table.too_old(deadline_ms):
            return ApplyStatus.EXPIRED, b""
        apply_tx = self._apply_tx
        if apply_tx is not None:
            result = apply_tx(tx_id, app_command, pinned)
        else:
            result = self._machine.apply(app_command)
        table.record(tx_id, deadline_ms, result)
        return ApplyStatus.APPLIED, result

    # ---------------------------------------------------------------- checkpoints

    def _due(self) -> bool:
        p = self._policy
        if p.aligned:
            applied = self._applied
            return (applied % p.every_entries == 0 and applied != self._checkpoint_index
                    and applied != self._in_flight
                    and (self._queued is None or self._queued.index != applied))
        if self._recovery is not None:
            return self._recovery.due(self._bytes_since) or self._cut_due()
        return (p.every_entries > 0 and self._entries_since >= p.every_entries) or (
            p.every_bytes > 0 and self._bytes_since >= p.every_bytes
        ) or self._cut_due()

    def _cut_due(self) -> bool:  # a cut (`CheckpointPolicy.cut_every`) not taken yet
        txs = self._txs
        return (txs is not None and txs.is_cut(self._policy.cut_every)
                and txs.id_sum != self._cut_sum)

    def _start_due(self) -> None:
        """Start the checkpoint the policy asks for; under an aligned policy, queue it if the
        writer is busy (replacing an older queued boundary)."""
        if self._cut_due() and self._txs is not None:
            self._cut_sum = self._txs.id_sum  # taken now or queued: once per cut
            if self._writer.busy:
                self._queued = self._job()
                return
        if not self.checkpoint_now() and self._policy.aligned and self._writer.busy:
            self._queued = self._job()

    def checkpoint_now(self) -> bool:
        """Start a checkpoint of the current state; False if one is already in flight (the
        policy then triggers again after it completes). O(1) on the calling thread."""
        self._collect()
        if self._writer.busy or self._applied == 0 or self._applied == self._checkpoint_index:
            return False
        self._start(self._job())
        self._collect()
        return True

    def _job(self) -> CheckpointJob:
        """A checkpoint of the current state: its O(1) snapshot, to be serialised later."""
        txs = self._txs
        digests = self._digests  # the app's own checkpoint digest, if it has one
        chunks = digests.chunks(self._applied, lambda app: envelope_pieces(
            index=self._applied, sessions=self._table.sessions, app=app,
            tombstones=self._table.tombstones,
            transactions=txs.records if txs is not None else None,
            max_deadline_ms=txs.max_deadline_ms if txs is not None else 0,
        ), self._machine.snapshot())
        meta = self.snapshot_meta()
        self._entries_since = 0
        self._bytes_since = 0
        return CheckpointJob(
            index=self._applied,
            chunks=chunks,
            meta=encode_meta(meta) if meta is not None else b"",
            progress=self._progress,
        )

    def backup_job(self) -> CheckpointJob:
        """The current state as a checkpoint job for a store of the caller's (a backup,
        `phalanx snapshot save`): O(1) here, serialised later on any thread, like a
        checkpoint's. It is not one of this replica's checkpoints: the policy's counters,
        the core and the WAL do not hear of it."""
        txs = self._txs
        meta = self.snapshot_meta()
        return CheckpointJob(
            index=self._applied,
            chunks=envelope_pieces(
                index=self._applied, sessions=self._table.sessions,
                app=self._machine.snapshot(), tombstones=self._table.tombstones,
                transactions=txs.records if txs is not None else None,
                max_deadline_ms=txs.max_deadline_ms if txs is not None else 0),
            meta=encode_meta(meta) if meta is not None else b"",
            progress=self._progress,
        )

    def _start(self, job: CheckpointJob) -> None:
        self._in_flight = job.index
        self._writer.start(job)

    def poll(self) -> tuple[CheckpointTaken, ...]:
        """Checkpoints made durable since the last call, for the core (`CheckpointTaken`).

        Also finishes completed checkpoint jobs (compacting the WAL); drivers call it
        regularly, e.g. after each batch of applies or when idle.
        """
        self._collect()
        taken, self._taken = tuple(self._taken), []
        return taken

    def maintain(self) -> None:
        """Idle-time work. Drivers call it when idle (the runtime: on each tick with no
        persistence in flight). Starts a checkpoint that became due while the writer was busy
        (an apply only starts one when the writer is free, so after a burst the last due
        checkpoint would otherwise wait for the next write, keeping the overlays and the
        core's log of the whole burst in memory) or that the idle rule asks for
        (`CheckpointPolicy.idle_calls`), then gives a machine with `Housekeeping`
        one bounded piece of its deferred work, so a quiet replica still frees what its last
        checkpoint replaced."""
        self._collect()  # a finished checkpoint lets a queued boundary start
        if self._applied != self._idle_since:
            self._idle_since, self._idle_calls = self._applied, 0
        else:
            self._idle_calls += 1
        if self._due() or self._idle_due():
            self._start_due()
        if self._maintain is not None:
            self._maintain()

    @property
    def idle_checkpoints(self) -> bool:  # the policy checkpoints when idle (call `maintain`)
        return self._policy.idle_calls > 0

    def _idle_due(self) -> bool:
        p, since = self._policy, self._entries_since
        if self._recovery is not None and not p.idle_any:
            return (0 < p.idle_calls <= self._idle_calls and since > 0
                    and self._bytes_since * 4 >= self._recovery.interval_bytes)
        return 0 < p.idle_calls <= self._idle_calls and (since > 0 if p.idle_any else (
            (p.every_entries > 0 and since * 4 >= p.every_entries)
            or (p.every_bytes > 0 and self._bytes_since * 4 >= p.every_bytes)))

    def _collect(self) -> None:
        done = self._writer.poll()
        if done is None:
            return
        self._in_flight = None
        if done.error is not None:
            self._digests.taken(done.index)
            self._failures += 1
            self._last_error = done.error
        else:
            self._written += 1
            if self._recovery is not None and done.index > self._checkpoint_index:
                # bytes_since restarted when this job was snapshotted: applied during its write
                self._recovery.note_written(self._bytes_since)
                self._recovery.note_checkpoint(len(done.data))
            self._checkpoint_index = max(self._checkpoint_index, done.index)
            self._taken.append(CheckpointTaken(index=done.index, data=done.data,
                                               digest=self._digests.taken(done.index)))
            self._compact(done.index)
        queued = self._queued
        if queued is not None and not self._writer.busy:
            self._queued = None
            if queued.index > self._checkpoint_index:
                self._start(queued)

    def _compact(self, index: int) -> None:
        upto = index - self._policy.compact_lag
        if self._wal is not None and upto >= self._wal.first_index():
            self._wal.compact_prefix(upto)

    def close(self) -> None:
        """Finish the checkpoint in flight (its `CheckpointTaken` stays available to `poll`)
        and stop the writer; a boundary queued behind it (aligned policy) is dropped. Does
        not close the storage, which the caller owns."""
        self._queued = None
        self._collect()
        self._writer.close()
        self._collect()

"""The replica layer's value types: what applying a request yields (`Applied`,
`ApplyStatus`), the checkpoint policy, and the reports `Replica` returns (`RecoveryReport`,
`ReplicaStatus`, `RecoveryError`).

Owns: these types and the policy's validation; no behaviour. `phalanx.apps.replica`
re-exports every name, so callers import them from there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from phalanx.consensus._fastpath import raw_init
from phalanx.storage.interface import StorageError


class RecoveryError(StorageError):
    """Recovery cannot rebuild the state: the WAL does not reach back to the checkpoint, or a
    WAL record is not an entry."""


class ApplyStatus(enum.Enum):
    APPLIED = "applied"
    """The request ran now; `result` is its reply."""
    DUPLICATE = "duplicate"
    """A retry of the client's latest request (transaction mode: of an applied transaction):
    not run again; `result` is the cached reply."""
    EXPIRED = "expired"
    """A retry of an older request (transaction mode: a transaction older than the table's
    horizon, which may have run): not run; its reply is no longer kept (`result` empty)."""
    SESSION_EXPIRED = "session_expired"
    """A request no newer than an expired session's last one (`phalanx.apps.sessions`): not
    run (it may have run before); `result` empty."""
    READ = "read"
    """A read-only request carried in the log: answered by `query`, no session change."""
    INVALID = "invalid"
    """Transaction mode: the command is not a well-formed transaction; not run (`result`
    empty). A correct core never commits one; the client gets an error."""


@raw_init  # built once per applied request
@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    """The outcome of one client request of a committed entry, to route to its client."""

    index: int
    client_id: str
    request_no: int
    status: ApplyStatus
    result: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPolicy:
    """Checkpoint after `every_entries` applied entries or `every_bytes` bytes of commands
    since the last one, whichever comes first (0 disables that trigger)."""

    every_entries: int = 10_000
    every_bytes: int = 16 << 20
    compact_lag: int = 0
    """Entries kept in the WAL below a durable checkpoint (lets lagging peers catch up from the
    log instead of a snapshot)."""
    idle_calls: int = 0
    """Also checkpoint after this many `maintain` calls in a row with nothing applied (the
    runtime calls it on idle ticks: 500 is ~5 s), if at least a quarter of a trigger's worth
    was applied since the last checkpoint; 0 disables it. After a burst, the tail since the
    last checkpoint otherwise stays in memory as overlays and the core's log until writes
    come again, scattered over allocator arenas it keeps resident. Not for protocols whose
    checkpoints must fall on fixed sequence numbers (PBFT)."""
    idle_any: bool = False
    """With `idle_calls`: checkpoint when idle if ANYTHING was applied since the last
    checkpoint (not a quarter of a trigger). For the leaderless core's state transfer: its
    replicas number entries locally, and f+1 of them hold checkpoints of one applied set only
    when each checkpoints at the quiet point after the same burst."""
    cut_every: int = 0
    """Also checkpoint after an entry when the transaction table's id set is a
    content-defined cut: its order-free sum (`TransactionTable.id_sum`) is divisible by this
    (about one applied transaction in `cut_every`; queued like an aligned boundary when the
    writer is busy). A function of the applied set only, so replicas that pass through one
    applied set, in any order and at any local index, checkpoint it alike: the leaderless
    core's state transfer under constant load (docs/LEADERLESS.md "State transfer"). 0: off;
    needs a transaction-mode replica."""
    aligned: bool = False
    """Checkpoint exactly at the applied indexes that are multiples of `every_entries`, and
    never by bytes or idleness: for protocols whose replicas vote on the state at fixed
    sequence numbers (PBFT, every K), where a checkpoint anywhere else is worthless. A
    boundary reached while the writer is still busy is snapshotted at once (O(1)) and written
    when the writer is free; a newer boundary reached meanwhile replaces it, so a slow writer
    skips boundaries instead of falling ever further behind (peers with faster writers vote
    for the skipped ones)."""

    def __post_init__(self) -> None:
        if (self.every_entries < 0 or self.every_bytes < 0 or self.compact_lag < 0
                or self.idle_calls < 0 or self.cut_every < 0):
            raise ValueError(f"checkpoint policy values must be >= 0: {self!r}")
        if self.aligned and (self.every_entries == 0 or self.every_bytes or self.idle_calls):
            raise ValueError("an aligned checkpoint policy needs every_entries > 0 and no "
                             f"byte or idle trigger: {self!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryReport:
    checkpoint_index: int
    """Index of the checkpoint loaded (0 when none was)."""
    replayed: int
    """WAL entries applied after it."""
    applied_index: int
    problems: tuple[str, ...] = ()
    """Corrupt newer checkpoints skipped on the way (see `LoadedCheckpoint.problems`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStatus:
    applied_index: int
    sessions: int
    checkpoint_index: int
    checkpoint_in_flight: int | None
    checkpoints_written: int
    checkpoint_failures: int
    last_checkpoint_error: str | None
    skipped_entries: int
    expired_sessions: int = 0
    """Sessions this replica expired (`phalanx.apps.sessions`) since it started."""
    transactions: int = 0
    """Transaction mode: applied transactions in the table now."""

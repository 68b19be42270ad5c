"""The driver's counters and metrics hooks.

Owns: `DriverStatistics` (the counters of one `phalanx.runtime.driver.Driver`, exported by the
node's metrics and `phalanx status`) and `DriverObserver` (the metrics hooks the driver
calls; `phalanx.runtime.metrics.NodeMetrics` implements them).

Must not import: trio, sockets, prometheus, any consensus core, `phalanx.runtime.driver`.
Invariant: every counter is monotonic except `pending_readys` and `waiters` (gauges).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from phalanx.consensus.core import CoreStatus


class DriverObserver(Protocol):
    """Metrics hooks (`phalanx.runtime.metrics.NodeMetrics` implements them)."""

    def on_fsync(self, seconds: float, readys: int) -> None: ...

    def on_applied(self, entries: int, applied_index: int, commit_index: int) -> None: ...

    def on_status(self, status: CoreStatus, applied_index: int) -> None: ...


@dataclass(slots=True)
class DriverStatistics:
    """Counters of one driver (monotonic, except `pending_readys` and `waiters`)."""

    steps: int = 0
    storage_failures: int = 0
    """Failed attempts to persist a batch (disk full, EIO): `phalanx.runtime.driver_persist`."""
    batches: int = 0
    io_batches: int = 0
    fsyncs: int = 0
    applied_entries: int = 0
    replies: int = 0
    redirects: int = 0
    retries: int = 0
    dropped_peer_messages: int = 0
    pending_readys: int = 0
    waiters: int = 0
    leader_changes: int = 0
    early_messages: int = 0
    lazy_messages: int = 0
    """Early messages held until the next message to their peer or the next tick
    (`phalanx.runtime.driver_output`: a Raft leader's commit notices)."""
    superseded_messages: int = 0
    """Lazy messages dropped because the next message to their peer said all they would
    (`phalanx.runtime.driver_output`: a commit notice followed by a newer AppendEntries)."""
    proposal_batches: int = 0
    duplicate_calls: int = 0
    overloaded_calls: int = 0
    """Writes refused with RETRY because `max_pending_calls` calls were already waiting."""
    slow_passes: int = 0
    """Core-loop passes longer than `SLOW_PASS_TICKS` ticks (heartbeats were late)."""
    session_replies: int = 0
    """Retried writes answered from the replica's session table (already applied here)."""
    refused_calls: int = 0
    """Calls refused on arrival (`Replica.admit`: oversized key, value, command or client
    id), answered ERROR and never proposed."""
    extra: dict[str, int] = field(default_factory=dict)

"""Raft configuration, restored state, Raft-specific inputs and status.

Owns: `RaftConfig` (static tuning), `RaftRestoredState`
(what a driver reloads from disk after a crash), the Raft-specific inputs (`Campaign`,
`ProposeBatch`, `ProposeConfChange`, `TransferLeadership`) and `RaftStatus`.

Rules: pure data; imports only `phalanx.consensus` modules. Invalid configuration is our
own misuse and raises `LocalProtocolError` at construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.consensus.core import CoreStatus, Snapshot
from phalanx.consensus.raft.confchange import ConfChange
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    HardState,
    LocalProtocolError,
    NodeId,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """Static configuration of one Raft node.

    Attributes:
        node_id: this node.
        voters: the bootstrap configuration's voters (ignored when restored state holds a
            configuration). A node joining an existing cluster passes ``()`` and learns its
            configuration from the leader.
        learners: the bootstrap configuration's learners.
        election_ticks: the election timeout is drawn uniformly from
            [election_ticks, 2*election_ticks) with the injected rng, at every reset (§3.4).
        heartbeat_ticks: a leader sends heartbeats every this many ticks (< election_ticks).
        max_inflight: AppendEntries per follower in flight at once (REPLICATE state).
        max_batch_entries / max_batch_bytes: at most this many entries / estimated bytes per
            AppendEntries (the first entry is always sent).
        pre_vote: run a pre-vote round before a real election (§9.6).
        check_quorum: a leader steps down when it has not heard from a quorum within an
            election timeout, and voters ignore RequestVote while they heard from a leader
            within the minimum election timeout (§4.2.3, §6.2).
        snapshot_chunk_size: bytes of snapshot data per InstallSnapshot.
        snapshot_window_bytes: snapshot bytes a leader sends one follower beyond what it
            acknowledged (at least one chunk is always allowed). The transfer's flow control:
            enough to keep a loopback or LAN link busy, small enough that a lost window costs
            little to resend.
        snapshot_retain_log_bytes: while a follower receives a snapshot, a newer checkpoint
            compacts the leader's log only down to that snapshot's index, so the follower
            catches up through entries after installing it instead of needing the newer
            snapshot too, as long as the kept entries stay within this many bytes (estimated
            as for `max_batch_bytes`); beyond that, compaction proceeds and the follower gets
            the newer snapshot once the one in progress is installed. 0 never retains.
        log_tail_after_compaction: entries kept before a checkpoint's index when compacting,
            so slightly lagging followers still get entries instead of a snapshot.
        log_tail_max_bytes: also keep at most this many bytes of that tail (estimated as for
            `max_batch_bytes`: payload plus a fixed overhead per entry). The kept tail is the
            longest run of entries ending at the checkpoint's index within BOTH limits, so
            compaction always reaches at least as far as one of them allows, and an entry
            larger than this is never kept (0 compacts to the checkpoint's index). Why: after
            a bulk load each entry is a batch of many commands, and 100 of them held tens of
            megabytes in memory for no benefit (a follower that far behind is cheaper to
            send a snapshot anyway).
        block_stamps: the leader stamps each COMMAND entry it appends with its clock (the
            newest `Tick.now_ms`, never below its log's last stamp) and its id
            (`Entry.timestamp`/`proposer`), for apps that ask for block time. Followers
            take it as it comes: Raft trusts its leader (crash faults).
    """

    node_id: NodeId
    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    max_inflight: int = 64
    max_batch_entries: int = 64
    max_batch_bytes: int = 1 << 20
    pre_vote: bool = True
    check_quorum: bool = True
    snapshot_chunk_size: int = 256 * 1024
    snapshot_window_bytes: int = 4 << 20
    snapshot_retain_log_bytes: int = 64 << 20
    log_tail_after_compaction: int = 100
    log_tail_max_bytes: int = 1 << 20
    block_stamps: bool = False

    def __post_init__(self) -> None:
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise LocalProtocolError("need 1 <= heartbeat_ticks < election_ticks")
        for name in ("max_inflight", "max_batch_entries", "max_batch_bytes",
                     "snapshot_chunk_size", "snapshot_window_bytes"):
            if getattr(self, name) < 1:
                raise LocalProtocolError(f"RaftConfig.{name} must be >= 1")
        for name in ("log_tail_after_compaction", "log_tail_max_bytes",
                     "snapshot_retain_log_bytes"):
            if getattr(self, name) < 0:
                raise LocalProtocolError(f"RaftConfig.{name} must be >= 0")

    def bootstrap_config(self) -> Configuration:
        return Configuration(voters=tuple(sorted(set(self.voters))),
                             learners=tuple(sorted(set(self.learners))))


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftRestoredState:
    """What a driver reloads from disk after a crash: the hard state, the latest snapshot
    (meta and data) if any, and the durable log entries after it (entries at or below the
    snapshot index are ignored)."""

    hard_state: HardState
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()
    recovering: bool = False
    """The node lost durable state it once had (amnesia: an empty data directory of a
    known member, a missing hard state, a log cut short by repair), so it may have voted or
    acknowledged entries it no longer remembers. It then neither votes (nor pre-votes) nor
    campaigns until its log holds, durably and matching the leader's, everything a leader
    of its current term had committed when it first heard from that leader (Protocol-Aware
    Recovery, FAST'18). On leaving recovery it takes that leader as its vote for the term,
    so it never votes twice in a term it may have voted in before."""


# ------------------------------------------------------------------------------ inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class Campaign:
    """Start an election now (with a pre-vote round when `RaftConfig.pre_vote`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProposeBatch:
    """Several client requests arriving together: `Submit` for each, but the leader appends
    the writes as ONE COMMAND entry (applied in order) and sends one AppendEntries per
    follower for all of them. Reads and refusals are handled exactly as `Submit` would.

    Drivers use it to batch the requests that arrived in one pass over their input queue
    (group commit at the protocol level: one entry, one message, one encode per batch).
    """

    requests: tuple[ClientRequest, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProposeConfChange:
    """At the leader: change the membership by joint consensus (§4.3).

    The leader appends C_old,new, and C_new automatically once C_old,new commits. Refused
    (see `RaftStatus.conf_change_error`) when not leader, when a change is in progress, when
    the leader has not yet committed an entry of its term, or when promoting a learner that
    has not caught up with the commit index.
    """

    change: ConfChange


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferLeadership:
    """At the leader: hand leadership to voter `to` (§3.10)."""

    to: NodeId


# ------------------------------------------------------------------------------ status


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftStatus(CoreStatus):
    """`CoreStatus` plus Raft's state.

    Attributes:
        vote: the vote in `term`.
        last_index / last_term: the end of the in-memory log.
        applied: the last index handed out in `Ready.committed` (or installed by snapshot).
        durable_index: the log prefix known durable (`Persisted`).
        snapshot_index: the latest checkpoint this node can serve.
        config: the configuration in force (latest in the log).
        progress: at a leader, per follower "match=.. next=.. state".
        lead_transferee: the target of a leadership transfer in progress.
        conf_change_error: why the last `ProposeConfChange` was refused, if it was.
    """

    vote: NodeId | None = None
    last_index: int = 0
    last_term: int = 0
    applied: int = 0
    durable_index: int = 0
    snapshot_index: int = 0
    config: Configuration = field(default_factory=lambda: Configuration(voters=()))
    progress: Mapping[NodeId, str] = field(default_factory=dict)
    lead_transferee: NodeId | None = None
    conf_change_error: str | None = None

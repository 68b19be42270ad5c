"""PBFT configuration: membership, batching, checkpoints, water marks, timeouts.

Owns: `PbftConfig` and its validation, the primary of a view (view mod n), quorum sizes.
Must not import: anything beyond `phalanx.consensus.types` and `phalanx.consensus.quorum`.
Invariant: a constructed config is valid; every derived quantity is a pure function of it.
Deliberate bugs for mutation tests are not configuration: see `bugs.PbftBugs`.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.quorum import byzantine_quorum, max_byzantine_faults, reply_quorum
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftConfig:
    """One replica's PBFT parameters.

    Attributes:
        node_id: this replica.
        replicas: the cluster, in a fixed order (primary of view v is replicas[v mod n]).
        checkpoint_interval: K, the replica layer checkpoints every K sequence numbers.
        log_window: L, high water mark = low water mark + L (Castro-Liskov use 2K).
        batch_size: the primary flushes a batch once it holds this many requests.
        batch_ticks: ... or once the oldest pending request waited this many ticks.
        max_inflight_batches: a partial batch is proposed at once while fewer than this many
            of the primary's batches are ordered but not executed; otherwise requests
            accumulate until one executes (adaptive batching, `requests.RequestBook`).
        forward_ticks: a backup relays a client request to the primary (`ForwardRequest`)
            once it has waited this many ticks without appearing in a pre-prepare; 0 relays
            at once. Clients send every request to every replica, so the primary normally
            has its own copy: relaying at once would quadruple the primary's inbound
            requests for nothing (Castro-Liskov §4.1: backups relay requests a client
            re-broadcast after its timeout).
        view_change_ticks: base view-change timeout; doubles per consecutive view change.
        max_view_change_ticks: cap of the doubled timeout.
        fetch_ticks: ticks before a state-transfer fetch is retried with another peer (and
            between two fetches of the ViewChanges a NewView names and a backup lacks).
        view_change_fetch_ticks: a backup holding a NewView but not every ViewChange it
            names first asks for the missing ones after this many ticks (they are usually
            still on their way: every replica broadcasts its ViewChange).
        checkpoint_resend_ticks: a replica re-broadcasts its newest signed checkpoint vote
            this often while that checkpoint is not stable (a lost vote must not freeze the
            water marks for good).
        max_pending: bound on buffered client requests (a flood is dropped and counted).
        early_votes: send own pre-prepares and prepares before their record is durable
            (`Ready.early_messages`, under the restart fence of `safety.SafetyRules`);
            False sends every vote after its persist (the slower, fence-free variant).
        block_stamp_skew_ms: 0 (default): batches carry no block stamp. > 0: the primary
            stamps each new pre-prepare with its clock and id (covered by the digest, see
            `stamp.py`) and a backup refuses a stamp more than this many ms away from its
            own clock (`Tick.now_ms`) or going backwards. For apps that ask for block time.
    """

    node_id: NodeId
    replicas: tuple[NodeId, ...]
    checkpoint_interval: int = 8
    log_window: int = 16
    batch_size: int = 4
    batch_ticks: int = 1
    max_inflight_batches: int = 2
    forward_ticks: int = 3
    view_change_ticks: int = 20
    max_view_change_ticks: int = 640
    fetch_ticks: int = 10
    view_change_fetch_ticks: int = 1
    checkpoint_resend_ticks: int = 50
    max_pending: int = 1024
    early_votes: bool = True
    block_stamp_skew_ms: int = 0

    def __post_init__(self) -> None:
        if len(self.replicas) < 1 or len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas must be non-empty and unique: {self.replicas!r}")
        if self.node_id not in self.replicas:
            raise ValueError(f"{self.node_id!r} is not one of the replicas {self.replicas!r}")
        for name in (
            "checkpoint_interval",
            "batch_size",
            "batch_ticks",
            "max_inflight_batches",
            "view_change_ticks",
            "fetch_ticks",
            "view_change_fetch_ticks",
            "checkpoint_resend_ticks",
            "max_pending",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.block_stamp_skew_ms < 0:
            raise ValueError(f"block_stamp_skew_ms must be >= 0, got {self.block_stamp_skew_ms}")
        if self.forward_ticks < 0:
            raise ValueError(f"forward_ticks must be >= 0, got {self.forward_ticks}")
        if self.log_window < self.checkpoint_interval:
            raise ValueError("log_window must be >= checkpoint_interval")
        if self.max_view_change_ticks < self.view_change_ticks:
            raise ValueError("max_view_change_ticks must be >= view_change_ticks")

    @property
    def n(self) -> int:
        return len(self.replicas)

    @property
    def f(self) -> int:
        return max_byzantine_faults(self.n)

    @property
    def quorum(self) -> int:
        """2f+1 (n - f in general): prepared certificates, stable checkpoints, view changes."""
        return byzantine_quorum(self.n)

    @property
    def weak_quorum(self) -> int:
        """f+1: at least one honest replica among them."""
        return reply_quorum(self.f)

    def primary(self, view: int) -> NodeId:
        return self.replicas[view % self.n]

    def peers(self) -> tuple[NodeId, ...]:
        return tuple(r for r in self.replicas if r != self.node_id)

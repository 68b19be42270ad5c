"""Leaderless core configuration: membership, quorums, timing of deadlocks, GC, bounds.

Owns: `LeaderlessConfig` and its validation, the endorsement quorum Q and the per-policy
quorums (`quorum_for`).
Must not import: anything beyond `phalanx.consensus.types` and `phalanx.consensus.quorum`.
Invariant: a constructed config is valid; every derived quantity is a pure function of it.
Deliberate bugs for mutation tests are not configuration: see `bugs.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.quorum import leaderless_quorum, max_byzantine_faults
from phalanx.consensus.types import NodeId

STUCK_RESOLUTIONS = ("veto", "pbft")
"""The values of `LeaderlessConfig.stuck_resolution` (the first is the default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessConfig:
    """One node's leaderless (PnyxDB) parameters.

    Attributes:
        node_id: this node.
        nodes: the cluster, sorted and unique; `node_id` is one of them.
        f: the Byzantine faults tolerated; None = floor((n-1)/3). Q = ceil((n+f+1)/2).
        policy_quorums: (policy name, quorum) pairs, sorted by name, unique names, each
            quorum in [Q, n]; a policy not named uses Q.
        delta_old_ms: how long a condition must have been expired (and not applicable), or
            a pending transaction past its deadline, before it is queued for a checkpoint
            (PnyxDB's deltaOld).
        checkpoint_ticks: the checkpoint batcher flushes queued ids this often (ticks).
        checkpoint_batch: ids per `StartCheckpoint`.
        gc_horizon_ms: transactions whose deadline is older than now - this are forgotten
            (tombstones included); anything about them is ignored afterwards.
        rebroadcast_ticks: own endorsements (and refusals) of still-pending transactions
            are sent again this often (loss recovery).
        max_pending: bound on pending transactions and on endorsements buffered for
            unknown transactions (a flood is dropped and counted).
        max_pending_per_client: a client's submits are refused (RETRY, "this client has
            too many undecided transactions here") while this node holds that many of its
            transactions undecided (signing client, `Transaction.client`), so one client,
            or leftovers no checkpoint can decide, cannot fill `max_pending` for every
            client (docs/LEADERLESS.md "Per-client bound"). Relayed transactions and
            certificates are taken as before.
        max_deadline_lead_ms: a node endorses a transaction only while its deadline lies at
            most this far past the node's clock (the replica's transaction table keeps
            records for the GC horizon plus this lead: docs/LEADERLESS.md "Runtime half").
        stuck_resolution: how checkpoints of stuck transactions decide: "veto" (votes by
            reliable broadcast, DROP needs all n: no timing assumption, one silent node
            blocks every drop) or "pbft" (votes ordered through an embedded PBFT instance;
            DROP after n-f votes and f+1 closes assumes partial synchrony):
            docs/LEADERLESS.md "Ordered resolution".
        close_ticks: "pbft" mode: a node proposes to close a checkpoint this many ticks
            after it heard of it (must exceed the message delay plus the ordering latency).
        named_fetch_delay_ticks: an unknown transaction that endorsements name is fetched
            from its endorsers this many ticks after the first naming (0: at once), unless
            it arrived meanwhile (`recovery.Recovery.fetch_named`; the runtime, whose
            clients send every transaction to every node, waits 2 ticks).
        vote_batch_ticks: "veto" mode: a node sends its echoes and readies of the vote
            broadcasts in one `VoteBatch` per peer every this many ticks (0: each alone, at
            once; ~n times the messages per checkpoint): docs/LEADERLESS.md "Batched
            echoes and readies".
    """

    node_id: NodeId
    nodes: tuple[NodeId, ...]
    f: int | None = None
    policy_quorums: tuple[tuple[str, int], ...] = ()
    delta_old_ms: int = 1000
    checkpoint_ticks: int = 30
    checkpoint_batch: int = 30
    gc_horizon_ms: int = 60_000
    rebroadcast_ticks: int = 20
    max_pending: int = 8192
    max_pending_per_client: int = 1024
    max_deadline_lead_ms: int = 600_000
    stuck_resolution: str = "veto"
    close_ticks: int = 100
    named_fetch_delay_ticks: int = 0
    vote_batch_ticks: int = 1

    def __post_init__(self) -> None:
        if not self.nodes or list(self.nodes) != sorted(set(self.nodes)):
            raise ValueError(f"nodes must be non-empty, sorted and unique: {self.nodes!r}")
        if self.node_id not in self.nodes:
            raise ValueError(f"{self.node_id!r} is not one of the nodes {self.nodes!r}")
        n = len(self.nodes)
        if self.f is not None and (self.f < 0 or 3 * self.f >= n):
            raise ValueError(f"need 0 <= f and n > 3f, got n={n} f={self.f}")
        names = [name for name, _ in self.policy_quorums]
        if names != sorted(set(names)):
            raise ValueError(f"policy_quorums must be sorted by unique name: {names!r}")
        q = self.quorum
        for name, size in self.policy_quorums:
            if not q <= size <= n:
                raise ValueError(f"policy {name!r} quorum {size} must be in [Q={q}, n={n}]")
        for name in ("checkpoint_ticks", "checkpoint_batch", "gc_horizon_ms",
                     "rebroadcast_ticks", "max_pending", "max_pending_per_client",
                     "max_deadline_lead_ms", "close_ticks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.stuck_resolution not in STUCK_RESOLUTIONS:
            raise ValueError(f"stuck_resolution must be one of {', '.join(STUCK_RESOLUTIONS)}, "
                             f"got {self.stuck_resolution!r}")
        for name in ("delta_old_ms", "named_fetch_delay_ticks", "vote_batch_ticks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def faults(self) -> int:
        """f as configured, or floor((n-1)/3)."""
        return max_byzantine_faults(self.n) if self.f is None else self.f

    @property
    def quorum(self) -> int:
        """Q = ceil((n+f+1)/2): two Q-sets share at least f+1 nodes."""
        return leaderless_quorum(self.n, self.faults)

    def quorum_for(self, policy: str) -> int:
        """The endorsement quorum of `policy` (Q unless configured larger)."""
        for name, size in self.policy_quorums:
            if name == policy:
                return size
        return self.quorum

    def peers(self) -> tuple[NodeId, ...]:
        return tuple(node for node in self.nodes if node != self.node_id)

"""Raft's runtime half (`phalanx.protocols.builtin.RAFT.node`): how a real node builds and
feeds a Raft core.

Owns: `RAFT_NODE` (a `phalanx.protocols.spec.ProtocolNode`), the checkpoint policy of a Raft
replica (size- and count-triggered, plus an idle trigger), and the driver hints for commit
notices (`commit_notice`, `notice_superseded`).

Must not import: `phalanx.runtime.node`, `phalanx.runtime.driver`, trio, sockets.
Determinism: every random choice comes from the injected `random.Random`.
"""

from __future__ import annotations

import random

from phalanx.apps.interface import wants_block_stamp
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import CoreStatus, Ready, Snapshot
from phalanx.consensus.raft import (
    ProposeBatch,
    ProposeConfChange,
    RaftConfig,
    RaftCore,
    RaftRestoredState,
    TransferLeadership,
)
from phalanx.consensus.raft.confchange import ConfChange, ConfChangeError
from phalanx.consensus.raft.messages import AppendEntries
from phalanx.consensus.types import ClientRequest, Configuration, HardState, Message, NodeId
from phalanx.ops.node_config import NodeConfig
from phalanx.protocols.spec import BuiltCore, CoreStateStore, ProtocolError
from phalanx.runtime.persistence import DurableState
from phalanx.storage.interface import SyncPolicy

IDLE_CHECKPOINT_TICKS = 500
"""Checkpoint after ~5 s of idle ticks (at the default 10 ms tick) if a quarter of a
trigger's worth was applied since the last one (`CheckpointPolicy.idle_calls`)."""


def commit_notice(message: Message) -> bool:
    """Whether `message` is a Raft leader's pure commit notice (an AppendEntries with no
    entries): the driver may hold it for the next message to its follower or the next tick
    (`phalanx.runtime.driver_output`). It only tells the follower a commit index, which only
    grows."""
    return type(message) is AppendEntries and not message.entries


def notice_superseded(new: Message, held: Message) -> bool:
    """Whether `new`, going to the follower a commit notice `held` waits for, tells it all
    the notice would: an AppendEntries of the same term with a commit index at least as
    high (the follower then commits as far from `new`). The driver drops `held` then
    (`phalanx.runtime.driver_output`)."""
    return (type(new) is AppendEntries and type(held) is AppendEntries
            and new.term == held.term and new.leader_commit >= held.leader_commit)


def _valid_address(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return (bool(sep and host and port.isdigit()) and 0 < int(port) < 65536
            and not any(c in address for c in ",= "))


class RaftNode:
    """`ProtocolNode` for Raft."""

    def admin_input(self, op: str, node: str, status: CoreStatus,
                    address: str = "") -> ProposeConfChange | TransferLeadership | str:
        """The core input for admin operation `op` on `node` (`phalanx.runtime.admin_ops`),
        or why there is none: add a learner, promote it (joint consensus), remove a voter
        (joint) or a learner, transfer leadership. `address` (``host:port`` of the new
        node's peer listener, for add-learner) rides in the configuration, so running
        nodes link to the new node without a restart (`phalanx.runtime.peer_links`)."""
        target = NodeId(node)
        config = getattr(status, "config", None) or Configuration(voters=())
        if op == "transfer":
            if target not in config.voters:
                return f"{node} is not a voter (voters: {', '.join(config.voters)})"
            return TransferLeadership(to=target)
        try:
            if op == "add-learner":
                if address and not _valid_address(address):
                    return f"bad peer address {address!r} for {node} (want host:port)"
                change = ConfChange(add_learners=(target,), addresses=(
                    ((target, address),) if address else ()))
            elif op == "promote":
                if target not in config.learners:
                    return f"{node} is not a learner (add it with add-learner first)"
                change = ConfChange(add_voters=(target,))
            elif op == "remove":
                change = (ConfChange(remove_learners=(target,)) if target in config.learners
                          else ConfChange(remove_voters=(target,)))
            else:
                return f"unknown admin operation {op!r}"
        except ConfChangeError as e:
            return str(e)
        return ProposeConfChange(change=change)

    def checkpoint_policy(self, config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
        return CheckpointPolicy(every_entries=config.checkpoint.every_entries,
                                every_bytes=config.checkpoint.every_bytes,
                                compact_lag=compact_lag, idle_calls=IDLE_CHECKPOINT_TICKS)

    def open_core_state_store(self, config: NodeConfig,
                              sync: SyncPolicy) -> CoreStateStore | None:
        return None  # the hard state and the log are Raft's durable state

    def build_core(self, config: NodeConfig, *, durable: DurableState, rng: random.Random,
                   byzantine: str | None, pipeline_depth: int,
                   replica: Replica | None = None) -> BuiltCore:
        if byzantine is not None:
            raise ProtocolError(f"--byzantine {byzantine}: Raft tolerates crashes only; "
                                "Byzantine modes need a Byzantine-tolerant protocol")
        learners = config.bootstrap_learners()  # joined later: the log says the rest
        voters = tuple(NodeId(m) for m in config.bootstrap_voters())
        if not voters:
            raise ProtocolError(f"{config.source or config.id}: every member is marked "
                                "joined; the bootstrap configuration needs a voter")
        snapshot = None
        if durable.snapshot is not None and durable.snapshot_data is not None:
            snapshot = Snapshot(meta=durable.snapshot, data=durable.snapshot_data)
        core = RaftCore(
            RaftConfig(node_id=NodeId(config.id), voters=voters,
                       learners=tuple(NodeId(m) for m in learners),
                       election_ticks=config.timing.election_ticks,
                       heartbeat_ticks=config.timing.heartbeat_ticks,
                       max_inflight=pipeline_depth,
                       block_stamps=replica is not None and wants_block_stamp(replica.machine)),
            rng=rng,
            restored=RaftRestoredState(hard_state=durable.hard_state or HardState(),
                                       snapshot=snapshot, entries=durable.entries,
                                       recovering=durable.recovering),
        )

        def propose_batch(requests: tuple[ClientRequest, ...]) -> Ready:
            return core.step(ProposeBatch(requests=requests))

        return BuiltCore(core=core, propose_batch=propose_batch, lazy=commit_notice,
                         supersedes=notice_superseded)


RAFT_NODE = RaftNode()

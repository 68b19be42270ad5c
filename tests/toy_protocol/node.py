"""The toy protocol's runtime half (`TOY.node`): how a real node builds and feeds a `ToyCore`.

Owns: `TOY_NODE` (a `phalanx.protocols.spec.ProtocolNode`). The toy keeps no core-state
record (its hard state and log are its durable state) and checkpoints as Raft does (by the
node config's entry and byte triggers). Must not import the runtime's node or driver, trio,
sockets or jepsen.
"""

from __future__ import annotations

import random

from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Snapshot
from phalanx.consensus.types import NodeId
from phalanx.ops.node_config import NodeConfig
from phalanx.protocols.spec import BuiltCore, CoreStateStore, ProtocolError
from phalanx.runtime.persistence import DurableState
from phalanx.storage.interface import SyncPolicy
from toy_protocol.core import ToyCore


def restore_core(node_id: str, members: tuple[str, ...], durable: DurableState, *,
                 heartbeat_ticks: int) -> ToyCore:
    """`node_id`'s core, restarted from what survived (shared with the simulator setup)."""
    snapshot = None
    if durable.snapshot is not None and durable.snapshot_data is not None:
        snapshot = Snapshot(meta=durable.snapshot, data=durable.snapshot_data)
    return ToyCore(node_id=NodeId(node_id), members=tuple(NodeId(m) for m in members),
                   heartbeat_ticks=heartbeat_ticks, hard_state=durable.hard_state,
                   snapshot=snapshot, entries=durable.entries)


class ToyNode:
    """`ProtocolNode` for the toy protocol."""

    def checkpoint_policy(self, config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
        return CheckpointPolicy(every_entries=config.checkpoint.every_entries,
                                every_bytes=config.checkpoint.every_bytes,
                                compact_lag=compact_lag)

    def open_core_state_store(self, config: NodeConfig,
                              sync: SyncPolicy) -> CoreStateStore | None:
        return None

    def build_core(self, config: NodeConfig, *, durable: DurableState, rng: random.Random,
                   byzantine: str | None, pipeline_depth: int,
                   replica: Replica | None = None) -> BuiltCore:
        if byzantine is not None:
            raise ProtocolError(f"--byzantine {byzantine}: the toy protocol tolerates "
                                "crashes only")
        core = restore_core(config.id, tuple(config.members()), durable,
                            heartbeat_ticks=config.timing.heartbeat_ticks)
        return BuiltCore(core=core)


TOY_NODE = ToyNode()

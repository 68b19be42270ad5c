"""The toy protocol in the simulator (`TOY.sim`): built as `phalanx.jepsen.sim.raft.raft_setup`
is (a `Replica` over the KV app, cores restarted from durable state, cheap observation).

Owns: `toy_setup`. Knobs: `checkpoint_every` and `heartbeat_ticks`.
"""

from __future__ import annotations

import random
from typing import Any

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core
from phalanx.consensus.types import Configuration, NodeId
from phalanx.jepsen.sim.protocols import Knobs, Observation, ProtocolSetup
from phalanx.net import wire
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage
from toy_protocol.core import TERM, ToyCore
from toy_protocol.messages import TOY_MESSAGES
from toy_protocol.node import restore_core

SIM_HEARTBEAT_TICKS = 2


def toy_setup(*, nodes: int, bugs: frozenset[str], checkpoint_every: int = 200,
              knobs: Knobs = (), seed: int = 0, byzantine: int = 0,
              twins: int = 0) -> ProtocolSetup:
    """A toy cluster of `nodes` replicas `n1..nN` (`n1` leads); see
    `phalanx.jepsen.sim.protocols.protocol_setup`."""
    if byzantine or twins:
        raise ValueError("the toy protocol does not tolerate Byzantine replicas")
    if bugs:
        raise ValueError(f"the toy protocol has no deliberate bugs: {sorted(bugs)}")
    options: dict[str, Any] = dict(knobs)
    checkpoint_every = int(options.pop("checkpoint_every", checkpoint_every))
    heartbeat_ticks = int(options.pop("heartbeat_ticks", SIM_HEARTBEAT_TICKS))
    if options:
        raise TypeError(f"unknown toy knobs: {sorted(options)}")
    wire.register_all(TOY_MESSAGES)
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    bootstrap = Configuration(voters=tuple(NodeId(n) for n in names))

    def make_replica(node: str, storage: Storage, durable: DurableState) -> Replica:
        replica = Replica(
            KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
            decode_entry=wire.decode_entry,
            policy=CheckpointPolicy(every_entries=checkpoint_every, every_bytes=0,
                                    compact_lag=20),
            config=bootstrap)
        replica.restore_latest(replay_upto=0)  # the core re-emits what was committed after
        return replica

    def make_core(node: str, durable: DurableState, rng: random.Random) -> Core:
        return restore_core(node, names, durable, heartbeat_ticks=heartbeat_ticks)

    def observe(core: Core) -> Observation:
        assert isinstance(core, ToyCore)  # built by make_core above
        return ("leader" if core.is_leader else "follower"), TERM, core.commit

    return ProtocolSetup(names=names, codec=wire.default_registry(), make_core=make_core,
                         make_replica=make_replica, observe=observe, leader_role="leader",
                         description="toy: a fixed-leader log (test-only)")

"""A test-only protocol that proves protocols plug: `toy`, a fixed-leader replicated log.

Importing this package registers `TOY` with `phalanx.protocols` (so ``PHALANX_PROTOCOLS=
toy_protocol``, with ``tests/`` on the path, makes `phalanx` commands, nodes and the
simulator know it). Nothing in phalanx names it: the core (`toy_protocol.core`), its wire
types (`toy_protocol.messages`), its runtime half (`toy_protocol.node`) and its simulator
setup (`toy_protocol.sim`) are reached through the spec's lazy references only.
"""

from __future__ import annotations

from phalanx.protocols import CallStrategy, FaultModel, Lazy, ProtocolSpec, register

TOY = register(ProtocolSpec(
    name="toy",
    summary="toy (test-only): the lowest id leads forever; tolerates f crashed followers",
    fault_model=FaultModel.CRASH,
    call_strategy=CallStrategy.LEADER,
    leader_role="leader",
    roles=("leader", "follower"),
    messages=Lazy("toy_protocol.messages:TOY_MESSAGES"),
    node=Lazy("toy_protocol.node:TOY_NODE"),
    sim=Lazy("toy_protocol.sim:toy_setup"),
    sim_knobs=(("heartbeat_ticks", (1, 2, 4)), ("checkpoint_every", (25, 100, 400))),
))

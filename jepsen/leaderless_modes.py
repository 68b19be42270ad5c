"""The leaderless core's Byzantine modes on a real node (`ProtocolSpec.byzantine` of
``leaderless``): ``phalanx node run CONFIG --byzantine MODE``, the harness's
``--byzantine`` plans and the demo.

Owns: `LeaderlessByzantine` (`phalanx.protocols.spec.ByzantineSupport`) and its instance
`LEADERLESS_BYZANTINE`. Each mode is one `phalanx.jepsen.leaderless_byzantine` behaviour
(the ones `phalanx sim --protocol leaderless` draws its liars from, under the same names),
wrapped around the node's honest core: its persistence and execution stay honest, only its
messages lie, every lie signed with the node's own key. The state machine is untouched.

Must not import: trio, the runtime (loaded by `phalanx.runtime.node` only when a mode is
asked for).
"""

from __future__ import annotations

import random

from phalanx.apps.interface import StateMachine
from phalanx.consensus.core import Core
from phalanx.consensus.leaderless.messages import Transaction, TxId, transaction_id
from phalanx.jepsen.leaderless_byzantine import LEADERLESS_BEHAVIOURS, LeaderlessByzantineCore
from phalanx.ops.node_config import NodeConfig


class LeaderlessByzantine:
    """`ByzantineSupport` for the leaderless core: one behaviour per node."""

    modes: tuple[str, ...] = LEADERLESS_BEHAVIOURS

    def wrap_core(self, core: Core, mode: str, *, config: NodeConfig,
                  rng: random.Random) -> Core:
        from phalanx.ops.signing_keys import load_crypto
        from phalanx.protocols.leaderless_node import WireTxCodec

        encode = WireTxCodec().encode

        def tx_id(tx: Transaction) -> TxId:
            return transaction_id(tx, encode)

        return LeaderlessByzantineCore(core, behaviours=(mode,), crypto=load_crypto(config),
                                       rng=random.Random(rng.getrandbits(64)), tx_id=tx_id,
                                       nodes=sorted(config.members()))

    def wrap_machine(self, machine: StateMachine, mode: str,
                     rng: random.Random) -> StateMachine:
        return machine


LEADERLESS_BYZANTINE = LeaderlessByzantine()

"""Fault-tolerant gossip: GP rumor spreading over a seeded permutation, signed rumors,
push-pull anti-entropy and SWIM/Lifeguard membership, as a sans-IO machine plus a
deterministic simulator (issue 16; protocols.md §3; docs/GOSSIP.md).

Modules: `messages` (wire types, codec ids 550-579), `permutation` (the wave's π),
`spreading` (GP interval splitting), `rumors` (dedup, replay floors, GC), `membership`
(SWIM), `machine` (`GossipMachine`: the one entry point `step`), `sim` (the simulator).
Everything is sans-IO (the simulator too: virtual time, seeded faults): no trio, sockets,
clocks or global randomness. `Receive`, `Tick` and `Send` are the cores' own
(`phalanx.consensus.core`), re-exported for drivers.
"""

from phalanx.consensus.core import Receive, Send, Tick
from phalanx.gossip.machine import (
    BUGS,
    GossipConfig,
    GossipInput,
    GossipMachine,
    GossipReady,
    Publish,
    RumorCrypto,
)
from phalanx.gossip.membership import MembershipChange, SwimConfig
from phalanx.gossip.messages import (
    GOSSIP_MESSAGES,
    Call,
    CallAck,
    Digest,
    GossipMessage,
    Grant,
    MemberStatus,
    MemberUpdate,
    Ping,
    PingAck,
    PingReq,
    Rumor,
    RumorId,
    RumorPush,
)

__all__ = [
    "BUGS",
    "GOSSIP_MESSAGES",
    "Call",
    "CallAck",
    "Digest",
    "GossipConfig",
    "GossipInput",
    "GossipMachine",
    "GossipMessage",
    "GossipReady",
    "Grant",
    "MemberStatus",
    "MemberUpdate",
    "MembershipChange",
    "Ping",
    "PingAck",
    "PingReq",
    "Publish",
    "Receive",
    "Rumor",
    "RumorCrypto",
    "RumorId",
    "RumorPush",
    "Send",
    "SwimConfig",
    "Tick",
]

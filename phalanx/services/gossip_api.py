"""The gossip service's client-port operations (carried in `ServiceCall`/`ServiceReply`).

Owns: the wire types (ids 563-568 in the runtime range of `phalanx.net.wire`):
563 `GossipPublish` -> 564 `GossipPublished`; 565 `GossipStatusCall` -> 566 `GossipStatus`
(made of 567 `GossipDelivery` and 568 `GossipMember`). Publishing needs the read-write
role, status read-only (`phalanx.runtime.client_auth`).

`GossipDelivery.unix_ms` is the wall-clock time the node published or delivered the rumor
(for operators and the demo's publish-to-delivery figures; nodes of one machine share the
clock). Rules: pure data; no trio, clocks or I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipPublish(Message):
    """Publish `payload` as a rumor signed by the node that receives this call."""

    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipPublished(Message):
    """The rumor id the node gave the payload, and when it published it."""

    origin: str
    incarnation: int
    seq: int
    unix_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipStatusCall(Message):
    """Ask a node for its gossip status, with at most `max_rumors` recent deliveries."""

    max_rumors: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipDelivery(Message):
    """A rumor this node published (`origin` = the node) or delivered, and when."""

    origin: str
    incarnation: int
    seq: int
    payload: bytes
    unix_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipMember(Message):
    """One member as this node's SWIM view has it: status ALIVE, SUSPECT or DEAD."""

    node: str
    status: str
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipStatus(Message):
    """A node's gossip status: its incarnation, its newest deliveries (oldest first), its
    membership view of the other members, and its counters.

    `incarnation` is its SWIM incarnation (a refuted suspicion raises it);
    `started_incarnation` the one its process started with, which its rumor ids carry (the
    wall-clock ms of the start, `phalanx.services.gossip_node.next_incarnation`)."""

    node: str
    incarnation: int
    started_incarnation: int = 0
    deliveries: tuple[GossipDelivery, ...]
    members: tuple[GossipMember, ...]
    counters: tuple[tuple[str, int], ...]


GOSSIP_API_MESSAGES: dict[int, type] = {
    563: GossipPublish,
    564: GossipPublished,
    565: GossipStatusCall,
    566: GossipStatus,
    567: GossipDelivery,
    568: GossipMember,
}

"""The announce service's client-port operation (`ServiceCall`, read-only role).

Owns: 627 `AnnounceStatusCall` -> 628 `AnnounceStatus`, with 629 `AnnouncedCheckpoint`
(one linked cluster's highest verified announcement, or one of our own certified ones).
Ids from the top of the inter-cluster range's free block (620-629; 620-621 are the
service's peer types). Rules: pure data; no trio, clocks or I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnounceStatusCall(Message):
    """Ask a node what it announces and what it holds from each linked cluster."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncedCheckpoint(Message):
    """Cluster `cluster`'s checkpoint `index` with `state_digest`; `unix_ms`: when this node
    accepted it (a linked cluster's) or certified it (ours)."""

    cluster: str
    index: int
    state_digest: bytes
    unix_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnounceStatus(Message):
    """A node's announce view: its cluster, the newest checkpoint it signed, what it
    certified per linked cluster (`cluster` = the destination), the highest verified
    announcement per linked cluster (`cluster` = the origin), and its counters."""

    node: str
    cluster: str
    signed_index: int
    certified: tuple[AnnouncedCheckpoint, ...]
    received: tuple[AnnouncedCheckpoint, ...]
    counters: tuple[tuple[str, int], ...]


ANNOUNCE_API_MESSAGES: dict[int, type] = {
    627: AnnounceStatusCall,
    628: AnnounceStatus,
    629: AnnouncedCheckpoint,
}

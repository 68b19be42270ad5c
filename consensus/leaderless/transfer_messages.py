"""Wire types of the leaderless state transfer (`state_transfer.py`, docs/LEADERLESS.md
"State transfer"): codec ids 330-334.

Owns: `CheckpointQuery`, `CheckpointDescriptor`, `CheckpointDescriptors`, `FetchCheckpoint`,
`CheckpointChunk` and their ids `TRANSFER_MESSAGES` (merged into `messages.LEADERLESS_MESSAGES`).

None is signed: each counts as its sender's, which the transport authenticates
(`Receive.src`). Trust comes from agreement and hashing, not signatures: a node installs a
checkpoint only when f+1 distinct peers sent the same `CheckpointDescriptor` (one of them
correct) and the bytes it fetched hash to that descriptor's `state_digest`.

Must not import: `phalanx.net`, trio, clocks, random. Every class is a frozen, slotted,
keyword-only dataclass of ints and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointQuery(Message):
    """"What is your newest checkpoint?" (answered with a `CheckpointDescriptor`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDescriptor(Message):
    """What identifies a replica checkpoint across replicas (they number entries locally,
    so the applied index is not part of it).

    Attributes:
        applied_digest: order-free digest of the applied set the checkpoint's transaction
            table holds (SHA-256 of the sum mod 2^256 of SHA-256(tx id) over its ids).
        state_digest: SHA-256 of the checkpoint rebased to index 0 (transaction table and
            application state): what a fetched checkpoint must hash to.
        size: length of those bytes.
        tx_count: transactions in the table.
        max_deadline_ms: the largest deadline applied (the table's collection point).
    """

    applied_digest: bytes
    state_digest: bytes
    size: int
    tx_count: int
    max_deadline_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDescriptors(Message):
    """The answer to a `CheckpointQuery` of a node that vouches for several of the
    checkpoints it retains (newest first; at most `state_transfer.RETAINED`; one is sent as
    a plain `CheckpointDescriptor`). Each counts as one report of its sender."""

    descriptors: tuple[CheckpointDescriptor, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchCheckpoint(Message):
    """Ask for the bytes of the checkpoint `state_digest` from `offset` on."""

    state_digest: bytes
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointChunk(Message):
    """Bytes `[offset, offset + len(data))` of the checkpoint `state_digest` (rebased to 0)."""

    state_digest: bytes
    offset: int
    data: bytes


TRANSFER_MESSAGES: dict[int, type] = {
    330: CheckpointQuery,
    331: CheckpointDescriptor,
    332: FetchCheckpoint,
    333: CheckpointChunk,
    334: CheckpointDescriptors,
}
"""Stable codec ids (never renumber); 335-339 are free for more state-transfer messages."""

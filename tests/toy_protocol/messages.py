"""The toy protocol's wire messages: a fixed leader's appends, snapshots, and followers' acks.

Owns: `ToyAppend`, `ToyAck`, `ToySnapshot` and their stable codec ids in `TOY_MESSAGES`
(the plug-in range of `phalanx.net.wire.RANGES`, 1000-1999: the toy takes 1000-1009).

Rules: pure data (frozen slotted dataclasses of ints, bytes, bools and `Entry` tuples, so
`phalanx.net.codec` encodes them); no validation that depends on node state (the core drops
and counts a malformed message).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Entry, Message


@dataclass(frozen=True, slots=True, kw_only=True)
class ToyAppend(Message):
    """Leader -> follower: the entries after index `prev` (none: a heartbeat), and the
    leader's commit index."""

    prev: int
    entries: tuple[Entry, ...]
    commit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ToyAck(Message):
    """Follower -> leader: my log holds, durably, every entry up to `match` (the leader's
    entries: only the leader writes the log). `gap`: an append did not reach my log's end,
    send from `match + 1`."""

    match: int
    gap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ToySnapshot(Message):
    """Leader -> follower: the state after applying index `index` (the follower needs
    entries the leader's log no longer holds), the leader's commit index, and `digest`, the
    SHA-256 of `data` (a corrupted snapshot is dropped, never installed)."""

    index: int
    data: bytes
    commit: int
    digest: bytes


TOY_MESSAGES: dict[int, type] = {1000: ToyAppend, 1001: ToyAck, 1002: ToySnapshot}
"""Stable codec ids (never renumber)."""

"""State transfer of the leaderless core: catching up from a peer's checkpoint when the
transactions missed are past the GC horizon (docs/LEADERLESS.md "State transfer").

Owns: `StateTransfer`, the sans-IO machine of both sides. Serving: the newest checkpoint
the replica layer took (`CheckpointTaken`), described lazily (`CheckpointFormat.describe`),
vouched for only while it is this node's current state (nothing applied since), and served
in `CHUNK_BYTES` pieces rebased to index 0. Fetching, while `need` is set: ask
every peer for its newest `CheckpointDescriptor` each `every` ticks; once f+1 distinct peers
sent the SAME descriptor (so a correct one holds that state), fetch its bytes from one of
them, falling back to the next on a timeout or on bytes that do not hash to the
descriptor's `state_digest`; a verified checkpoint comes out of `on_chunk` as `Verified`
(the core decides whether it is ahead of this node, and installs it).

`CheckpointFormat` is injected (the runtime half reads the replica's checkpoint envelope:
`phalanx.protocols.leaderless_node.EnvelopeFormat`): the core never parses app bytes.

Rules: peer input never raises (dropped and counted through `drop`: `forged_checkpoint`,
`oversized_checkpoint`, `unexpected_checkpoint_chunk`, `unknown_checkpoint`); a descriptor
counts as its sender's latest (one vote per peer); nothing here is signed or persisted.
Deterministic: peers are walked in sorted order, agreement picks the greatest descriptor.

Must not import: trio, sockets, clocks, global random, `phalanx.net`, `phalanx.apps`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from phalanx.consensus.core import Send, SnapshotData
from phalanx.consensus.leaderless.transfer_messages import (
    CheckpointChunk,
    CheckpointDescriptor,
    CheckpointQuery,
    FetchCheckpoint,
)
from phalanx.consensus.types import NodeId

CHUNK_BYTES = 1 << 20
"""Bytes per `CheckpointChunk` (frames allow 16 MiB)."""

MAX_CHECKPOINT_BYTES = 1 << 32
"""A descriptor announcing a larger checkpoint is dropped (`oversized_checkpoint`)."""

NO_CHECKPOINT = CheckpointDescriptor(applied_digest=b"", state_digest=b"", size=0, tx_count=0,
                                     max_deadline_ms=0)
"""The answer of a node that has no checkpoint yet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Described:
    """A checkpoint as this node serves it: its descriptor, and how to read its bytes
    rebased to index 0 (`header` followed by the raw data from `body` on)."""

    descriptor: CheckpointDescriptor
    header: bytes
    body: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Verified:
    """A fetched checkpoint whose bytes hash to the agreed descriptor."""

    descriptor: CheckpointDescriptor
    data: bytes
    """Rebased to index 0."""
    applied: dict[bytes, int]
    """Its transaction table: tx id -> deadline (ms)."""


class CheckpointFormat(Protocol):
    """How the core reads the replica's checkpoints (pure functions; none raises)."""

    def describe(self, data: SnapshotData) -> Described | None:
        """The descriptor of checkpoint `data`, or None when it is not a transaction-mode
        replica checkpoint."""
        ...

    def applied(self, data: bytes) -> dict[bytes, int] | None:
        """The transaction table of `data` (id -> deadline), None when malformed."""
        ...

    def rebase(self, data: bytes, index: int) -> bytes | None:
        """`data` with its applied index set to `index`, None when malformed."""
        ...


def state_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class StateTransfer:
    """Both sides of the state transfer (see the module docstring)."""

    def __init__(self, *, fmt: CheckpointFormat, peers: tuple[NodeId, ...], faults: int,
                 every: int, drop: Callable[[str], None], check_digest: bool = True) -> None:
        self._fmt = fmt
        self._peers = tuple(sorted(peers))
        self._faults = faults
        self._every = max(1, every)
        self._drop = drop
        self._check_digest = check_digest
        self.need = False
        self.reason = ""
        self.installs = 0
        self._own_data: SnapshotData | None = None
        self._own_index = -1
        self._own: Described | None = None
        self._reports: dict[NodeId, CheckpointDescriptor] = {}
        self._refused: set[bytes] = set()  # state digests found behind or failed everywhere
        self._target: CheckpointDescriptor | None = None
        self._servers: list[NodeId] = []
        self._buffer = bytearray()
        self._quiet = 0  # ticks since the last progress of the fetch or the last query

    # -------------------------------------------------------------------- serving side

    def taken(self, data: SnapshotData, index: int) -> None:
        """The replica layer made a checkpoint of the state after local `index` durable:
        serve that one from now on."""
        self._own_data = data
        self._own_index = index
        self._own = None

    def own(self) -> Described | None:
        if self._own is None and self._own_data is not None:
            self._own = self._fmt.describe(self._own_data)
            if self._own is None:
                self._own_data = None
        return self._own

    def on_query(self, src: NodeId, applied: int) -> list[Send]:
        """Our newest descriptor if it is our CURRENT state (nothing applied since it was
        taken, `applied` = its index: a quiet point), else `NO_CHECKPOINT` (an answer all
        the same: the asker's silence detector counts it). Vouching only for the current
        state is what makes an agreed checkpoint complete: whatever a correct peer applies
        after it is committed later, so still within the horizon and fetchable."""
        own = self.own() if applied == self._own_index else None
        return [Send(to=src, message=own.descriptor if own is not None else NO_CHECKPOINT)]

    def on_fetch(self, src: NodeId, msg: FetchCheckpoint) -> list[Send]:
        own = self.own()
        if (own is None or msg.state_digest != own.descriptor.state_digest
                or not 0 <= msg.offset < own.descriptor.size):
            self._drop("unknown_checkpoint")  # superseded meanwhile, or a bad request
            return []
        return [Send(to=src, message=CheckpointChunk(
            state_digest=own.descriptor.state_digest, offset=msg.offset,
            data=self._read(own, msg.offset, CHUNK_BYTES)))]

    def _read(self, own: Described, offset: int, length: int) -> bytes:
        assert self._own_data is not None  # `own()` returned a description of it
        header = own.header
        end = min(offset + length, own.descriptor.size)
        parts = []
        if offset < len(header):
            parts.append(header[offset:min(end, len(header))])
        lo, hi = max(offset, len(header)), end
        if hi > lo:
            shift = own.body - len(header)
            parts.append(self._own_data[lo + shift:hi + shift])
        return b"".join(parts)

    # -------------------------------------------------------------------- fetching side

    def want(self, reason: str) -> None:
        """This node may be past the GC horizon (`reason`, for status): start asking."""
        if not self.need:
            self.need, self.reason = True, reason
            self._quiet = self._every  # ask at the next tick

    def tick(self) -> list[Send]:
        if not self.need:
            return []
        self._quiet += 1
        if self._target is not None:
            if self._quiet >= 2 * self._every:  # the server went quiet: the next one
                return self._next_server()
            return []
        if self._quiet >= self._every:
            self._quiet = 0
            self._reports.clear()  # agreement among this round's answers only
            return [Send(to=peer, message=CheckpointQuery()) for peer in self._peers]
        return []

    def on_descriptor(self, src: NodeId, msg: CheckpointDescriptor) -> list[Send]:
        if msg == NO_CHECKPOINT:
            self._reports.pop(src, None)
            return []
        if (msg.size > MAX_CHECKPOINT_BYTES or msg.size < 0 or len(msg.state_digest) != 32
                or len(msg.applied_digest) != 32):
            self._drop("oversized_checkpoint")
            return []
        self._reports[src] = msg
        if not self.need or self._target is not None:
            return []
        own = self.own()
        counts: dict[CheckpointDescriptor, int] = {}
        for d in self._reports.values():
            counts[d] = counts.get(d, 0) + 1
        agreed = [d for d, c in counts.items()
                  if c > self._faults and d.state_digest not in self._refused]
        if not agreed:
            return []
        best = max(agreed, key=lambda d: (d.max_deadline_ms, d.tx_count, d.state_digest))
        if own is not None and own.descriptor == best:
            self.done()  # this node holds the state f+1 peers report: nothing to fetch
            return []
        self._target = best
        self._servers = sorted(p for p, d in self._reports.items() if d == best)
        self._buffer = bytearray()
        self._quiet = 0
        return self._ask()

    def _ask(self) -> list[Send]:
        assert self._target is not None
        assert self._servers
        return [Send(to=self._servers[0], message=FetchCheckpoint(
            state_digest=self._target.state_digest, offset=len(self._buffer)))]

    def _next_server(self) -> list[Send]:
        """Give up on the current server (its bytes start again from 0 elsewhere)."""
        self._servers.pop(0)
        self._buffer = bytearray()
        self._quiet = 0
        if not self._servers:
            self.refuse()
            return []
        return self._ask()

    def refuse(self) -> None:
        """The target is behind this node or no server gave it: wait for another."""
        if self._target is not None:
            self._refused.add(self._target.state_digest)
        self._target = None
        self._servers = []
        self._buffer = bytearray()

    def done(self) -> None:
        self.need, self.reason = False, ""
        self._target = None
        self._servers = []
        self._buffer = bytearray()
        self._reports.clear()

    def on_chunk(self, src: NodeId, msg: CheckpointChunk) -> tuple[list[Send], Verified | None]:
        target = self._target
        if (target is None or not self._servers or src != self._servers[0]
                or msg.state_digest != target.state_digest or msg.offset != len(self._buffer)):
            self._drop("unexpected_checkpoint_chunk")
            return [], None
        if not msg.data or len(self._buffer) + len(msg.data) > target.size:
            self._drop("forged_checkpoint")
            return self._next_server(), None
        self._buffer += msg.data
        self._quiet = 0
        if len(self._buffer) < target.size:
            return self._ask(), None
        data = bytes(self._buffer)
        applied = self._fmt.applied(data)
        if applied is None or (self._check_digest and (
                state_digest(data) != target.state_digest
                or _descriptor_of(self._fmt, data) != target)):
            self._drop("forged_checkpoint")
            return self._next_server(), None
        return [], Verified(descriptor=target, data=data, applied=applied)


def _descriptor_of(fmt: CheckpointFormat, data: bytes) -> CheckpointDescriptor | None:
    described = fmt.describe(data)
    return described.descriptor if described is not None else None

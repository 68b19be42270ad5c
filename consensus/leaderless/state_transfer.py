"""State transfer of the leaderless core: catching up from a peer's checkpoint when the
transactions missed are past the GC horizon (docs/LEADERLESS.md "State transfer").

Owns: `StateTransfer`, the sans-IO machine of both sides. Serving: the last `RETAINED`
checkpoints the replica layer took (`CheckpointTaken`), described lazily
(`CheckpointFormat.describe`), each vouched for only while the core says what was applied
after it can still be fetched (`vouch`: nothing applied since, or every later release still
held with its proof for half a horizon: `catch_up.py`), and served in `CHUNK_BYTES` pieces
rebased to index 0. Fetching, while `need` is set: ask every peer for the descriptors it
vouches for each `every` ticks; once f+1 distinct peers sent the SAME descriptor (so a
correct one held that state), fetch its bytes from one of them, falling back to the next on
a timeout or on bytes that do not hash to the descriptor's `state_digest`; a verified
checkpoint comes out of `on_chunk` as `Verified` (the core decides whether it is ahead of
this node, and installs it).

Coverage rule (issue 15, docs/LEADERLESS.md "An install never undoes a forgotten apply"): a
verified checkpoint whose transaction table lacks an id of `forgotten(max_deadline_ms)` (what
this node's replica applied, that a table reaching that newest deadline still records, and
that the core no longer holds, so could not apply again) is refused (`lacking`, counted in
`refused_lacking`) and the next agreed descriptor of the round is tried at once; none left:
the node keeps its own state and keeps asking.

`CheckpointFormat` is injected (the runtime half reads the replica's checkpoint envelope:
`phalanx.protocols.leaderless_node.EnvelopeFormat`): the core never parses app bytes.

Rules: peer input never raises (dropped and counted through `drop`: `forged_checkpoint`,
`oversized_checkpoint`, `unexpected_checkpoint_chunk`, `unknown_checkpoint`); a peer's
answer replaces its previous one (at most `RETAINED` descriptors, one vote each); a refused
state digest (behind, lacking, or failed at every server) is never fetched again; nothing
here is signed or persisted.
Deterministic: peers are walked in sorted order, agreement picks the greatest descriptor.

Must not import: trio, sockets, clocks, global random, `phalanx.net`, `phalanx.apps`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.consensus.core import Send, SnapshotData
from phalanx.consensus.leaderless.transfer_messages import (
    CheckpointChunk,
    CheckpointDescriptor,
    CheckpointDescriptors,
    CheckpointQuery,
    FetchCheckpoint,
)
from phalanx.consensus.types import NodeId

CHUNK_BYTES = 1 << 20
"""Bytes per `CheckpointChunk` (frames allow 16 MiB)."""

MAX_CHECKPOINT_BYTES = 1 << 32
"""A descriptor announcing a larger checkpoint is dropped (`oversized_checkpoint`)."""

RETAINED = 3
"""Checkpoints a node keeps serving (the newest ones taken; the file store keeps as many on
disk, and a runtime view keeps its file open anyway)."""

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


@dataclass(slots=True)
class _Held:
    """A retained checkpoint: taken after local `index`; described on first need."""

    index: int
    data: SnapshotData
    described: Described | None = None
    broken: bool = False


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


def nothing_forgotten(max_deadline_ms: int) -> Sequence[bytes]:
    """The default `forgotten`: no coverage check (a node whose replica keeps no table)."""
    return ()


def lacking(applied: dict[bytes, int], forgotten: Sequence[bytes]) -> list[bytes]:
    """The ids of `forgotten` that a checkpoint's transaction table `applied` lacks (in
    `forgotten`'s order): installing it would undo their applies here for good."""
    return [t for t in forgotten if t not in applied]


class StateTransfer:
    """Both sides of the state transfer (see the module docstring)."""

    def __init__(self, *, fmt: CheckpointFormat, peers: tuple[NodeId, ...], faults: int,
                 every: int, drop: Callable[[str], None], check_digest: bool = True,
                 forgotten: Callable[[int], Sequence[bytes]] = nothing_forgotten) -> None:
        """`forgotten(max_deadline_ms)`: the ids this node applied that a transaction table
        whose newest deadline is `max_deadline_ms` still records and that this node could
        not apply again (the coverage rule, module docstring)."""
        self._fmt = fmt
        self._forgotten = forgotten
        self.refused_lacking = 0
        """Verified checkpoints refused by the coverage rule."""
        self._peers = tuple(sorted(peers))
        self._faults = faults
        self._every = max(1, every)
        self._drop = drop
        self._check_digest = check_digest
        self.need = False
        self.reason = ""
        self.installs = 0
        self._held: list[_Held] = []  # oldest first, at most RETAINED
        self._reports: dict[NodeId, tuple[CheckpointDescriptor, ...]] = {}
        self._refused: set[bytes] = set()  # state digests found behind or failed everywhere
        self._target: CheckpointDescriptor | None = None
        self._servers: list[NodeId] = []
        self._buffer = bytearray()
        self._quiet = 0  # ticks since the last progress of the fetch or the last query

    # -------------------------------------------------------------------- serving side

    def taken(self, data: SnapshotData, index: int) -> None:
        """The replica layer made a checkpoint of the state after local `index` durable:
        serve it too (the oldest of `RETAINED` + 1 goes)."""
        self._held = [h for h in self._held if h.index < index][-(RETAINED - 1):]
        self._held.append(_Held(index=index, data=data))

    def floor(self) -> int | None:
        """The local index of the oldest retained checkpoint (None: none retained)."""
        return self._held[0].index if self._held else None

    def is_last_chunk(self, chunk: CheckpointChunk) -> bool:
        """`chunk` (served here) ends its checkpoint."""
        held = self._served(chunk.state_digest)
        own = held.described if held is not None else None
        return own is not None and chunk.offset + len(chunk.data) >= own.descriptor.size

    def _describe(self, held: _Held) -> Described | None:
        if held.described is None and not held.broken:
            held.described = self._fmt.describe(held.data)
            held.broken = held.described is None
        return held.described

    def own(self) -> Described | None:
        """The newest checkpoint's description (None: none, or not describable)."""
        return self._describe(self._held[-1]) if self._held else None

    def on_query(self, src: NodeId, vouch: Callable[[int], bool]) -> list[Send]:
        """The descriptors of the retained checkpoints `vouch(index)` accepts, newest first
        (one: a plain `CheckpointDescriptor`), else `NO_CHECKPOINT` (an answer all the same:
        the asker's silence detector counts it). Vouching only for a checkpoint whose later
        applies are all still fetchable here is what makes an agreed checkpoint complete: the
        asker installs it, then fetches the rest (docs/LEADERLESS.md "State transfer")."""
        found: list[CheckpointDescriptor] = []
        for held in reversed(self._held):
            if vouch(held.index):
                described = self._describe(held)
                if described is not None and described.descriptor not in found:
                    found.append(described.descriptor)
        if len(found) > 1:
            return [Send(to=src, message=CheckpointDescriptors(descriptors=tuple(found)))]
        return [Send(to=src, message=found[0] if found else NO_CHECKPOINT)]

    def _served(self, state_digest: bytes) -> _Held | None:
        for held in reversed(self._held):
            described = held.described
            if described is not None and described.descriptor.state_digest == state_digest:
                return held
        return None

    def on_fetch(self, src: NodeId, msg: FetchCheckpoint) -> list[Send]:
        held = self._served(msg.state_digest)
        own = held.described if held is not None else None
        if held is None or own is None or not 0 <= msg.offset < own.descriptor.size:
            self._drop("unknown_checkpoint")  # superseded meanwhile, or a bad request
            return []
        return [Send(to=src, message=CheckpointChunk(
            state_digest=own.descriptor.state_digest, offset=msg.offset,
            data=self._read(held.data, own, msg.offset, CHUNK_BYTES)))]

    @staticmethod
    def _read(data: SnapshotData, own: Described, offset: int, length: int) -> bytes:
        header = own.header
        end = min(offset + length, own.descriptor.size)
        parts = []
        if offset < len(header):
            parts.append(header[offset:min(end, len(header))])
        lo, hi = max(offset, len(header)), end
        if hi > lo:
            shift = own.body - len(header)
            parts.append(data[lo + shift:hi + shift])
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

    def on_descriptor(self, src: NodeId,
                      msg: CheckpointDescriptor | CheckpointDescriptors) -> list[Send]:
        """A peer's answer (it replaces the peer's earlier one of this round)."""
        got = msg.descriptors if isinstance(msg, CheckpointDescriptors) else (msg,)
        if not isinstance(got, tuple) or len(got) > RETAINED or not got:
            self._drop("oversized_checkpoint")
            return []
        if got == (NO_CHECKPOINT,):
            self._reports.pop(src, None)
            return []
        for d in got:
            if (not isinstance(d, CheckpointDescriptor) or d.size > MAX_CHECKPOINT_BYTES
                    or d.size < 0 or len(d.state_digest) != 32 or len(d.applied_digest) != 32):
                self._drop("oversized_checkpoint")
                return []
        self._reports[src] = tuple(dict.fromkeys(got))
        return self._choose()

    def _choose(self) -> list[Send]:
        """Fetch the greatest descriptor f+1 peers of this round agree on and that was not
        refused, if any and nothing is being fetched."""
        if not self.need or self._target is not None:
            return []
        own = self.own()
        counts: dict[CheckpointDescriptor, int] = {}
        for reported in self._reports.values():
            for d in reported:
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
        self._servers = sorted(p for p, ds in self._reports.items() if best in ds)
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
        if lacking(applied, self._forgotten(target.max_deadline_ms)):
            # A correct replica's state (f+1 agree) that never applied something this node
            # applied, answered and forgot: installing it would undo that write for good.
            self.refused_lacking += 1
            self.refuse()
            return self._choose(), None
        return [], Verified(descriptor=target, data=data, applied=applied)


def _descriptor_of(fmt: CheckpointFormat, data: bytes) -> CheckpointDescriptor | None:
    described = fmt.describe(data)
    return described.descriptor if described is not None else None

"""The toy protocol's core: a fixed-leader replicated log (test-only; proves protocols plug).

Owns: `ToyCore`, a sans-IO `phalanx.consensus.core.Core`. The lowest node id leads forever;
it appends client requests to its log (one entry each), replicates them, and commits an
index once a majority (itself included) holds it durably. Followers append what the leader
sends, ack what is durable, apply what the leader says is committed, and reject client
requests with a hint naming the leader. Nothing is elected: while the leader is down or cut
off, commits pause.

Invariants:
- Only the leader writes log entries, and it never loses a durable one (entries are synced
  before they are sent or counted), so every log is a prefix of the leader's: a follower
  may trust any index it holds and commit ``min(leader commit, its last index)``.
- The leader sends an entry only after it is durable (`Ready.messages` of the Ready that
  appended it, or a retransmission bounded by the indices `Persisted` confirmed) and counts
  its own log only up to what `Persisted` confirmed; a follower acks only in the `messages`
  of a Ready, after what it appended is durable.
- Reads: the leader answers a read at its last log index (every write acknowledged before
  the read began is there), once that index is applied.
- Hostile or malformed peer input is dropped and counted in `status().dropped`, never
  raised; our own misuse (`Persisted` of a number never issued) raises
  `LocalProtocolError`. Deterministic: no clocks, no randomness, followers in sorted order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from phalanx.consensus.core import (
    EMPTY_READY,
    CheckpointInstalled,
    CheckpointTaken,
    CoreStatus,
    Input,
    Persisted,
    ReadState,
    Ready,
    Receive,
    Rejection,
    Send,
    Snapshot,
    SnapshotData,
    Submit,
    Tick,
    snapshot_bytes,
)
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
    SnapshotMeta,
)
from toy_protocol.messages import ToyAck, ToyAppend, ToySnapshot

TERM = 1
"""The only term: the leader never changes (the simulator's election-safety check and the
status vocabulary still speak of terms)."""

MAX_BATCH = 64
"""Entries per append."""

RETRY_HEARTBEATS = 3
"""Heartbeats without progress (a follower's ack moving its match, or nothing outstanding)
before the leader resends what the follower has not acked."""

LOG_TAIL = 64
"""Entries kept in memory below a checkpoint, so a briefly lagging follower catches up from
the log instead of a snapshot."""


class ToyCore:
    """A fixed-leader log. `members` is the whole cluster (this node included); the lowest id
    leads. Restored from `hard_state`, a checkpoint (`snapshot`) and the log `entries` after
    it, as `phalanx.runtime.persistence.DurableState` holds them."""

    def __init__(self, *, node_id: NodeId, members: Sequence[NodeId], heartbeat_ticks: int = 1,
                 hard_state: HardState | None = None, snapshot: Snapshot | None = None,
                 entries: Sequence[Entry] = ()) -> None:
        ids = tuple(sorted(set(members)))
        if node_id not in ids:
            raise LocalProtocolError(f"{node_id} is not one of the members {ids}")
        if heartbeat_ticks < 1:
            raise LocalProtocolError(f"heartbeat_ticks must be >= 1, got {heartbeat_ticks}")
        self._id = node_id
        self._members = ids
        self._leader = ids[0]
        self._followers = ids[1:] if node_id == ids[0] else ()
        self._heartbeat_ticks = heartbeat_ticks
        self._snap_index = snapshot.meta.index if snapshot is not None else 0
        self._snap_data: SnapshotData | None = snapshot.data if snapshot is not None else None
        self._start = self._snap_index  # the index before the first entry in `_log`
        self._log: list[Entry] = [e for e in entries if e.index > self._start]
        for offset, entry in enumerate(self._log):
            if entry.index != self._start + 1 + offset:
                raise LocalProtocolError(f"restored log is not contiguous at {entry.index}")
        restored = hard_state.commit if hard_state is not None else 0
        self._commit = min(max(restored, self._snap_index), self.last_index)
        self._applied = self._snap_index  # the replica restores only the checkpoint
        self._written: HardState | None = hard_state
        self._number = 0
        self._pending: list[tuple[int, int]] = []  # (Ready number, last index it wrote)
        self._durable = self.last_index  # what survived a restart is durable
        self._match = {f: 0 for f in self._followers}
        self._next = {f: self.last_index + 1 for f in self._followers}
        self._known = {f: False for f in self._followers}
        self._stall = {f: 0 for f in self._followers}
        self._ticks = 0
        self._dropped: dict[str, int] = {}

    # -- Core -------------------------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        return self._id

    @property
    def is_leader(self) -> bool:
        return self._id == self._leader

    @property
    def commit(self) -> int:
        return self._commit

    @property
    def last_index(self) -> int:
        return self._start + len(self._log)

    def status(self) -> CoreStatus:
        return CoreStatus(node=self._id, role="leader" if self.is_leader else "follower",
                          term=TERM, commit_index=self._commit, leader=self._leader,
                          dropped=dict(sorted(self._dropped.items())))

    def step(self, inp: Input, /) -> Ready:
        out = _Out()
        kind = type(inp)
        if kind is Receive:
            assert isinstance(inp, Receive)
            self._receive(inp.src, inp.message, out)
        elif kind is Tick:
            self._tick(out)
        elif kind is Submit:
            assert isinstance(inp, Submit)
            self._submit(inp.request, out)
        elif kind is Persisted:
            assert isinstance(inp, Persisted)
            self._persisted(inp.number, out)
        elif kind is CheckpointTaken:
            assert isinstance(inp, CheckpointTaken)
            self._checkpoint(inp.index, inp.data)
        elif kind is not CheckpointInstalled:  # never asked for: nothing to do
            raise LocalProtocolError(f"ToyCore cannot step {kind.__name__}")
        return self._ready(out)

    # -- inputs -----------------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _receive(self, src: NodeId, message: Message, out: _Out) -> None:
        if src not in self._members or src == self._id:
            self._drop("unknown-sender")
        elif type(message) is ToyAck:
            if not self.is_leader:
                self._drop("not-leader")
            elif not (_count(message.match) and type(message.gap) is bool):
                self._drop("malformed")
            elif message.match > self.last_index:
                self._drop("ack-beyond-log")
            else:
                self._on_ack(src, message, out)
        elif type(message) is ToyAppend or type(message) is ToySnapshot:
            if src != self._leader:
                self._drop("not-from-leader")
            elif type(message) is ToyAppend:
                self._on_append(message, out)
            else:
                assert isinstance(message, ToySnapshot)
                self._on_snapshot(message, out)
        else:
            self._drop("unknown-message")

    def _submit(self, request: ClientRequest, out: _Out) -> None:
        if not self.is_leader:
            out.rejected.append(Rejection(request=request, reason="not the leader",
                                          leader_hint=self._leader))
            return
        if request.read_only:
            out.reads.append(ReadState(request=request, index=self.last_index))
            return
        entry = Entry(index=self.last_index + 1, term=TERM, kind=EntryKind.COMMAND,
                      requests=(request,))
        self._log.append(entry)
        out.entries.append(entry)
        for f in self._followers:  # in this Ready's messages: sent once it is durable
            if self._known[f] and self._next[f] == entry.index:
                out.send(f, ToyAppend(prev=entry.index - 1, entries=(entry,),
                                      commit=self._commit))
                self._next[f] = entry.index + 1

    def _persisted(self, number: int, out: _Out) -> None:
        if number > self._number:
            raise LocalProtocolError(f"Persisted({number}): the last Ready was {self._number}")
        while self._pending and self._pending[0][0] <= number:
            self._durable = max(self._durable, self._pending.pop(0)[1])
        self._advance_commit()

    def _checkpoint(self, index: int, data: SnapshotData) -> None:
        if index <= self._snap_index or index > self._applied:
            return
        self._snap_index, self._snap_data = index, data
        keep_from = index - LOG_TAIL  # keep the entries after it
        if keep_from > self._start:
            del self._log[: keep_from - self._start]
            self._start = keep_from

    def _tick(self, out: _Out) -> None:
        self._ticks += 1
        if not self._followers or self._ticks % self._heartbeat_ticks:
            return
        for f in self._followers:
            self._stall[f] += 1
            if self._stall[f] >= RETRY_HEARTBEATS:  # lost in flight: resend from the ack
                self._stall[f] = 0
                self._next[f] = self._match[f] + 1
            self._send_to(f, out)

    # -- leader -----------------------------------------------------------------------------

    def _send_to(self, f: NodeId, out: _Out) -> None:
        """The next thing follower `f` needs: a probe, a snapshot, entries, or a heartbeat."""
        if not self._known[f]:  # after a restart: where is it? (a gap answer says)
            out.send(f, ToyAppend(prev=self._durable, entries=(), commit=self._commit))
            return
        start = self._next[f]
        if start <= self._start:
            if self._snap_data is not None:
                data = snapshot_bytes(self._snap_data)
                out.send(f, ToySnapshot(index=self._snap_index, data=data,
                                        commit=self._commit,
                                        digest=hashlib.sha256(data).digest()))
                self._next[f] = self._snap_index + 1
        elif start <= self._durable:
            end = min(self._durable, start + MAX_BATCH - 1)
            batch = tuple(self._log[start - self._start - 1: end - self._start])
            out.send(f, ToyAppend(prev=start - 1, entries=batch, commit=self._commit))
            self._next[f] = end + 1
        else:
            out.send(f, ToyAppend(prev=self._match[f], entries=(), commit=self._commit))

    def _on_ack(self, f: NodeId, ack: ToyAck, out: _Out) -> None:
        if ack.match > self._match[f] or ack.match + 1 >= self._next[f]:
            self._stall[f] = 0  # progress, or nothing outstanding (not: a heartbeat's echo)
        if ack.gap or not self._known[f]:
            self._known[f] = True
            self._match[f] = ack.match
            self._next[f] = ack.match + 1
        else:
            self._match[f] = max(self._match[f], ack.match)
            self._next[f] = max(self._next[f], self._match[f] + 1)
        self._advance_commit()
        if self._next[f] <= self._durable:  # catching up: keep the pipe full
            self._send_to(f, out)

    def _advance_commit(self) -> None:
        if not self.is_leader:
            return
        held = sorted([self._durable, *self._match.values()], reverse=True)
        top = min(held[len(self._members) // 2], self.last_index)
        if top > self._commit:
            self._commit = top

    # -- follower ---------------------------------------------------------------------------

    def _on_append(self, m: ToyAppend, out: _Out) -> None:
        if not (_count(m.prev) and _count(m.commit) and type(m.entries) is tuple
                and all(type(e) is Entry and e.index == m.prev + 1 + i
                        and e.kind is EntryKind.COMMAND for i, e in enumerate(m.entries))):
            self._drop("malformed")
            return
        last = self.last_index
        if m.prev > last:
            out.send(self._leader, ToyAck(match=last, gap=True))
        else:
            new = [e for e in m.entries if e.index > last]
            self._log.extend(new)
            out.entries.extend(new)
            out.send(self._leader, ToyAck(match=self.last_index))
        self._commit = max(self._commit, min(m.commit, self.last_index))

    def _on_snapshot(self, m: ToySnapshot, out: _Out) -> None:
        if not (_count(m.index) and _count(m.commit) and type(m.data) is bytes):
            self._drop("malformed")
            return
        if type(m.digest) is not bytes or hashlib.sha256(m.data).digest() != m.digest:
            self._drop("snapshot-digest")
            return
        if m.index <= self.last_index:  # nothing to install: say where the log ends
            out.send(self._leader, ToyAck(match=self.last_index))
            return
        meta = SnapshotMeta(index=m.index, term=TERM, config=Configuration(voters=self._members))
        out.snapshot = Snapshot(meta=meta, data=m.data)
        out.entries.clear()
        self._log.clear()
        self._start = self._snap_index = self._applied = self._commit = m.index
        self._snap_data = m.data
        out.send(self._leader, ToyAck(match=m.index))

    # -- output -----------------------------------------------------------------------------

    def _ready(self, out: _Out) -> Ready:
        committed: tuple[Entry, ...] = ()
        upto = min(self._commit, self.last_index)
        if upto > self._applied:
            committed = tuple(self._log[self._applied - self._start: upto - self._start])
            self._applied = upto
        hard_state = None
        if self._written is None or self._written.commit != self._commit:
            hard_state = self._written = HardState(term=TERM, commit=self._commit)
        persists = bool(out.entries) or out.snapshot is not None or hard_state is not None
        if not (persists or out.messages or committed or out.rejected or out.reads):
            return EMPTY_READY
        number = 0
        if persists:
            self._number += 1
            number = self._number
            if out.entries and self.is_leader:
                self._pending.append((number, self.last_index))
        return Ready(number=number, snapshot=out.snapshot, entries=tuple(out.entries),
                     hard_state=hard_state,
                     must_sync=bool(out.entries) or out.snapshot is not None,
                     messages=tuple(out.messages), committed=committed,
                     reads=tuple(out.reads), rejected=tuple(out.rejected))


class _Out:
    """What one step produces (turned into a `Ready` by `ToyCore._ready`)."""

    __slots__ = ("entries", "messages", "reads", "rejected", "snapshot")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.messages: list[Send] = []
        self.reads: list[ReadState] = []
        self.rejected: list[Rejection] = []
        self.snapshot: Snapshot | None = None

    def send(self, to: NodeId, message: Message) -> None:
        self.messages.append(Send(to=to, message=message))


def _count(value: object) -> bool:
    """A non-negative int (not a bool): what every index field must be."""
    return type(value) is int and value >= 0

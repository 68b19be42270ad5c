"""Checkpoints of stuck transactions decided by ORDERED votes (`stuck_resolution = "pbft"`):
the votes travel through an embedded instance of the real PBFT core instead of reliable
broadcast (docs/LEADERLESS.md, "Ordered resolution").

Owns: `OrderedCheckpoints`, a sans-IO sub-machine with the interface of
`veto.CheckpointMachine` (the core picks one by its config): the queue of stuck ids, this
node's view of each checkpoint it heard of (its own signed vote, when it heard of it, its
close), the embedded `PbftCore` (its messages wrapped in `OrderingEnvelope`, its record and
`Persisted` numbers folded into the core's), and the `ordered_state.OrderedState` that
executes what PBFT orders. The core answers `evidence_of` (every endorsement it holds of a
transaction, a commit certificate when committed) and persists `record()` before sending
(`VetoEffects.sync`).

Rules:
- A correct node votes once per checkpoint, when it first hears of it (its own start, a
  `StartCheckpoint`, or an ordered item naming it), and never commits those transactions
  until the checkpoint decides, nor an id a decision dropped (`blocked`); it abstains while
  one of them is `unprovable`.
- It proposes a close `close_ticks` ticks after it heard of an undecided checkpoint, once
  its own vote is ordered.
- A transaction still stuck whose remembered checkpoints are all decided (kept: KEEP only
  says "not dropped now") goes out again in a checkpoint of the next round, after a wait
  that doubles with the round (docs/LEADERLESS.md "Kept, then stuck").
- Its own items go to PBFT one at a time (PBFT deduplicates a client's requests by
  increasing numbers: a later number executed first would swallow an earlier one); the head
  is submitted again every period until it executes.
- While fenced (amnesia) it signs nothing and the embedded PBFT neither steps nor sends.

Invariants: deterministic (insertion-ordered dicts, sorted ids, the PBFT core's own
determinism); peer input never raises (counted); at most `MAX_OPEN` undecided checkpoints;
every own vote and PBFT record change is in `record()` and flagged `sync` before the
messages that depend on it leave.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.consensus.core import (
    CheckpointInstalled,
    CheckpointTaken,
    Input,
    Persisted,
    Ready,
    Receive,
    Send,
    Submit,
    Tick,
    snapshot_bytes,
)
from phalanx.consensus.crypto import Crypto, Verifier
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    CloseCheckpoint,
    FetchVote,
    OrderedVote,
    OrderingEnvelope,
    OrderingRecord,
    OrderingSnapshot,
    OrderingSubmit,
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    VoteBatch,
    VoteBody,
    VoteDigestBatch,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
    VoteRelay,
)
from phalanx.consensus.leaderless.ordered_state import (
    MAX_ROUND,
    Decision,
    OrderedState,
    valid_ids,
    valid_round,
)
from phalanx.consensus.leaderless.veto_votes import ProofOf, VetoEffects, checkpoint_id
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.core import PbftCore, PbftRestoredState
from phalanx.consensus.types import ClientRequest, Entry, LocalProtocolError, NodeId

EvidenceOf = Callable[[TxId], TransactionProof | None]

MAX_OPEN = 1024
"""Undecided checkpoints a node takes part in at once (further starts are counted)."""


class OrderingCodec(Protocol):
    """Canonical bytes of the ordered items and the ordering snapshot (the wire codec in
    the runtime and the simulator: `WireTxCodec`)."""

    def encode_item(self, item: object) -> bytes: ...

    def decode_item(self, data: bytes) -> object | None:
        """The registered object `data` encodes, or None; never raises."""
        ...


@dataclass(slots=True)
class _Local:
    tx_ids: tuple[TxId, ...]
    heard: int
    round: int = 0
    own: OrderedVote | None = None
    closed: bool = False
    decided: bool = False
    decided_at: int = 0


@dataclass(slots=True)
class _Outgoing:
    """This node's items to order, one at a time (the head is in flight)."""

    items: deque[OrderedVote | CloseCheckpoint] = field(default_factory=deque)
    head: ClientRequest | None = None
    head_item: OrderedVote | CloseCheckpoint | None = None


class OrderedCheckpoints:
    """See the module docstring."""

    def __init__(self, *, config: LeaderlessConfig, crypto: Crypto, client_keys: Verifier,
                 codec: OrderingCodec, tx_id_of: Callable[[Transaction], TxId],
                 evidence_of: EvidenceOf, restored: OrderingRecord | None = None,
                 pbft: PbftConfig | None = None, one_close: bool = False,
                 drop_ambiguous: bool = False, decided_once: bool = False) -> None:
        """`one_close`, `drop_ambiguous`, `decided_once`: the deliberate bugs
        `ordered_one_close`, `ordered_drop_ambiguous` and `ordered_decided_once` (`bugs.py`)."""
        if not (callable(getattr(codec, "encode_item", None))
                and callable(getattr(codec, "decode_item", None))):
            raise LocalProtocolError("stuck_resolution 'pbft' needs a codec with "
                                     "encode_item/decode_item (WireTxCodec)")
        self.node_id = config.node_id
        self._config = config
        self._client_keys = client_keys
        self._tx_id = tx_id_of
        self._nodes = config.nodes
        self._members = frozenset(config.nodes)
        self._crypto = crypto
        self._codec = codec
        self._evidence_of = evidence_of
        self._pbft_config = pbft or PbftConfig(
            node_id=config.node_id, replicas=config.nodes, batch_size=16,
            forward_ticks=0, early_votes=False)
        if self._pbft_config.node_id != config.node_id or \
                tuple(self._pbft_config.replicas) != config.nodes:
            raise LocalProtocolError("the embedded PBFT must have the same node and nodes")
        rec = restored if restored is not None else OrderingRecord()
        self._close_quorum = 1 if one_close else config.faults + 1
        self._drop_ambiguous = drop_ambiguous
        self._decided_once = decided_once
        self._state = self._new_state(rec.state)
        self._pbft_state = rec.pbft
        self._executed = rec.executed
        self._request_no = rec.request_no
        data = None
        if rec.executed and rec.executed % self._pbft_config.checkpoint_interval == 0:
            data = codec.encode_item(rec.state)
        self._pbft = PbftCore(self._pbft_config, crypto=crypto, restored=None if restored is None
                              else PbftRestoredState(durable=rec.pbft, executed=rec.executed,
                                                     checkpoint_data=data))
        self._ticks = 0
        self._queued: dict[TxId, int] = {}  # id -> the round of its next checkpoint
        self._local: dict[bytes, _Local] = {}
        self._by_tx: dict[TxId, dict[bytes, None]] = {}
        self._out = _Outgoing()
        self._inputs: deque[Input] = deque()
        self._stepping = False
        self._unstamped: list[int] = []
        self._stamped: deque[tuple[int, int]] = deque()  # (outer number, inner number)
        self._sends: list[Send] = []
        self._sync = False
        self._dirty = True
        self._record: OrderingRecord | None = None
        self._dropped: list[TxId] = []
        self._kept: list[TransactionProof] = []
        self._counts: dict[str, int] = {}
        self.fenced = False
        self.unprovable: Callable[[TxId], bool] = lambda _t: False
        self.old_unblock = False  # `cascade_in_drain` (bugs.py): blocked ends at the decision
        for vote in rec.own:
            if vote.voter != self.node_id:
                raise LocalProtocolError(f"restored vote is not {self.node_id!r}'s: {vote!r}")
            loc = self._remember(vote.checkpoint, vote.tx_ids, vote.round)
            loc.own = vote
            loc.decided = self._state.decided(vote.checkpoint)
            if not loc.decided:
                self._enqueue(vote)

    # Inputs (the `CheckpointMachine` interface) ----------------------------------------

    def queue(self, tx_id: TxId) -> None:
        """Ask for a checkpoint of stuck `tx_id` (the core asks again every period while it
        stays stuck): round 0 when no remembered checkpoint names it; when every one that
        does is decided, the last at least `_retry_wait(r)` ticks ago, round r + 1 (r: the
        highest round among them)."""
        holders = self._by_tx.get(tx_id)
        if not holders:
            self._queued.setdefault(tx_id, 0)
            return
        locs = [self._local[cid] for cid in holders]
        if self._decided_once or any(not loc.decided for loc in locs):
            return
        last = max(loc.round for loc in locs)
        if last < MAX_ROUND and self._ticks - max(
                loc.decided_at for loc in locs) >= self._retry_wait(last):
            self._queued[tx_id] = last + 1

    def _retry_wait(self, round_no: int) -> int:
        return (self._config.close_ticks + self._config.checkpoint_ticks) << min(round_no, 6)

    def _covered(self, tx_id: TxId, round_no: int) -> bool:
        """Whether a remembered checkpoint of `tx_id` is undecided or of round >= `round_no`."""
        return any(not (loc := self._local[cid]).decided or loc.round >= round_no
                   for cid in self._by_tx.get(tx_id, ()))

    def tick(self, proof_of: ProofOf) -> None:
        """Every tick: the embedded PBFT's tick and the close timers. Every
        `checkpoint_ticks`: announce undecided checkpoints again, re-submit the head of the
        own items, start a checkpoint of the first `checkpoint_batch` queued ids."""
        del proof_of  # votes carry `evidence_of`
        self._ticks += 1
        if self.fenced:
            return
        self._pump(Tick())
        for cid, loc in self._local.items():
            if (not loc.decided and not loc.closed and loc.own is not None
                    and self._ticks - loc.heard >= self._config.close_ticks
                    and self._state.counted(cid, self.node_id)[0]):
                loc.closed = True
                close = CloseCheckpoint(checkpoint=cid, tx_ids=loc.tx_ids,
                                        proposer=self.node_id, round=loc.round)
                self._enqueue(dataclasses.replace(close, signature=self._crypto.sign(close)))
        if self._ticks % self._config.checkpoint_ticks:
            return
        for loc in self._local.values():
            if not loc.decided:
                self._broadcast(StartCheckpoint(tx_ids=loc.tx_ids, round=loc.round))
        if self._out.head is not None:
            self._submit(self._out.head)
        self._queued = {t: self._queued[t] for t in sorted(self._queued)
                        if not self._covered(t, self._queued[t])}
        if self._queued:
            round_no = min(self._queued.values())  # one round per checkpoint
            tx_ids = tuple([t for t, r in self._queued.items() if r == round_no][
                : self._config.checkpoint_batch])
            for t in tx_ids:
                del self._queued[t]
            self._broadcast(StartCheckpoint(tx_ids=tx_ids, round=round_no))
            self._hear(tx_ids, round_no)

    def on_start(self, src: NodeId, msg: StartCheckpoint, proof_of: ProofOf) -> None:
        del proof_of
        if src not in self._members:
            self._count("not_a_member")
        elif not valid_ids(msg.tx_ids):
            self._count("bad_id_list")
        elif not valid_round(msg.round):
            self._count("bad_round")
        else:
            self._hear(msg.tx_ids, msg.round)

    def on_choice(self, src: NodeId, msg: VetoChoice, proof_of: ProofOf) -> None:
        self._count("veto_message_in_pbft_mode")

    def on_echo(self, src: NodeId, msg: VoteEcho, proof_of: ProofOf) -> None:
        self._count("veto_message_in_pbft_mode")

    def on_ready(self, src: NodeId, msg: VoteReady) -> None:
        self._count("veto_message_in_pbft_mode")

    def on_batch(self, src: NodeId, msg: VoteBatch, proof_of: ProofOf) -> None:
        self._count("veto_message_in_pbft_mode")

    def on_relay(self, src: NodeId,
                 msg: VoteEchoDigest | VoteDigestBatch | FetchVote | VoteBody,
                 proof_of: ProofOf) -> None:
        self._count("veto_message_in_pbft_mode")

    def on_envelope(self, src: NodeId, msg: OrderingEnvelope | OrderingSubmit) -> None:
        """A message of the embedded PBFT (its own checks count what it drops), or a
        peer's own item to order (only its own: a request under another node's client id
        could swallow that node's requests in PBFT's per-client deduplication)."""
        if self.fenced:
            self._count("ordering_while_fenced")
        elif isinstance(msg, OrderingEnvelope):
            self._pump(Receive(src=src, message=msg.message))
        elif not isinstance(msg.request, ClientRequest) or msg.request.client_id != src:
            self._count("ordering_foreign_request")
        else:
            self._pump(Submit(request=msg.request))

    def stamp(self, number: int) -> None:
        """The core's Ready `number` carries the record of the PBFT Readys since the last."""
        if self._unstamped:
            self._stamped.append((number, self._unstamped[-1]))
            self._unstamped = []

    def persisted(self, number: int) -> None:
        """The core's Readys up to `number` are durable: so are the PBFT Readys they carry."""
        inner = 0
        while self._stamped and self._stamped[0][0] <= number:
            inner = self._stamped.popleft()[1]
        if inner:
            self._pump(Persisted(number=inner))

    # Queries ---------------------------------------------------------------------------

    def blocked(self, tx_id: TxId) -> bool:
        """Whether this node voted in an undecided checkpoint containing `tx_id`, or a
        decision dropped it (the ordered state's bounded memory of dropped ids, durable in
        `record()`): defence in depth, no path may commit an id decided DROP."""
        if self._state.was_dropped(tx_id) and not self.old_unblock:
            return True
        for cid in self._by_tx.get(tx_id, ()):
            loc = self._local[cid]
            if loc.own is not None and not loc.decided:
                return True
        return False

    def votes(self) -> tuple[VetoChoice, ...]:
        return ()

    def relays(self) -> tuple[VoteRelay, ...]:
        return ()

    def veto_decisions(self) -> tuple[CheckpointDecision, ...]:
        """The veto mode's decisions: none here (the ordered state is in `record()`)."""
        return ()

    def record(self) -> OrderingRecord | None:
        """The ordered resolution's part of the durable record (the same object until it
        changes)."""
        if self._record is None or self._dirty:
            self._record = OrderingRecord(
                pbft=self._pbft_state, executed=self._executed, state=self._state.snapshot(),
                own=tuple(loc.own for loc in self._local.values()
                          if loc.own is not None and not loc.decided),
                request_no=self._request_no)
            self._dirty = False
        return self._record

    def dropped_counts(self) -> Mapping[str, int]:
        counts = dict(self._counts)
        for reason, n in self._state.counts().items():
            counts[reason] = counts.get(reason, 0) + n
        for reason, n in self._pbft.status().dropped.items():
            counts[f"pbft_{reason}"] = counts.get(f"pbft_{reason}", 0) + n
        return counts

    def __len__(self) -> int:
        return len(self._local)

    @property
    def decisions(self) -> int:
        """Checkpoints the ordered state decided (since start or the last transfer)."""
        return self._state.decisions

    def drain(self) -> VetoEffects:
        effects = VetoEffects(sends=tuple(self._sends), sync=self._sync,
                              dropped=tuple(self._dropped), kept=tuple(self._kept))
        self._sends, self._dropped, self._kept = [], [], []
        self._sync = False
        return effects

    def gc(self, live: Callable[[TxId], bool]) -> None:
        """Forget decided checkpoints none of whose ids is `live`."""
        dead = [cid for cid, loc in self._local.items()
                if loc.decided and not any(live(t) for t in loc.tx_ids)]
        for cid in dead:
            loc = self._local.pop(cid)
            for t in loc.tx_ids:
                holders = self._by_tx[t]
                del holders[cid]
                if not holders:
                    del self._by_tx[t]

    # Internals -------------------------------------------------------------------------

    def _count(self, reason: str) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + 1

    def _broadcast(self, msg: StartCheckpoint) -> None:
        self._sends.extend(Send(to=peer, message=msg)
                           for peer in self._nodes if peer != self.node_id)

    def _remember(self, cid: bytes, tx_ids: tuple[TxId, ...], round_no: int) -> _Local:
        loc = self._local.get(cid)
        if loc is None:
            loc = self._local[cid] = _Local(tx_ids=tx_ids, heard=self._ticks, round=round_no)
            for t in tx_ids:
                self._by_tx.setdefault(t, {})[cid] = None
                self._queued.pop(t, None)
        return loc

    def _hear(self, tx_ids: tuple[TxId, ...], round_no: int) -> None:
        """This node heard of checkpoint `tx_ids` (of round `round_no`): remember it and
        vote once."""
        cid = checkpoint_id(self._crypto, tx_ids, round_no)
        if cid not in self._local and sum(
                1 for loc in self._local.values() if not loc.decided) >= MAX_OPEN:
            self._count("too_many_open_checkpoints")  # as the veto mode's `max_open`
            return
        loc = self._remember(cid, tx_ids, round_no)
        if self._state.decided(cid) and not loc.decided:
            loc.decided, loc.decided_at = True, self._ticks
        if loc.own is not None or loc.decided or self.fenced:
            return
        evidence = tuple(p for p in map(self._evidence_of, tx_ids) if p is not None)
        if any(self.unprovable(t) for t in tx_ids):
            return  # committed here without a proof (after a restart): abstain (a limit:
            # docs/LEADERLESS.md "Ordered resolution", unlike the veto mode it blocks nothing)
        vote = OrderedVote(checkpoint=cid, tx_ids=tx_ids, voter=self.node_id,
                           evidence=evidence, round=round_no)
        vote = dataclasses.replace(vote, signature=self._crypto.sign(vote))
        loc.own = vote
        self._dirty = self._sync = True
        self._enqueue(vote)

    def _enqueue(self, item: OrderedVote | CloseCheckpoint) -> None:
        self._out.items.append(item)
        if self._out.head is None:
            self._next_item()

    def _next_item(self) -> None:
        """Submit the next own item whose checkpoint is still undecided."""
        self._out.head = self._out.head_item = None
        while self._out.items:
            item = self._out.items.popleft()
            if self._state.decided(item.checkpoint):
                continue
            self._out.head_item = item
            self._request_no += 1
            self._dirty = self._sync = True
            self._out.head = ClientRequest(client_id=str(self.node_id),
                                           request_no=self._request_no,
                                           command=self._codec.encode_item(item))
            self._submit(self._out.head)
            return

    def _resend_head(self) -> None:
        """The head's number was taken by another request: send it under a new one."""
        if self._out.head_item is not None:
            self._out.items.appendleft(self._out.head_item)
            self._next_item()

    def _submit(self, request: ClientRequest) -> None:
        """Hand `request` to this node's PBFT and every peer's (as a client sends to all
        replicas: a backup holding it times the primary)."""
        self._pump(Submit(request=request))
        share = OrderingSubmit(request=request)
        self._sends.extend(Send(to=peer, message=share)
                           for peer in self._nodes if peer != self.node_id)

    def _pump(self, inp: Input) -> None:
        """Step the embedded PBFT with `inp` and whatever its effects feed back."""
        self._inputs.append(inp)
        if self._stepping:
            return
        self._stepping = True
        try:
            while self._inputs:
                self._absorb(self._pbft.step(self._inputs.popleft()))
        finally:
            self._stepping = False

    def _absorb(self, ready: Ready) -> None:
        if ready.snapshot is not None:
            self._install(ready)
        for entry in ready.committed:
            self._execute(entry)
        for send in ready.early_messages + ready.messages:
            self._sends.append(Send(to=send.to, message=OrderingEnvelope(message=send.message)))
        if ready.core_state is not None:
            self._pbft_state = ready.core_state  # type: ignore[assignment]
            self._dirty = self._sync = True
        if ready.hard_state is not None or ready.must_sync:
            self._dirty = self._sync = True
        if ready.number:
            self._unstamped.append(ready.number)
            self._dirty = self._sync = True
        for _ in ready.rejected:
            self._count("ordering_rejected")  # the head is submitted again next period

    def _new_state(self, snapshot: OrderingSnapshot) -> OrderedState:
        return OrderedState(
            nodes=self._config.nodes, faults=self._config.faults, crypto=self._crypto,
            client_keys=self._client_keys, quorum_for=self._config.quorum_for,
            tx_id_of=self._tx_id, snapshot=snapshot, close_quorum=self._close_quorum,
            drop_ambiguous=self._drop_ambiguous, min_quorum=self._config.quorum)

    def _install(self, ready: Ready) -> None:
        """State transfer of the embedded PBFT: its checkpoint data is the ordered state."""
        assert ready.snapshot is not None
        data = snapshot_bytes(ready.snapshot.data)
        snap = self._codec.decode_item(data)
        if not isinstance(snap, OrderingSnapshot):
            self._count("ordering_bad_transfer")  # certified by 2f+1: impossible
            return
        self._state = self._new_state(snap)
        self._executed = ready.snapshot.meta.index
        self._dirty = self._sync = True
        for cid, loc in self._local.items():
            if not loc.decided and self._state.decided(cid):
                self._decided_here(cid, None)
        self._dropped.extend(snap.dropped)  # decisions this node skipped (the core ignores
        # the ones it already knows)
        self._inputs.append(CheckpointInstalled(meta=ready.snapshot.meta, data=data))
        # A transfer skips the entries, so `_execute` never saw the head executed: move past
        # every own item the installed state shows done (its Submit goes in after the
        # install), else a node out of the others' view (it learns only by transfer)
        # re-submits a done head for ever and the votes queued behind it are never ordered
        # (docs/LEADERLESS.md "The leaderless Jepsen matrix").
        while self._head_done():
            self._next_item()

    def _head_done(self) -> bool:
        """Whether the head own item's checkpoint is decided or the item is counted in it."""
        item = self._out.head_item
        if item is None:
            return False
        if self._state.decided(item.checkpoint):
            return True
        vote, close = self._state.counted(item.checkpoint, self.node_id)
        return close if isinstance(item, CloseCheckpoint) else vote

    def _execute(self, entry: Entry) -> None:
        for request in entry.requests:
            item = self._codec.decode_item(request.command)
            decision = self._state.execute(request.command, item)
            if decision is not None:
                self._decided_here(decision.checkpoint, decision)
            if isinstance(item, OrderedVote | CloseCheckpoint) and valid_ids(item.tx_ids) \
                    and valid_round(item.round) and self._state.is_open(item.checkpoint) \
                    and item.checkpoint == checkpoint_id(self._crypto, item.tx_ids, item.round):
                self._hear(item.tx_ids, item.round)
            if request.client_id == self.node_id:
                # Never reuse a number PBFT executed under our id (a Byzantine primary may
                # order one we never sent): PBFT would take ours for a retry of it.
                if request.request_no > self._request_no:
                    self._request_no = request.request_no
                    self._dirty = self._sync = True
                head = self._out.head
                if head is not None and request.request_no >= head.request_no:
                    if request.command == head.command:
                        self._next_item()
                    else:
                        self._resend_head()
        self._executed = max(self._executed, entry.index)
        self._dirty = self._sync = True
        if entry.index % self._pbft_config.checkpoint_interval == 0:
            data = self._codec.encode_item(self._state.snapshot())
            self._inputs.append(CheckpointTaken(index=entry.index, data=data))

    def _decided_here(self, cid: bytes, decision: Decision | None) -> None:
        loc = self._local.get(cid)
        if loc is not None and not loc.decided:
            loc.decided, loc.decided_at = True, self._ticks
        if decision is not None:
            self._dropped.extend(decision.dropped)
            self._kept.extend(decision.kept)
        self._dirty = self._sync = True

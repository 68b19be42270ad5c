"""The PBFT core (Castro and Liskov, OSDI'99 / TOCS'02): a sans-IO `phalanx.consensus.core.Core`.

Owns: dispatch of inputs (role-free: the primary of view v is replicas[v mod n]), the
view-change timer with exponential backoff, and the `Ready` bundle of each step. Split out:
`vote_flow.py` (the three-phase normal case and in-order execution into `Ready.committed`,
a base class of `PbftCore`), `view_flow.py`
(ViewChange/NewView handling, a base class of `PbftCore`), `request_flow.py` (client
requests, batching and relaying to the primary, a base class too), `checkpoint_flow.py`
(checkpoints, stable-checkpoint garbage collection, state-transfer glue, a base class too),
and the pure sub-machines `requests.py` (client requests and the primary's adaptive
batching), `transfer.py` (catch-up), `log.py` (message log, predicates, water marks, the
per-sender next-view buffer), `checkpoint.py` (stability), `view_change.py`
(ViewChange/NewView checks and the O set), `safety.py` (the only signer of votes).

Client requests are not signed by clients: the transport authenticates peers, not
clients, and a client's request is only as trustworthy as the replica it reached. What
protects clients is the f+1 matching-reply rule (a Byzantine replica cannot fabricate a
result) and execution only of requests in a committed pre-prepare; a Byzantine primary can
invent a request under a client's id (Castro-Liskov sign or MAC requests to prevent it).
That is a known gap, not checked by the simulator.

Must not import: trio, sockets, clocks, global random, `phalanx.net`. Crypto is injected.

Invariants:
- Peer input never raises: it is dropped and counted by reason in `status().dropped`.
- Own commits, and own pre-prepares and prepares sent the recorded-first way, count
  towards a quorum only after `Persisted` reports the Ready that recorded them (signature
  records and prepared certificates travel in `Ready.core_state`).
- What leaves before it is durable: only own pre-prepares and prepares, as
  `Ready.early_messages` (counted at once, persisted only with the next record written
  for another reason), and only in a view whose `early_view` record is durable; a
  restarted replica is fenced out of signing them in every view up to that record
  (`safety.py` argues why no restart can then make it equivocate). A commit leaves only
  after the prepared certificate behind it is durable (`Ready.messages`): the next
  ViewChange must carry it, or a committed request could be dropped.
- `Ready.committed` holds one entry per seq, strictly increasing and gap-free, each seq once
  (a state-transfer `Ready.snapshot` jumps the sequence forward first).
- The replica never participates in a view lower than `view` (persisted), and never
  signs two different votes for one (view, seq), even across restarts (SafetyRules).
- Determinism: no set iteration order, `id()`, clocks or randomness affects any output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from phalanx.consensus.core import (
    EMPTY_READY,
    CheckpointInstalled,
    CheckpointTaken,
    CoreStatus,
    Input,
    Persisted,
    Ready,
    Receive,
    Rejection,
    Send,
    Snapshot,
    Submit,
    Tick,
    snapshot_bytes,
)
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.pbft.checkpoint import CheckpointTracker, StableCheckpoint
from phalanx.consensus.pbft.checkpoint_flow import CheckpointFlow
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import FutureVotes, MessageLog
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    CheckpointData,
    Commit,
    CommittedBatch,
    FetchCheckpoint,
    FetchCommitted,
    ForwardRequest,
    NewView,
    PbftDurableState,
    Prepare,
    PrePrepare,
    ViewChange,
    VoteKind,
)
from phalanx.consensus.pbft.request_flow import RequestFlow
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.pbft.transfer import Batch, CatchUp
from phalanx.consensus.pbft.view_flow import ViewChangeFlow
from phalanx.consensus.pbft.vote_flow import VoteFlow
from phalanx.consensus.types import (
    Entry,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
)

_PBFT_TYPES = (
    PrePrepare,
    Prepare,
    Commit,
    Checkpoint,
    ViewChange,
    NewView,
    ForwardRequest,
    FetchCheckpoint,
    CheckpointData,
    FetchCommitted,
    CommittedBatch,
)
_Vote = PrePrepare | Prepare | Commit


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftRestoredState:
    """What the driver gives back to a restarting core.

    Attributes:
        durable: the last `Ready.core_state` written.
        executed: the seq the restored state machine is at (its checkpoint's index).
        checkpoint_data: the data of the checkpoint at `executed`, if the replica holds it
            (served to lagging peers).
    """

    durable: PbftDurableState
    executed: int = 0
    checkpoint_data: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftStatus(CoreStatus):
    """`CoreStatus` plus PBFT's view, water marks and stable checkpoint."""

    view: int = 0
    view_active: bool = True
    low_water: int = 0
    high_water: int = 0
    stable_digest: bytes = b""
    pending_requests: int = 0
    log_slots: int = 0
    transferring: bool = False


class PbftCore(VoteFlow, RequestFlow, CheckpointFlow, ViewChangeFlow):
    """One PBFT replica. See the module docstring for the rules it keeps."""

    def __init__(
        self,
        config: PbftConfig,
        *,
        crypto: Crypto,
        restored: PbftRestoredState | None = None,
    ) -> None:
        if crypto.node_id != config.node_id:
            raise LocalProtocolError("crypto and config belong to different nodes")
        d = restored.durable if restored is not None else PbftDurableState()
        self._cfg = config
        self._me = config.node_id
        self._crypto = crypto
        self._safety = SafetyRules(crypto, d.safety, fence="no_view_fence" not in config.bugs)
        self._view = d.view
        self._active = d.view_active
        stable = StableCheckpoint(seq=d.stable_seq, digest=d.stable_digest, proof=d.stable_proof)
        self._checkpoints = CheckpointTracker(quorum=config.quorum, stable=stable)
        self._own_vote: Checkpoint | None = None
        self._log = MessageLog(low=d.stable_seq, window=config.log_window)
        for proof in d.prepared:
            self._log.prepared_certs[proof.pre_prepare.seq] = proof
        self._executed = restored.executed if restored is not None else 0
        if restored is not None and restored.checkpoint_data is not None:
            data = restored.checkpoint_data
            digest = crypto.digest(data)
            self._checkpoints.record_own(self._executed, digest, data)
            if self._executed > d.stable_seq:
                # Our vote for it may have died with the process: sign it again so
                # `_resend_checkpoint_vote` can repeat it until it is stable.
                self._own_vote = self._signed_checkpoint(self._executed, digest)
                if config.quorum > 1:  # (n = 1 takes its checkpoints stable at once anyway)
                    self._checkpoints.add_vote(self._own_vote)
        # A primary never reuses a seq it pre-prepared in this view (even before a crash).
        own_pp = [
            v.seq for v in d.safety.votes if v.kind is VoteKind.PRE_PREPARE and v.view == self._view
        ]
        self._next_seq = max([self._executed, d.stable_seq, *own_pp])
        self._requests = RequestBook(max_pending=config.max_pending)
        self._timer: int | None = None
        self._backoff = 0
        self._latest_vc: dict[NodeId, ViewChange] = {}
        self._new_view_sent = -1
        self._new_view: NewView | None = None  # ours, for the view we lead (resent to laggards)
        self._new_view_resent: dict[NodeId, tuple[int, int]] = {}
        self._ticks = 0
        self._future = FutureVotes(per_sender=3 * config.log_window)
        self._committed: dict[int, Batch] = {}  # committed, waiting to execute in order
        self._catchup = CatchUp(config, restarted=restored is not None)
        self._dropped: dict[str, int] = {}
        self._ready_number = 0
        self._persisted = 0
        self._awaiting: list[tuple[int, _Vote]] = []
        # The Ready that made `early_view == view` durable (None: not yet, in this view).
        self._early_ready: int | None = None
        # Per-step accumulators (reset by `_begin`).
        self._out: list[Send] = []
        self._early: list[Send] = []
        self._exec_out: list[Entry] = []
        self._snapshot_out: Snapshot | None = None
        self._rejected_out: list[Rejection] = []
        self._new_own: list[_Vote] = []
        self._durable_dirty = False
        self._hard_dirty = False
        if restored is not None and self._executed < d.stable_seq:
            self._start_transfer(stable, send=False)
        self._resend_view_change = not self._active

    # ----------------------------------------------------------------------------------
    # Core protocol

    @property
    def node_id(self) -> NodeId:
        return self._me

    @property
    def view(self) -> int:
        return self._view

    @property
    def executed(self) -> int:
        return self._executed

    def is_primary(self) -> bool:
        return self._cfg.primary(self._view) == self._me

    def status(self) -> PbftStatus:
        role = "primary" if self.is_primary() else "backup"
        if not self._active:
            role = "view_change"
        return PbftStatus(
            node=self._me,
            role=role,
            term=self._view,
            commit_index=self._executed,
            leader=self._cfg.primary(self._view) if self._active else None,
            dropped=dict(sorted(self._dropped.items())),
            view=self._view,
            view_active=self._active,
            low_water=self._log.low,
            high_water=self._log.high,
            stable_digest=self._checkpoints.stable.digest,
            pending_requests=len(self._requests),
            log_slots=len(self._log),
            transferring=self._catchup.target is not None,
        )

    def step(self, inp: Input, /) -> Ready:
        self._begin()
        if self._resend_view_change:
            self._resend_view_change = False
            self._broadcast_view_change()
        match inp:
            case Receive(src=src, message=message):
                self._receive(src, message)
            case Tick():
                self._tick()
            case Submit(request=request):
                self._submit(request)
            case Persisted(number=number):
                self._on_persisted(number)
            case CheckpointTaken(index=index, data=data):
                self._checkpoint_taken(index, snapshot_bytes(data))
            case CheckpointInstalled(meta=meta, data=data):
                if meta.index > self._executed:
                    self._executed = meta.index
                    self._checkpoints.record_own(meta.index, self._crypto.digest(data), data)
            case _:
                assert_never(inp)
        return self._finish()

    def _begin(self) -> None:
        self._out = []
        self._early = []
        self._exec_out = []
        self._snapshot_out = None
        self._rejected_out = []
        self._new_own = []
        self._durable_dirty = False
        self._hard_dirty = False

    def _finish(self) -> Ready:
        safety = self._safety
        opened = self._active and self._cfg.early_votes and safety.open_early(self._view)
        # Own votes always ride on a persisted Ready (even an identical re-sign after a restart).
        durable = safety.take_dirty() or self._durable_dirty or bool(self._new_own)
        if not (durable or opened or self._hard_dirty or self._snapshot_out is not None
                or self._early or self._out or self._exec_out or self._rejected_out):
            return EMPTY_READY  # most steps (a backup queueing a client's request, a tick)
        number = 0
        if durable or self._hard_dirty or self._snapshot_out is not None:
            self._ready_number += 1
            number = self._ready_number
        if opened:
            self._early_ready = number
        for vote in self._new_own:
            self._awaiting.append((number, vote))
        core_state = self.durable_state() if durable else None
        hard = HardState(view=self._view, commit=self._executed) if self._hard_dirty else None
        return Ready(
            number=number,
            early_messages=tuple(self._early),
            snapshot=self._snapshot_out,
            hard_state=hard,
            core_state=core_state,
            must_sync=durable or hard is not None,
            messages=tuple(self._out),
            committed=tuple(self._exec_out),
            rejected=tuple(self._rejected_out),
        )

    def durable_state(self) -> PbftDurableState:
        """What must survive a crash (also carried by `Ready.core_state` when it changes)."""
        stable = self._checkpoints.stable
        return PbftDurableState(
            view=self._view,
            view_active=self._active,
            stable_seq=stable.seq,
            stable_digest=stable.digest,
            stable_proof=stable.proof,
            safety=self._safety.data,
            prepared=self._log.certificates(),
        )

    # ----------------------------------------------------------------------------------
    # Helpers

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _send(self, to: NodeId, message: Message) -> None:
        self._out.append(Send(to=to, message=message))

    def _broadcast(self, message: Message) -> None:
        for peer in self._cfg.peers():
            self._send(peer, message)

    def _early_ok(self, view: int) -> bool:
        """Whether our pre-prepare or prepare of `view` may go early: before any record of
        it is durable, counted at once (`SafetyRules`' module docstring argues why the
        restart fence makes that safe). Only once this view's `early_view` record is."""
        early = self._early_ready
        return (
            early is not None
            and early <= self._persisted
            and self._active
            and self._safety.early_view == self._view == view
        )

    def _send_early(self, vote: PrePrepare | Prepare) -> None:
        self._early.extend(Send(to=peer, message=vote) for peer in self._cfg.peers())

    def _timeout(self) -> int:
        base = self._cfg.view_change_ticks
        return min(base << min(self._backoff, 30), self._cfg.max_view_change_ticks)

    # ----------------------------------------------------------------------------------
    # Receive

    def _receive(self, src: NodeId, msg: Message) -> None:
        if src not in self._cfg.replicas or src == self._me:
            self._drop("unknown_sender")
            return
        if not isinstance(msg, _PBFT_TYPES):
            self._drop("unknown_message")
            return
        if msg.replica != src:
            self._drop("sender_mismatch")
            return
        match msg:
            case PrePrepare() | Prepare() | Commit():
                if self._view_ok(src, msg):
                    self._on_vote(msg)
            case Checkpoint():
                self._on_checkpoint(msg)
            case ViewChange():
                self._on_view_change(msg)
            case NewView():
                self._on_new_view(msg)
            case ForwardRequest():
                if not (self._active and self.is_primary()):
                    self._drop("not_primary")
                else:
                    self._submit(msg.request)
            case FetchCheckpoint():
                data = self._checkpoints.own_data(msg.seq)
                if data is None:
                    self._drop("fetch_unavailable")
                else:
                    self._send(src, CheckpointData(seq=msg.seq, data=data, replica=self._me))
                if msg.view < self._view:
                    self._resend_new_view(src)  # its certificate names a newer checkpoint
            case CheckpointData():
                self._on_checkpoint_data(msg)
            case FetchCommitted():
                for reply in self._catchup.serve(msg.from_seq, self._executed):
                    self._send(src, reply)
                if msg.view < self._view:
                    self._resend_new_view(src)  # e.g. a restarted replica's first fetch
            case CommittedBatch():
                self._on_committed_batch(msg)
            case _:
                assert_never(msg)

    def _view_ok(self, src: NodeId, msg: PrePrepare | Prepare | Commit) -> bool:
        if "skip_view_check" in self._cfg.bugs:
            return True
        if msg.view == self._view and self._active:
            return True
        if msg.view < self._view:
            self._drop("wrong_view")
            self._resend_new_view(src)
        elif not self._future.add(src, msg):  # replayed once we enter that view
            self._drop("future_view_overflow")
        return False

    # ----------------------------------------------------------------------------------
    # Time

    def _tick(self) -> None:
        self._ticks += 1
        if self._ticks % self._cfg.checkpoint_resend_ticks == 0:
            self._resend_checkpoint_vote()
        book = self._requests
        self._relay_due()
        if self._active and self.is_primary():
            room = self._next_seq - self._executed < self._cfg.max_inflight_batches
            if book.pending:
                book.pending_age += 1
            if room:
                if book.tick():  # the expected returning clients are late: stop waiting
                    self._flush()
            elif book.pending and book.pending_age >= self._cfg.batch_ticks:
                self._flush(force=True)
        if self._active:
            if book.waiting and not self.is_primary():
                self._timer = self._timeout() if self._timer is None else self._timer - 1
                # Before blaming the primary, forget what is known executed after all (a
                # request its client already followed with a later one that executed).
                if self._timer <= 0 and book.forget_executed():
                    self._start_view_change(self._view + 1)
                elif self._timer <= 0:
                    self._timer = None
            else:
                self._timer = None
        elif self._timer is None:
            # Liveness rule 1 (§4.5.2): a view change's timer starts only once 2f+1
            # replicas ask for this view or a later one; a replica that left a view early
            # (or alone) waits for the others instead of racing ahead one view per timeout,
            # where equal capped timeouts could keep it one view ahead of them for good.
            if self._view_change_backed():
                self._timer = self._timeout()
        else:
            self._timer -= 1
            if self._timer <= 0:
                self._start_view_change(self._view + 1)
        if not self._active and self._ticks % self._cfg.fetch_ticks == 0:
            self._rebroadcast_view_change()  # a lost ViewChange must not stall rule 1 for good
        fetch, fetch_committed = self._catchup.tick(
            executed=self._executed, view=self._view, gap=bool(self._committed)
        )
        if fetch is not None:
            self._send(*fetch)
        if fetch_committed is not None:
            self._broadcast(fetch_committed)

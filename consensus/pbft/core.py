"""The PBFT core (Castro and Liskov, OSDI'99 / TOCS'02): a sans-IO `phalanx.consensus.core.Core`.

Owns: composing the sub-machines, dispatching each input to them (role-free: the primary of
view v is replicas[v mod n]), and turning each step's outbox into a `Ready`. The
sub-machines, each a plain class owning its state, share one `shared.Shared` (config,
crypto, signer, message log, view, executed seq, the outbox):
`vote_flow.VoteFlow` (the three-phase normal case and in-order execution into
`Ready.committed`), `request_flow.RequestFlow` (client requests, the primary's adaptive
batching, relaying to the primary), `view_flow.ViewChangeFlow` (ViewChange/NewView, the
view-change timer), `checkpoint_flow.CheckpointFlow` (checkpoints, stable-checkpoint garbage
collection, state transfer). Below them, pure helpers: `requests.py` (the request book),
`transfer.py` (catch-up), `log.py` (message log, predicates, water marks, the per-sender
next-view buffer), `checkpoint.py` (stability), `view_change.py` (ViewChange/NewView checks
and the O set), `safety.py` (the only signer of votes). Deliberate bugs for mutation tests
arrive as one `bugs.PbftBugs` (default none); only this module reads it.

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

from collections.abc import Callable
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
    Submit,
    Tick,
    snapshot_bytes,
)
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.pbft.bugs import (
    NO_BUGS,
    PbftBugs,
    SkipViewChangeSignatures,
    UnfencedSafetyRules,
)
from phalanx.consensus.pbft.checkpoint import StableCheckpoint
from phalanx.consensus.pbft.checkpoint_flow import CheckpointFlow
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    CheckpointData,
    Commit,
    CommittedBatch,
    FetchCheckpoint,
    FetchCommitted,
    FetchViewChanges,
    ForwardRequest,
    NewView,
    PbftDurableState,
    Prepare,
    PrePrepare,
    RelayedViewChange,
    ViewChange,
    VoteKind,
)
from phalanx.consensus.pbft.request_flow import RequestFlow
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.pbft.shared import Shared
from phalanx.consensus.pbft.transfer import CatchUp
from phalanx.consensus.pbft.view_flow import ViewChangeFlow, ViewTimer
from phalanx.consensus.pbft.vote_flow import VoteFlow
from phalanx.consensus.types import HardState, LocalProtocolError, Message, NodeId

_PBFT_TYPES = (
    PrePrepare,
    Prepare,
    Commit,
    Checkpoint,
    ViewChange,
    NewView,
    FetchViewChanges,
    RelayedViewChange,
    ForwardRequest,
    FetchCheckpoint,
    CheckpointData,
    FetchCommitted,
    CommittedBatch,
)

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


class PbftCore:
    """One PBFT replica. See the module docstring for the rules it keeps."""

    __slots__ = (
        "_checkpoints",
        "_others",
        "_requests",
        "_resend_view_change",
        "_s",
        "_skip_view_check",
        "_views",
        "_votes",
    )

    def __init__(
        self,
        config: PbftConfig,
        *,
        crypto: Crypto,
        restored: PbftRestoredState | None = None,
        bugs: PbftBugs = NO_BUGS,
        checkpoint_digest: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """`bugs`: deliberate bugs for mutation tests (`bugs.PbftBugs`); none by default.
        `checkpoint_digest`: the digest of checkpoint data that checkpoint votes carry and
        state transfer verifies fetched data against (pure, deterministic, never raises;
        the node's replica supplies it for an app with its own digest, `CheckpointTaken.digest`
        carries the same value for its own checkpoints); default: `crypto.digest(data)`."""
        if crypto.node_id != config.node_id:
            raise LocalProtocolError("crypto and config belong to different nodes")
        # The replicas a message may come from (every other one), as a set: checked per
        # message received (`config.replicas` is a tuple: O(n) per lookup).
        self._others = frozenset(config.replicas) - {config.node_id}
        d = restored.durable if restored is not None else PbftDurableState()
        executed = restored.executed if restored is not None else 0
        safety = (UnfencedSafetyRules if bugs.no_view_fence else SafetyRules)(crypto, d.safety)
        log = MessageLog(low=d.stable_seq, window=config.log_window)
        for proof in d.prepared:
            log.prepared_certs[proof.pre_prepare.seq] = proof
        s = self._s = Shared(
            config,
            crypto=crypto,
            safety=safety,
            log=log,
            view=d.view,
            active=d.view_active,
            executed=executed,
        )
        # The sub-machines are built in call order: each calls only those built before it
        # (requests <- votes <- checkpoints <- views); votes and views share the ViewTimer.
        # A primary never reuses a seq it pre-prepared in this view (even before a crash).
        own_pp = [
            v.seq for v in d.safety.votes if v.kind is VoteKind.PRE_PREPARE and v.view == d.view
        ]
        self._requests = RequestFlow(s, next_seq=max([executed, d.stable_seq, *own_pp]))
        timer = ViewTimer(base=config.view_change_ticks, cap=config.max_view_change_ticks)
        catchup = CatchUp(config, restarted=restored is not None)
        self._votes = VoteFlow(
            s,
            requests=self._requests,
            catchup=catchup,
            timer=timer,
            commit_quorum=config.quorum - 1 if bugs.commit_on_2f else config.quorum,
        )
        stable = StableCheckpoint(seq=d.stable_seq, digest=d.stable_digest, proof=d.stable_proof)
        self._checkpoints = CheckpointFlow(
            s,
            stable=stable,
            catchup=catchup,
            requests=self._requests,
            votes=self._votes,
            data=restored.checkpoint_data if restored is not None else None,
            state_digest=checkpoint_digest or crypto.digest,
        )
        self._views = ViewChangeFlow(
            s,
            timer=timer,
            requests=self._requests,
            votes=self._votes,
            checkpoints=self._checkpoints,
            verifier=SkipViewChangeSignatures(crypto) if bugs.accept_unsigned_view_change
            else crypto,
        )
        self._skip_view_check = bugs.skip_view_check
        if restored is not None and executed < d.stable_seq:
            self._checkpoints.start_transfer(stable, send=False)
        self._resend_view_change = not s.active

    # ----------------------------------------------------------------------------------
    # Core protocol

    @property
    def node_id(self) -> NodeId:
        return self._s.me

    @property
    def view(self) -> int:
        return self._s.view

    @property
    def executed(self) -> int:
        return self._s.executed

    def is_primary(self) -> bool:
        return self._s.is_primary()

    def status(self) -> PbftStatus:
        s = self._s
        role = "primary" if s.is_primary() else "backup"
        if not s.active:
            role = "view_change"
        return PbftStatus(
            node=s.me,
            role=role,
            term=s.view,
            commit_index=s.executed,
            leader=s.cfg.primary(s.view) if s.active else None,
            dropped=dict(sorted(s.dropped.items())),
            view=s.view,
            view_active=s.active,
            low_water=s.log.low,
            high_water=s.log.high,
            stable_digest=self._checkpoints.stable.digest,
            pending_requests=len(self._requests.book),
            log_slots=len(s.log),
            transferring=self._checkpoints.transferring,
        )

    def step(self, inp: Input, /) -> Ready:
        self._s.begin()
        if self._resend_view_change:
            self._resend_view_change = False
            self._views.broadcast_view_change()
        match inp:
            case Receive(src=src, message=message):
                self._receive(src, message)
            case Tick(now_ms=now_ms):
                if now_ms is not None:
                    self._s.now_ms = now_ms
                self._tick()
            case Submit(request=request):
                self._requests.submit(request)
            case Persisted(number=number):
                self._votes.on_persisted(number)
            case CheckpointTaken(index=index, data=data, digest=digest):
                self._checkpoints.taken(index, snapshot_bytes(data), digest)
            case CheckpointInstalled(meta=meta, data=data):
                self._checkpoints.installed(meta.index, data)
            case _:
                assert_never(inp)
        return self._finish()

    def _finish(self) -> Ready:
        s = self._s
        safety = s.safety
        opened = s.active and s.cfg.early_votes and safety.open_early(s.view)
        # Own votes always ride on a persisted Ready (even an identical re-sign after a restart).
        durable = safety.take_dirty() or s.durable_dirty or bool(s.new_own)
        if not (durable or opened or s.hard_dirty or s.snapshot_out is not None
                or s.early or s.out or s.exec_out or s.rejected_out):
            return EMPTY_READY  # most steps (a backup queueing a client's request, a tick)
        number = 0
        if durable or s.hard_dirty or s.snapshot_out is not None:
            s.ready_number += 1
            number = s.ready_number
        if opened:
            s.early_ready = number
        if s.new_own:
            self._votes.recorded(number, s.new_own)
        core_state = self.durable_state() if durable else None
        hard = HardState(view=s.view, commit=s.executed) if s.hard_dirty else None
        return Ready(
            number=number,
            early_messages=tuple(s.early),
            snapshot=s.snapshot_out,
            hard_state=hard,
            core_state=core_state,
            must_sync=durable or hard is not None,
            messages=tuple(s.out),
            committed=tuple(s.exec_out),
            rejected=tuple(s.rejected_out),
        )

    def durable_state(self) -> PbftDurableState:
        """What must survive a crash (also carried by `Ready.core_state` when it changes)."""
        s = self._s
        stable = self._checkpoints.stable
        return PbftDurableState(
            view=s.view,
            view_active=s.active,
            stable_seq=stable.seq,
            stable_digest=stable.digest,
            stable_proof=stable.proof,
            safety=s.safety.data,
            prepared=s.log.certificates(),
        )

    # ----------------------------------------------------------------------------------
    # Receive

    def _receive(self, src: NodeId, msg: Message) -> None:
        s = self._s
        if src not in self._others:  # (not a replica, or ourselves)
            s.drop("unknown_sender")
            return
        if not isinstance(msg, _PBFT_TYPES):
            s.drop("unknown_message")
            return
        if msg.replica != src:
            s.drop("sender_mismatch")
            return
        match msg:
            case PrePrepare() | Prepare() | Commit():
                if (msg.view == s.view and s.active) or self._skip_view_check:
                    self._votes.on_vote(msg)
                else:
                    self._views.park(src, msg)
            case Checkpoint():
                self._checkpoints.on_checkpoint(msg)
            case ViewChange():
                self._views.on_view_change(msg)
            case NewView():
                self._views.on_new_view(msg)
            case FetchViewChanges():
                self._views.on_fetch_view_changes(src, msg)
            case RelayedViewChange():
                self._views.on_relayed_view_change(msg)
            case ForwardRequest():
                self._requests.forwarded(msg.request)
            case FetchCheckpoint():
                self._checkpoints.serve_checkpoint(src, msg.seq)
                if msg.view < s.view:
                    self._views.resend_new_view(src)  # its certificate names a newer checkpoint
            case CheckpointData():
                self._checkpoints.on_checkpoint_data(msg)
            case FetchCommitted():
                self._checkpoints.serve_committed(src, msg.from_seq)
                if msg.view < s.view:
                    self._views.resend_new_view(src)  # e.g. a restarted replica's first fetch
            case CommittedBatch():
                self._checkpoints.on_committed_batch(msg)
            case _:
                assert_never(msg)

    # ----------------------------------------------------------------------------------
    # Time

    def _tick(self) -> None:
        s = self._s
        s.ticks += 1
        if s.ticks % s.cfg.checkpoint_resend_ticks == 0:
            self._checkpoints.resend_vote()
        self._requests.tick()
        self._views.tick()
        self._checkpoints.tick(gap=self._votes.gap)

"""The view-change protocol of a PBFT replica (Castro-Liskov §4.4, liveness §4.5.2).

Owns: `ViewChangeFlow`, the part of `PbftCore` (a base class of it) that leaves a view
(ViewChange), collects view changes, builds and checks NewView messages, enters the new view,
and resends its NewView to replicas that still speak in an older view (a restarted replica,
or one that missed the NewView): the normal-case retransmission that brings them back.
The pure checks and the O set are `view_change.py`'s; signing is `SafetyRules`'.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Liveness (§4.5.2): a replica that left a view starts the timer of the view change only once
2f+1 replicas (itself included) ask for that view or a later one (rule 1), joins the smallest
view f+1 replicas ask for above its own (rule 2), and doubles the timeout per consecutive
view change (rule 3, capped). While in a view change it re-broadcasts its ViewChange every
`fetch_ticks` (a lost one would otherwise keep the others' timers from starting).

Invariants: the view only grows; a replica joins a higher view only on its own timeout or
when f+1 replicas ask for views above its own (the smallest of them); a primary sends at
most one NewView per view; a NewView is resent to one peer at most once per `fetch_ticks`.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Rejection
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.pbft.checkpoint import CheckpointTracker, StableCheckpoint
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import AddResult, FutureVotes, MessageLog
from phalanx.consensus.pbft.messages import (
    Commit,
    ForwardRequest,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
)
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.pbft.view_change import (
    NewViewPlan,
    check_new_view,
    check_view_change,
    compute_new_view,
)
from phalanx.consensus.types import Message, NodeId


class ViewChangeFlow:
    """View changes for `PbftCore`, which provides the state and helpers declared here."""

    _cfg: PbftConfig
    _crypto: Crypto
    _me: NodeId
    _safety: SafetyRules
    _log: MessageLog
    _checkpoints: CheckpointTracker
    _requests: RequestBook
    _future: FutureVotes
    _view: int
    _active: bool
    _timer: int | None
    _backoff: int
    _ticks: int
    _next_seq: int
    _durable_dirty: bool
    _hard_dirty: bool
    _latest_vc: dict[NodeId, ViewChange]
    _new_view_sent: int
    _new_view: NewView | None
    _new_view_resent: dict[NodeId, tuple[int, int]]
    _new_own: list[PrePrepare | Prepare | Commit]
    _rejected_out: list[Rejection]
    _drop: Callable[[str], None]
    _send: Callable[[NodeId, Message], None]
    _broadcast: Callable[[Message], None]
    _timeout: Callable[[], int]
    is_primary: Callable[[], bool]
    _adopt_stable: Callable[[StableCheckpoint], None]
    _send_prepare: Callable[[PrePrepare], None]
    _flush: Callable[..., None]
    _on_vote: Callable[[PrePrepare | Prepare | Commit], None]

    def _resend_new_view(self, src: NodeId) -> None:
        """`src` speaks in an older view (it restarted, or missed our NewView): send it our
        NewView, at most once per `fetch_ticks` per peer (the normal-case retransmission
        that brings a lagging replica into the current view)."""
        nv = self._new_view
        if nv is None or nv.view != self._view or not self._active:
            return
        last = self._new_view_resent.get(src, (-1, 0))
        if last[0] == nv.view and self._ticks - last[1] < self._cfg.fetch_ticks:
            return
        self._new_view_resent[src] = (nv.view, self._ticks)
        self._send(src, nv)

    def _start_view_change(self, new_view: int) -> None:
        if new_view <= self._view and not self._active:
            return
        self._view = new_view
        self._active = False
        self._backoff += 1
        self._timer = None  # started by `_tick` once the view change is backed
        self._durable_dirty = True
        self._hard_dirty = True
        self._requests.view_changed()
        self._log.drop_views_below(new_view)
        self._broadcast_view_change()

    def _view_change_backed(self) -> bool:
        """Whether 2f+1 replicas (this one included) ask for this view or a later one."""
        v = self._view
        return sum(vc.new_view >= v for vc in self._latest_vc.values()) >= self._cfg.quorum

    def _rebroadcast_view_change(self) -> None:
        """Broadcast our ViewChange for the current view again (it may have been lost)."""
        own = self._latest_vc.get(self._me)
        if own is not None and own.new_view == self._view:
            self._broadcast(own)

    def _own_view_change(self) -> ViewChange:
        """Our signed ViewChange for the current view, from our stable checkpoint and the
        prepared certificates above it."""
        stable = self._checkpoints.stable
        vc = ViewChange(
            new_view=self._view,
            stable_seq=stable.seq,
            checkpoint_proof=stable.proof,
            prepared_proofs=self._log.certificates(),
            replica=self._me,
        )
        return ViewChange(
            new_view=vc.new_view,
            stable_seq=vc.stable_seq,
            checkpoint_proof=vc.checkpoint_proof,
            prepared_proofs=vc.prepared_proofs,
            replica=self._me,
            signature=self._safety.sign(vc),
        )

    def _broadcast_view_change(self) -> None:
        vc = self._own_view_change()
        self._broadcast(vc)
        self._add_view_change(vc)

    def _on_view_change(self, vc: ViewChange) -> None:
        reason = check_view_change(self._cfg, self._crypto, vc)
        if reason is not None:
            self._drop(reason)
            return
        if vc.new_view < self._view or (vc.new_view == self._view and self._active):
            self._drop("stale_view_change")
            self._resend_new_view(vc.replica)
            return
        self._add_view_change(vc)

    def _add_view_change(self, vc: ViewChange) -> None:
        old = self._latest_vc.get(vc.replica)
        if old is not None and old.new_view >= vc.new_view:
            return
        self._latest_vc[vc.replica] = vc
        # Liveness (§4.5.2): f+1 replicas want a higher view; join the smallest of them.
        higher = sorted(v.new_view for v in self._latest_vc.values() if v.new_view > self._view)
        if len(higher) >= self._cfg.weak_quorum:
            self._start_view_change(higher[0])
        self._maybe_new_view()

    def _maybe_new_view(self) -> None:
        v = self._view
        if self._active or self._cfg.primary(v) != self._me or self._new_view_sent >= v:
            return
        latest = self._latest_vc
        others = tuple(
            latest[r] for r in sorted(latest) if r != self._me and latest[r].new_view == v
        )
        own = latest.get(self._me)
        if own is None or own.new_view != v or 1 + len(others) < self._cfg.quorum:
            return
        if own.stable_seq < self._checkpoints.stable.seq:
            # Our checkpoint became stable after we asked for this view. V must carry it:
            # min-s is the latest stable checkpoint in V, and we can no longer sign a
            # pre-prepare at or below our own (`SafetyRules` pruned those records).
            own = latest[self._me] = self._own_view_change()
            self._broadcast(own)
        # V always holds our own ViewChange, so min-s is at least our stable checkpoint.
        vcs = (own, *others[: self._cfg.quorum - 1])
        self._new_view_sent = v
        plan = compute_new_view(self._cfg, self._crypto, v, vcs)
        signed = tuple(self._safety.sign_pre_prepare(pp) for pp in plan.pre_prepares)
        nv = NewView(view=v, view_changes=vcs, pre_prepares=signed, replica=self._me)
        nv = NewView(
            view=v,
            view_changes=vcs,
            pre_prepares=signed,
            replica=self._me,
            signature=self._safety.sign(nv),
        )
        self._new_view = nv
        self._broadcast(nv)
        self._enter_view(v, plan, signed)

    def _on_new_view(self, nv: NewView) -> None:
        if nv.view < self._view or (nv.view == self._view and self._active):
            self._drop("stale_new_view")
            return
        reason, plan = check_new_view(self._cfg, self._crypto, nv)
        if reason is not None or plan is None:
            self._drop(reason or "bad_new_view")
            return
        self._enter_view(nv.view, plan, nv.pre_prepares)

    def _enter_view(self, v: int, plan: NewViewPlan, pre_prepares: tuple[PrePrepare, ...]) -> None:
        self._view = v
        self._active = True
        self._timer = None
        self._durable_dirty = True
        self._hard_dirty = True
        self._log.drop_views_below(v)
        if plan.stable.seq > self._checkpoints.stable.seq:
            self._adopt_stable(plan.stable)
        self._next_seq = max(self._next_seq if self.is_primary() else 0, plan.max_seq)
        self._next_seq = max(self._next_seq, self._checkpoints.stable.seq)
        for pp in pre_prepares:
            if not self._log.in_window(pp.seq):
                continue
            self._requests.ordered(pp.batch, wait=not self.is_primary())
            if self.is_primary():
                self._log.add_pre_prepare(pp, counted=False)
                self._log.slot(v, pp.seq).prepare_sent = True
                self._new_own.append(pp)
            elif self._log.add_pre_prepare(pp, counted=True) is AddResult.ADDED:
                self._send_prepare(pp)
        primary = self._cfg.primary(v)
        book = self._requests
        if primary == self._me:
            for r in book.take_waiting():
                if not book.queue_pending(r):
                    self._rejected_out.append(Rejection(request=r, reason="overloaded"))
            self._flush(force=True)
        else:
            for r in book.waiting_sorted():
                self._send(primary, ForwardRequest(request=r, replica=self._me))
        for msg in self._future.take(v):
            self._on_vote(msg)

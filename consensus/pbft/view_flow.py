"""The view-change protocol of a PBFT replica (Castro-Liskov §4.4, liveness §4.5.2).

Owns: `ViewChangeFlow`: the latest ViewChange of every replica, the NewView it sent with
its V (and when it resent it to whom), the votes of views not entered yet (`FutureVotes`),
and the view-change timer (`ViewTimer`, which `vote_flow` resets when a batch executes). It
leaves a view (ViewChange), collects view changes, builds NewView messages (V named by
digest), checks received ones once it holds every ViewChange they name (`view_fetch.py`
waits for and fetches the missing ones, and answers others' fetches), enters the new view,
parks votes of other views, and resends its NewView to replicas that still speak in an
older view (a restarted replica, or one that missed the NewView): the normal-case
retransmission that brings them back. The pure checks and the O set are `view_change.py`'s;
signing is `SafetyRules`'. It moves `Shared.view` and `Shared.active`, and tells the other
sub-machines about a new view (`RequestFlow.new_view`/`entered_view`, `VoteFlow.prepare`,
`CheckpointFlow.adopt_stable`).

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

from typing import TYPE_CHECKING

from phalanx.consensus.pbft.log import AddResult, FutureVotes
from phalanx.consensus.pbft.messages import (
    FetchViewChanges,
    NewView,
    PrePrepare,
    RelayedViewChange,
    ViewChange,
)
from phalanx.consensus.pbft.request_flow import RequestFlow
from phalanx.consensus.pbft.shared import Shared, Vote
from phalanx.consensus.pbft.view_change import (
    CheckCrypto,
    NewViewPlan,
    check_new_view,
    check_new_view_header,
    check_view_change,
    compute_new_view,
)
from phalanx.consensus.pbft.view_fetch import ViewChangeFetch, refs_of
from phalanx.consensus.types import NodeId

if TYPE_CHECKING:
    from phalanx.consensus.pbft.checkpoint_flow import CheckpointFlow
    from phalanx.consensus.pbft.vote_flow import VoteFlow


class ViewTimer:
    """The view-change timer: ticks left (None: not running) and the backoff exponent."""

    __slots__ = ("_base", "_cap", "backoff", "remaining")

    def __init__(self, *, base: int, cap: int) -> None:
        self._base = base
        self._cap = cap
        self.remaining: int | None = None
        self.backoff = 0

    def timeout(self) -> int:
        """The base timeout doubled per consecutive view change, capped (rule 3)."""
        return min(self._base << min(self.backoff, 30), self._cap)

    def progressed(self) -> None:
        """A batch executed in the current view: the primary works; restart from scratch
        (the next tick starts the timer again if requests still wait)."""
        self.backoff = 0
        self.remaining = None


class ViewChangeFlow:
    """View changes; see the module docstring."""

    __slots__ = (
        "_checkpoints",
        "_fetch",
        "_future",
        "_latest_vc",
        "_new_view",
        "_new_view_resent",
        "_new_view_sent",
        "_new_view_vcs",
        "_requests",
        "_s",
        "_timer",
        "_verified",
        "_verified_cap",
        "_verifier",
        "_votes",
    )

    def __init__(
        self,
        shared: Shared,
        *,
        timer: ViewTimer,
        requests: RequestFlow,
        votes: VoteFlow,
        checkpoints: CheckpointFlow,
        verifier: CheckCrypto,
    ) -> None:
        """`verifier` checks view changes and new views (the replica's crypto)."""
        self._s = shared
        self._timer = timer
        self._requests = requests
        self._votes = votes
        self._checkpoints = checkpoints
        self._verifier = verifier
        self._latest_vc: dict[NodeId, ViewChange] = {}
        self._new_view_sent = -1
        self._new_view: NewView | None = None  # ours, for the view we lead (resent to laggards)
        self._new_view_vcs: dict[NodeId, ViewChange] = {}  # its V (served to backups lacking one)
        self._fetch = ViewChangeFetch(shared)
        self._verified: set[object] = set()  # votes of verified certificates (`_remember_votes`)
        self._verified_cap = 2 * shared.cfg.n * (shared.cfg.log_window + 1)
        self._new_view_resent: dict[NodeId, tuple[int, int]] = {}
        self._future = FutureVotes(per_sender=3 * shared.cfg.log_window)

    def own_view_change(self) -> ViewChange | None:
        """The last ViewChange this replica sent (None: none yet)."""
        return self._latest_vc.get(self._s.me)

    # ----------------------------------------------------------------------------------
    # Votes of other views, laggards

    def park(self, src: NodeId, msg: Vote) -> None:
        """A vote not of the current active view: an older view's tells us `src` lags (send
        it our NewView); a later view's waits until we enter that view."""
        s = self._s
        if msg.view < s.view:
            s.drop("wrong_view")
            self.resend_new_view(src)
        elif not self._future.add(src, msg):  # replayed once we enter that view
            s.drop("future_view_overflow")

    def resend_new_view(self, src: NodeId) -> None:
        """`src` speaks in an older view (it restarted, or missed our NewView): send it our
        NewView, at most once per `fetch_ticks` per peer (the normal-case retransmission
        that brings a lagging replica into the current view)."""
        s = self._s
        nv = self._new_view
        if nv is None or nv.view != s.view or not s.active:
            return
        last = self._new_view_resent.get(src, (-1, 0))
        if last[0] == nv.view and s.ticks - last[1] < s.cfg.fetch_ticks:
            return
        self._new_view_resent[src] = (nv.view, s.ticks)
        s.send(src, nv)

    # ----------------------------------------------------------------------------------
    # Time

    def tick(self) -> None:
        """Run the view-change timer; re-broadcast our ViewChange while in a view change."""
        s = self._s
        timer = self._timer
        if s.active:
            if self._requests.waiting() and not s.is_primary():
                left = timer.remaining = (
                    timer.timeout() if timer.remaining is None else timer.remaining - 1
                )
                # Before blaming the primary, forget what is known executed after all (a
                # request its client already followed with a later one that executed).
                if left <= 0 and self._requests.forget_executed():
                    self.start_view_change(s.view + 1)
                elif left <= 0:
                    timer.remaining = None
            else:
                timer.remaining = None
        elif timer.remaining is None:
            # Liveness rule 1 (§4.5.2): a view change's timer starts only once 2f+1
            # replicas ask for this view or a later one; a replica that left a view early
            # (or alone) waits for the others instead of racing ahead one view per timeout,
            # where equal capped timeouts could keep it one view ahead of them for good.
            if self._view_change_backed():
                timer.remaining = timer.timeout()
        else:
            timer.remaining -= 1
            if timer.remaining <= 0:
                self.start_view_change(s.view + 1)
        if not s.active and s.ticks % s.cfg.fetch_ticks == 0:
            self._rebroadcast_view_change()  # a lost ViewChange must not stall rule 1 for good
        self._fetch.tick(self._latest_vc)

    # ----------------------------------------------------------------------------------
    # Leaving a view

    def start_view_change(self, new_view: int) -> None:
        s = self._s
        if new_view <= s.view and not s.active:
            return
        s.view = new_view
        s.active = False
        self._fetch.forget(new_view, entered=False)
        self._timer.backoff += 1
        self._timer.remaining = None  # started by `tick` once the view change is backed
        s.durable_dirty = True
        s.hard_dirty = True
        self._requests.view_changed()
        s.log.drop_views_below(new_view)
        self.broadcast_view_change()

    def _view_change_backed(self) -> bool:
        """Whether 2f+1 replicas (this one included) ask for this view or a later one."""
        v = self._s.view
        return sum(vc.new_view >= v for vc in self._latest_vc.values()) >= self._s.cfg.quorum

    def _rebroadcast_view_change(self) -> None:
        """Broadcast our ViewChange for the current view again (it may have been lost)."""
        s = self._s
        own = self._latest_vc.get(s.me)
        if own is not None and own.new_view == s.view:
            s.broadcast(own)

    def _own_view_change(self) -> ViewChange:
        """Our signed ViewChange for the current view, from our stable checkpoint and the
        prepared certificates above it."""
        s = self._s
        stable = self._checkpoints.stable
        vc = ViewChange(
            new_view=s.view,
            stable_seq=stable.seq,
            checkpoint_proof=stable.proof,
            prepared_proofs=s.log.certificates(),
            replica=s.me,
        )
        return ViewChange(
            new_view=vc.new_view,
            stable_seq=vc.stable_seq,
            checkpoint_proof=vc.checkpoint_proof,
            prepared_proofs=vc.prepared_proofs,
            replica=s.me,
            signature=s.safety.sign(vc),
        )

    def broadcast_view_change(self) -> None:
        vc = self._own_view_change()
        self._remember_votes(vc)  # our own certificates: each vote verified on arrival
        self._s.broadcast(vc)
        self._add_view_change(vc)

    # ----------------------------------------------------------------------------------
    # Collecting view changes, NewView

    def on_view_change(self, vc: ViewChange, *, relayed: bool = False) -> None:
        """A ViewChange from its signer, or `relayed` by another replica (an answer to our
        `FetchViewChanges`; its signature is the signer's all the same)."""
        s = self._s
        # A copy of the ViewChange we hold from its sender (its periodic re-broadcast) passed
        # these checks already: the same verdict, without ~2f+1 signatures per certificate.
        if self._latest_vc.get(vc.replica) != vc and not self._fetch.found(vc):
            reason = check_view_change(s.cfg, self._verifier, vc, known=self._verified)
            if reason is not None:
                s.drop(reason)
                return
            self._remember_votes(vc)
        if vc.new_view < s.view or (vc.new_view == s.view and s.active):
            s.drop("stale_view_change")
            if not relayed:
                self.resend_new_view(vc.replica)
            return
        if vc.replica != s.me:  # our own one sent back (signed before a restart): kept aside
            self._add_view_change(vc)
        if self._fetch.offer(vc):
            self._try_waiting_new_views()

    def _remember_votes(self, vc: ViewChange) -> None:
        """The votes of `vc`'s certificates (verified): another view change's certificates
        for the same seqs mostly hold the same ones, checked then by lookup, not signature
        (per replica, ~n verifications per seq instead of ~n^2). Cleared when over
        `_verified_cap`, so bounded whatever Byzantine signers send."""
        verified = self._verified
        if len(verified) > self._verified_cap:
            verified.clear()
        for proof in vc.prepared_proofs:
            verified.add(proof.pre_prepare)
            verified.update(proof.prepares)

    def on_relayed_view_change(self, msg: RelayedViewChange) -> None:
        self.on_view_change(msg.view_change, relayed=True)

    def on_fetch_view_changes(self, src: NodeId, msg: FetchViewChanges) -> None:
        """Send `src` the view changes it lacks that we hold: our own, the latest of each
        signer, the V of the NewView we sent, those found for a NewView we wait on."""
        own_nv = self._new_view_vcs if self._new_view is not None and (
            self._new_view.view == msg.view) else {}

        def held(replica: NodeId) -> tuple[ViewChange | None, ...]:
            return (self._latest_vc.get(replica), own_nv.get(replica))

        self._fetch.serve(src, msg, held)

    def _add_view_change(self, vc: ViewChange) -> None:
        old = self._latest_vc.get(vc.replica)
        # A newer ViewChange of the same view replaces the one held (its signer restarted,
        # or, as new primary, refreshed its checkpoint): the NewView names the newer one.
        if old is not None and (
            old.new_view > vc.new_view or (old.new_view == vc.new_view and old == vc)
        ):
            return
        self._latest_vc[vc.replica] = vc
        # Liveness (§4.5.2): f+1 replicas want a higher view; join the smallest of them.
        view = self._s.view
        higher = sorted(v.new_view for v in self._latest_vc.values() if v.new_view > view)
        if len(higher) >= self._s.cfg.weak_quorum:
            self.start_view_change(higher[0])
        self._maybe_new_view()

    def _maybe_new_view(self) -> None:
        s = self._s
        cfg = s.cfg
        me = s.me
        v = s.view
        if s.active or cfg.primary(v) != me or self._new_view_sent >= v:
            return
        latest = self._latest_vc
        others = tuple(latest[r] for r in sorted(latest) if r != me and latest[r].new_view == v)
        own = latest.get(me)
        if own is None or own.new_view != v or 1 + len(others) < cfg.quorum:
            return
        if own.stable_seq < self._checkpoints.stable.seq:
            # Our checkpoint became stable after we asked for this view. V must carry it:
            # min-s is the latest stable checkpoint in V, and we can no longer sign a
            # pre-prepare at or below our own (`SafetyRules` pruned those records).
            own = latest[me] = self._own_view_change()
            s.broadcast(own)
        # V always holds our own ViewChange, so min-s is at least our stable checkpoint.
        vcs = (own, *others[: cfg.quorum - 1])
        self._new_view_sent = v
        plan = compute_new_view(cfg, s.crypto, v, vcs)
        signed = tuple(s.safety.sign_pre_prepare(pp) for pp in plan.pre_prepares)
        refs = refs_of(self._fetch, vcs)
        nv = NewView(view=v, view_changes=refs, pre_prepares=signed, replica=me)
        nv = NewView(
            view=v,
            view_changes=refs,
            pre_prepares=signed,
            replica=me,
            signature=s.safety.sign(nv),
        )
        self._new_view = nv
        self._new_view_vcs = {vc.replica: vc for vc in vcs}
        s.broadcast(nv)
        self._enter_view(v, plan, signed)

    def on_new_view(self, nv: NewView) -> None:
        """Check the NewView's header, then wait for the view changes it names (most are
        held already: each replica broadcast its own), fetching the missing ones."""
        s = self._s
        if nv.view < s.view or (nv.view == s.view and s.active):
            s.drop("stale_new_view")
            return
        reason = check_new_view_header(s.cfg, self._verifier, nv)
        if reason is not None:
            s.drop(reason)
            return
        if not self._fetch.wait(nv):
            s.drop("stale_new_view")  # a copy of the one waiting, or older than it
            return
        for _ in range(self._fetch.mismatched(nv, self._latest_vc)):
            s.drop("view_change_digest_mismatch")
        self._try_waiting_new_views()

    def _try_waiting_new_views(self) -> None:
        """Check the waiting NewViews, lowest view first, and enter the view of the first
        one whose view changes are all at hand and whose O follows from them (each view
        change was verified on arrival: not again)."""
        s = self._s
        fetch = self._fetch
        for w in fetch.by_view():
            vcs = fetch.resolve(w, self._latest_vc)
            if vcs is None:
                continue
            del fetch.waiting[w.nv.replica]
            nv = w.nv
            reason, plan = check_new_view(s.cfg, self._verifier, nv, vcs, checked=True)
            if reason is not None or plan is None:
                s.drop(reason or "bad_new_view")
                continue
            self._enter_view(nv.view, plan, nv.pre_prepares)
            return

    def _enter_view(self, v: int, plan: NewViewPlan, pre_prepares: tuple[PrePrepare, ...]) -> None:
        s = self._s
        log = s.log
        s.view = v
        s.active = True
        self._fetch.forget(v, entered=True)
        self._timer.remaining = None
        s.durable_dirty = True
        s.hard_dirty = True
        log.drop_views_below(v)
        checkpoints = self._checkpoints
        if plan.stable.seq > checkpoints.stable.seq:
            checkpoints.adopt_stable(plan.stable)
        requests = self._requests
        requests.new_view(max_seq=plan.max_seq, stable_seq=checkpoints.stable.seq)
        for pp in pre_prepares:
            if not log.in_window(pp.seq):
                continue
            requests.ordered(pp.batch, wait=not s.is_primary())
            if s.is_primary():
                log.add_pre_prepare(pp, counted=False)
                log.slot(v, pp.seq).prepare_sent = True
                s.new_own.append(pp)
            elif log.add_pre_prepare(pp, counted=True) is AddResult.ADDED:
                self._votes.prepare(pp)
        requests.entered_view()
        for msg in self._future.take(v):
            self._votes.on_vote(msg)

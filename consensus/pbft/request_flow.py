"""Client requests at a PBFT replica: queueing, the primary's batching, relaying to it.

Owns: `RequestFlow`: the `RequestBook` (requests.py) and `next_seq`, the highest seq this
replica pre-prepared (or may build on) in the current view. It takes a client request
(`Submit`, or a backup's `ForwardRequest` at the primary), proposes batches by the adaptive
rule of `RequestBook` (signing and sending the primary's own pre-prepares), relays
requests a backup waited on for `PbftConfig.forward_ticks` ticks to the primary, and runs the
primary's batch timer on each tick. The other sub-machines tell it what happened to
requests (ordered, executed, a view change, a checkpoint installed) through its methods.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Invariants: a request is queued at most once per view (`RequestBook.known`); a retry of an
executed request is ordered again only if it is its client's latest; a backup relays each
waiting request at most once per view, and never one a pre-prepare of this view carries;
the primary never reuses a seq it pre-prepared in this view (`next_seq` only grows within
a view), and never proposes in a view it is fenced in (`SafetyRules.fenced`).
"""

from __future__ import annotations

from collections.abc import Sequence

from phalanx.consensus.core import Rejection
from phalanx.consensus.pbft.messages import ForwardRequest, PrePrepare
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.shared import Shared
from phalanx.consensus.pbft.stamp import batch_digest, fresh_stamp
from phalanx.consensus.types import ClientRequest


class RequestFlow:
    """Client requests and batching; see the module docstring."""

    __slots__ = ("_s", "book", "next_seq")

    def __init__(self, shared: Shared, *, next_seq: int) -> None:
        self._s = shared
        self.book = RequestBook(max_pending=shared.cfg.max_pending)
        self.next_seq = next_seq

    # ----------------------------------------------------------------------------------
    # Requests in

    def submit(self, request: ClientRequest) -> None:
        s = self._s
        book = self.book
        if book.known(request):
            return
        if book.executed(request):
            # A retry of an executed request: its client lacks f+1 replies (replicas that
            # crashed, or caught up by state transfer, never answered it). The runtime
            # answers it from the session table first; whatever reaches the core is ordered
            # once more (at most once per view while in progress), so that every replica
            # answers it from its session table when it executes (a duplicate is not rerun).
            if not book.latest(request):
                return  # older than the client's latest: nothing is waiting for it
            if s.active and s.is_primary() and book.queue_pending(request):
                self.flush()
            return
        if s.active and s.is_primary():
            if not book.queue_pending(request):
                s.rejected_out.append(Rejection(request=request, reason="overloaded"))
                return
            self.flush()
            return
        delay = s.cfg.forward_ticks
        relay_later = s.active and delay > 0
        if not book.queue_waiting(request,
                                  forward_at=s.ticks + delay if relay_later else None):
            s.rejected_out.append(Rejection(request=request, reason="overloaded"))
            return
        if s.active and not relay_later:
            s.send(s.cfg.primary(s.view), ForwardRequest(request=request, replica=s.me))

    def forwarded(self, request: ClientRequest) -> None:
        """A backup relayed `request` to us (`ForwardRequest`)."""
        s = self._s
        if not (s.active and s.is_primary()):
            s.drop("not_primary")
        else:
            self.submit(request)

    # ----------------------------------------------------------------------------------
    # Proposing (the primary)

    def flush(self, *, force: bool = False) -> None:
        """Propose batches by the adaptive rule (`RequestBook.should_flush`), or every
        pending request when `force` (the batch timer ran out, a new view began)."""
        s = self._s
        book = self.book
        cfg = s.cfg
        if s.safety.fenced(s.view):
            return  # restarted in this view: we propose again from the next view on
        while book.pending and self.next_seq + 1 <= s.log.high:
            if not force and not book.should_flush(
                batch_size=cfg.batch_size,
                inflight=self.next_seq - s.executed,
                max_inflight=cfg.max_inflight_batches,
            ):
                return
            seq = self.next_seq + 1
            ts = 0  # a block stamp only for apps that ask (`stamp.py`)
            if cfg.block_stamp_skew_ms:
                floor = max(s.executed_ts, s.log.stamp_bounds(s.view, seq)[0])
                stamp = fresh_stamp(now_ms=s.now_ms, floor=floor)
                if stamp is None:
                    return  # no clock reading yet: the next tick proposes
                ts = stamp
            batch = book.take_batch(cfg.batch_size)
            proposer = s.me if ts else ""
            pp = PrePrepare(view=s.view, seq=seq,
                            digest=batch_digest(s.crypto, batch, ts, proposer),
                            batch=batch, replica=s.me, timestamp=ts, proposer=proposer)
            self._propose(pp)

    def _propose(self, pp: PrePrepare) -> None:
        """Sign and send one of our own pre-prepares."""
        s = self._s
        early = s.early_ok(pp.view)
        signed = s.safety.sign_pre_prepare(pp, early=early)  # a conflict: our own bug
        self.next_seq = max(self.next_seq, pp.seq)
        s.log.add_pre_prepare(signed, counted=early)
        s.log.slot(pp.view, pp.seq).prepare_sent = True
        self.book.ordered(pp.batch)
        if early:
            s.send_early(signed)
        else:
            s.broadcast(signed)
            s.new_own.append(signed)

    # ----------------------------------------------------------------------------------
    # Time

    def tick(self) -> None:
        """Relay what a backup waited on long enough; run the primary's batch timer."""
        s = self._s
        book = self.book
        relay = book.due_forwards(s.ticks)
        if relay and s.active and not s.is_primary():
            primary = s.cfg.primary(s.view)
            for r in relay:
                s.send(primary, ForwardRequest(request=r, replica=s.me))
        if s.active and s.is_primary():
            room = self.next_seq - s.executed < s.cfg.max_inflight_batches
            if book.pending:
                book.pending_age += 1
            if room:
                if book.tick():  # the expected returning clients are late: stop waiting
                    self.flush()
            elif book.pending and book.pending_age >= s.cfg.batch_ticks:
                self.flush(force=True)

    # ----------------------------------------------------------------------------------
    # What the other sub-machines report

    def ordered(self, batch: tuple[ClientRequest, ...], *, wait: bool) -> None:
        """A pre-prepare of this view carries `batch` (`wait`: a backup waits for it to
        execute)."""
        self.book.ordered(batch, wait=wait)

    def was_executed(self, batch: tuple[ClientRequest, ...]) -> None:
        self.book.was_executed(batch)

    def executed(self, requests: Sequence[ClientRequest]) -> None:
        """`requests` just executed: the primary proposes what accumulated, once the
        clients just answered are back (`RequestBook.served`)."""
        if self._s.is_primary():
            self.book.served(requests)
            self.flush()

    def waiting(self) -> bool:
        """Whether a backup waits for requests to execute (its view-change timer runs)."""
        return bool(self.book.waiting)

    def forget_executed(self) -> bool:
        """Before a backup blames the primary: forget waiting requests known executed after
        all; whether any still waits (`RequestBook.forget_executed`)."""
        return self.book.forget_executed()

    def forget_waiting(self) -> None:
        """A checkpoint was installed: which waiting requests it executed is unknown, so
        forget them all (their clients retransmit; the replica layer answers the executed
        ones from its sessions) rather than let them expire the view-change timer."""
        self.book.waiting.clear()

    def view_changed(self) -> None:
        self.book.view_changed()

    def new_view(self, *, max_seq: int, stable_seq: int) -> None:
        """Entering a view whose NewView re-issues seqs up to `max_seq`: the primary goes
        on above them (and above its own proposals, if it led before), a backup's
        numbering restarts."""
        s = self._s
        self.next_seq = max(self.next_seq if s.is_primary() else 0, max_seq)
        self.next_seq = max(self.next_seq, stable_seq)

    def entered_view(self) -> None:
        """The new view's re-issued pre-prepares are in: the primary proposes what waited,
        a backup relays it to the new primary."""
        s = self._s
        primary = s.cfg.primary(s.view)
        book = self.book
        if primary == s.me:
            for r in book.take_waiting():
                if not book.queue_pending(r):
                    s.rejected_out.append(Rejection(request=r, reason="overloaded"))
            self.flush(force=True)
        else:
            for r in book.waiting_sorted():
                s.send(primary, ForwardRequest(request=r, replica=s.me))

    def stable_moved(self, seq: int) -> None:
        """A checkpoint at `seq` became stable: the water marks moved, the primary may
        propose again (never at or below the checkpoint)."""
        s = self._s
        if s.active and s.is_primary():
            self.next_seq = max(self.next_seq, seq)
            self.flush()

"""Client requests at a PBFT replica: queueing, the primary's batching, relaying to it.

Owns: `RequestFlow`, the part of `PbftCore` (a base class of it) that takes a client request
(`Submit`, or a backup's `ForwardRequest` at the primary), proposes batches by the adaptive
rule of `requests.RequestBook`, signs and sends the primary's own pre-prepares, and relays
requests a backup waited on for `PbftConfig.forward_ticks` ticks to the primary.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Invariants: a request is queued at most once per view (`RequestBook.known`); a retry of an
executed request is ordered again only if it is its client's latest; a backup relays each
waiting request at most once per view, and never one a pre-prepare of this view carries.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Rejection
from phalanx.consensus.crypto import Crypto, digest_of
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import Commit, ForwardRequest, Prepare, PrePrepare
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.types import ClientRequest, Message, NodeId


class RequestFlow:
    """Client requests for `PbftCore`, which provides the state and helpers declared here."""

    _cfg: PbftConfig
    _crypto: Crypto
    _me: NodeId
    _safety: SafetyRules
    _log: MessageLog
    _requests: RequestBook
    _view: int
    _active: bool
    _executed: int
    _next_seq: int
    _ticks: int
    _rejected_out: list[Rejection]
    _new_own: list[PrePrepare | Prepare | Commit]
    _send: Callable[[NodeId, Message], None]
    _broadcast: Callable[[Message], None]
    _early_ok: Callable[[int], bool]
    _send_early: Callable[[PrePrepare | Prepare], None]
    is_primary: Callable[[], bool]

    def _submit(self, request: ClientRequest) -> None:
        book = self._requests
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
            if self._active and self.is_primary() and book.queue_pending(request):
                self._flush()
            return
        if self._active and self.is_primary():
            if not book.queue_pending(request):
                self._rejected_out.append(Rejection(request=request, reason="overloaded"))
                return
            self._flush()
            return
        delay = self._cfg.forward_ticks
        relay_later = self._active and delay > 0
        if not book.queue_waiting(request,
                                  forward_at=self._ticks + delay if relay_later else None):
            self._rejected_out.append(Rejection(request=request, reason="overloaded"))
            return
        if self._active and not relay_later:
            self._send(
                self._cfg.primary(self._view), ForwardRequest(request=request, replica=self._me)
            )

    def _flush(self, *, force: bool = False) -> None:
        """Propose batches by the adaptive rule (`RequestBook.should_flush`), or every
        pending request when `force` (the batch timer ran out, a new view began)."""
        book = self._requests
        cfg = self._cfg
        if self._safety.fenced(self._view):
            return  # restarted in this view: we propose again from the next view on
        while book.pending and self._next_seq + 1 <= self._log.high:
            if not force and not book.should_flush(
                batch_size=cfg.batch_size,
                inflight=self._next_seq - self._executed,
                max_inflight=cfg.max_inflight_batches,
            ):
                return
            batch = book.take_batch(cfg.batch_size)
            seq = self._next_seq + 1
            pp = PrePrepare(
                view=self._view,
                seq=seq,
                digest=digest_of(self._crypto, batch),
                batch=batch,
                replica=self._me,
            )
            self._propose(pp)

    def _propose(self, pp: PrePrepare) -> None:
        """Sign and send one of our own pre-prepares (normal case or NewView's O set)."""
        early = self._early_ok(pp.view)
        signed = self._safety.sign_pre_prepare(pp, early=early)  # a conflict: our own bug
        self._next_seq = max(self._next_seq, pp.seq)
        self._log.add_pre_prepare(signed, counted=early)
        self._log.slot(pp.view, pp.seq).prepare_sent = True
        self._requests.ordered(pp.batch)
        if early:
            self._send_early(signed)
        else:
            self._broadcast(signed)
            self._new_own.append(signed)

    def _relay_due(self) -> None:
        """Relay the requests this backup waited on long enough (`forward_ticks`)."""
        relay = self._requests.due_forwards(self._ticks)
        if relay and self._active and not self.is_primary():
            primary = self._cfg.primary(self._view)
            for r in relay:
                self._send(primary, ForwardRequest(request=r, replica=self._me))

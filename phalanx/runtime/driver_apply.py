"""Completing a durable batch: steps 2-5 of the `Ready` ordering rule in the trio driver.

Owns: `BatchCompletion`, a base class of `phalanx.runtime.driver.Driver` (which provides the
state declared here): `_complete(batch)`, called on the core task once a batch is durable
(`phalanx.runtime.driver_persist`). It releases the messages of all the batch's Readys to the
transport (in Ready order, then `flush_sends`), then, in Ready order, applies committed
entries through the replica and answers their clients (OK, or ERROR for an expired request,
an expired session or a malformed transaction), answers rejections (ERROR when invalid,
REDIRECT with a leader hint, else RETRY) and aborts (ABORTED), serves the reads whose index
is applied, then feeds `Persisted(last number)` back to the core, then the replica's
`CheckpointTaken`s.

Rules: a later Ready's messages may leave before an earlier Ready's entries are applied
(step 2 depends only on step 1, done for the whole batch); steps 3-5 keep Ready order; a
message never leaves before its Ready is durable (early messages are the driver's, not
here). Must not import: sockets, TLS, prometheus, any consensus core,
`phalanx.runtime.driver`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phalanx.apps.replica import ApplyStatus, Replica
from phalanx.consensus.core import CoreStatus, Input, Persisted, ReadState, Ready
from phalanx.net.client_protocol import ReplyStatus
from phalanx.runtime.driver_output import PeerOutput
from phalanx.runtime.driver_stats import DriverObserver, DriverStatistics
from phalanx.runtime.phase_trace import PhaseTrace

__all__ = ["BatchCompletion"]


class BatchCompletion:
    """`_complete` for `Driver` (see the module docstring)."""

    replica: Replica
    stats: DriverStatistics
    _observer: DriverObserver | None
    _trace: PhaseTrace | None
    _status: CoreStatus
    _output: PeerOutput
    _answer: Callable[..., None]
    """`ClientWaiters.answer` of the driver's waiters."""
    _unsent_output: bool
    _reads: list[ReadState]
    _internal: list[Input]
    _flush_sends: Callable[[], None]
    _serve_reads: Callable[[], None]
    _step_internal: Callable[[], None]

    def _complete(self, batch: Sequence[Ready]) -> None:
        """Steps 2-5 of the ordering rule for a durable batch, in Ready order."""
        self.stats.batches += 1
        self._unsent_output = True
        replica = self.replica
        last = 0
        applied = 0
        output = self._output
        sent = False
        for ready in batch:
            for send in ready.messages:
                output.send(send.to, send.message)
                sent = True
        if sent:
            self._flush_sends()
        for ready in batch:
            for entry in ready.committed:
                for outcome in replica.apply(entry):
                    if outcome.status is ApplyStatus.EXPIRED:
                        self._answer(outcome.client_id, outcome.request_no, ReplyStatus.ERROR,
                                     message="expired: a newer request of this client was "
                                     "already applied")
                    elif outcome.status is ApplyStatus.SESSION_EXPIRED:
                        self._answer(outcome.client_id, outcome.request_no, ReplyStatus.ERROR,
                                     message="session expired: this request may have been "
                                     "applied before; use a new client id")
                    elif outcome.status is ApplyStatus.INVALID:
                        self._answer(outcome.client_id, outcome.request_no, ReplyStatus.ERROR,
                                     message="malformed transaction: not applied")
                    else:
                        self._answer(outcome.client_id, outcome.request_no, ReplyStatus.OK,
                                     result=outcome.result)
                applied += 1
            for rejection in ready.rejected:
                hint = rejection.leader_hint
                status = (ReplyStatus.ERROR if rejection.invalid
                          else ReplyStatus.REDIRECT if hint is not None else ReplyStatus.RETRY)
                self._answer(rejection.request.client_id, rejection.request.request_no, status,
                             leader_hint=hint, message=rejection.reason)
            for abort in ready.aborted:
                self._answer(abort.request.client_id, abort.request.request_no,
                             ReplyStatus.ABORTED, message=abort.reason)
            if ready.reads:
                self._reads.extend(ready.reads)
            if ready.has_persistence:
                last = max(last, ready.number)
        if self._reads:
            self._serve_reads()
        if applied and self._trace is not None:
            self._trace.mark("apply", str(applied))
        if applied:
            self.stats.applied_entries += applied
            if self._observer is not None:
                self._observer.on_applied(applied, replica.applied_index,
                                          self._status.commit_index)
        if last:
            self._internal.append(Persisted(number=last))
        if applied:
            self._internal.extend(replica.poll())
        if self._internal:
            self._step_internal()

"""How the driver admits a client call: the part of `phalanx.runtime.driver.Driver` between a
decoded
`ClientCall` and a core input.

Owns: the client-side items of the driver's input channel (`CallInput`, `CallsInput`,
`StatusInput`, `DisconnectInput`), `CallAdmission` (a base class of `Driver`) and its rules,
in the order they apply:
- a request the replica's arrival checks refuse (`Replica.admit`: client id length, the
  application's `Admission` hook, e.g. KV key/value sizes) is answered ERROR at once: it is
  never proposed, so it never reaches the log, the peers or any WAL;
- a STALE read is answered at once from the applied state (RETRY while a snapshot installs);
  while storage is unavailable, every other call is answered UNAVAILABLE
  (`_refuse_unavailable`; `_while_unavailable` handles every input then: the core is not
  stepped, peer messages are dropped and counted, ticks only retry the storage);
- a write whose `request_no` the session table already holds is answered from it (OK with
  the cached result, or ERROR for an older one): it is never proposed twice;
- a leader holding `max_pending_calls` unanswered calls answers a NEW write with RETRY
  naming itself (backpressure), while a retry of a write it already proposed and has not
  answered joins the first waiter instead of becoming a second proposal;
- the remaining writes of one pass over the input channel are batched into one proposal
  (`propose_batch`), cut at `PROPOSAL_MAX_REQUESTS` requests or `PROPOSAL_MAX_BYTES` bytes;
  reads (and writes without `propose_batch`) are stepped as `Submit`s.

Must not import: sockets, TLS, prometheus, any consensus core, `phalanx.runtime.driver`.

Invariants: runs on the core task only (nothing is locked); a client error is normal input
and never raises; every admitted call has a waiter, answered at most once
(`phalanx.runtime.waiters`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phalanx.apps.replica import Replica
from phalanx.consensus.core import Input, ReadState, Ready, Receive, Submit, Tick
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net.client_protocol import ClientCall, ReadConsistency, ReplyStatus
from phalanx.runtime.driver_stats import DriverStatistics
from phalanx.runtime.phase_trace import PhaseTrace
from phalanx.runtime.waiters import ClientWaiters, ReplyTarget

PROPOSAL_MAX_REQUESTS = 256
PROPOSAL_MAX_BYTES = 256 * 1024
"""A batch of client writes is proposed (one log entry) once it holds this many requests or
command bytes, even mid-pass: entries, and so AppendEntries frames, stay well under the
transport's frame limit however large the drained backlog is."""

MAX_PENDING_CALLS = 2048
"""Client calls a leader holds unanswered before it refuses new writes with RETRY (its own id
as the leader hint: "I lead, come back later"). Backpressure: past this, a longer queue only
adds latency (clients would wait past their deadlines for writes that then still apply).
Closed-loop clients never reach it while each holds one call in flight; a flood does."""


@dataclass(frozen=True, slots=True)
class CallInput:
    """A client call read from a connection (`Driver.call`)."""

    call: ClientCall
    target: ReplyTarget


@dataclass(frozen=True, slots=True)
class CallsInput:
    """The calls of one read from a connection (`Driver.calls`)."""

    calls: Sequence[ClientCall]
    target: ReplyTarget


@dataclass(frozen=True, slots=True)
class StatusInput:
    """A status request (`Driver.request_status`)."""

    nonce: int
    target: ReplyTarget


@dataclass(frozen=True, slots=True)
class DisconnectInput:
    """A connection closed: its waiters go (`Driver.disconnected`)."""

    target: ReplyTarget


class CallAdmission:
    """Client-call admission for `Driver`, which provides the state declared here."""

    node_id: NodeId
    replica: Replica
    stats: DriverStatistics
    _trace: PhaseTrace | None
    _inflight_snapshot: bool
    _was_leader: bool
    _leader: NodeId | None
    _max_pending_calls: int
    _waiters: ClientWaiters
    _propose_batch: Callable[[tuple[ClientRequest, ...]], Ready] | None
    _proposals: list[ClientRequest]
    _storage_error: str | None
    _proposal_bytes: int
    _reads: list[ReadState]
    _step: Callable[[Input], None]
    _queue: Callable[[Ready], None]
    _ticks: int
    _storage_tick: Callable[[], None]

    def _while_unavailable(self, item: object) -> None:
        """An input while storage is unavailable: the core is not stepped."""
        match item:
            case CallInput(call=call, target=target):
                self._refuse_unavailable(call, target)
            case CallsInput(calls=calls, target=target):
                for one in calls:
                    self._refuse_unavailable(one, target)
            case DisconnectInput(target=target):
                self._waiters.forget(target)
            case Tick():
                self._ticks += 1
                self._storage_tick()
            case Receive():
                self.stats.dropped_peer_messages += 1

    def _on_call(self, call: ClientCall, target: ReplyTarget) -> None:
        request = call.request
        reply = self._waiters.reply
        if self._trace is not None:
            self._trace.mark("call", f"{request.client_id}/{request.request_no}")
        stale = request.read_only and call.consistency is ReadConsistency.STALE
        refusal = self.replica.admit(request.client_id, request.command, request.read_only,
                                     local=stale)
        if refusal is not None:
            self.stats.refused_calls += 1
            reply(target, request, ReplyStatus.ERROR, message=refusal)
            return
        if stale:
            if self._inflight_snapshot:
                reply(target, request, ReplyStatus.RETRY, message="installing a snapshot")
            else:
                result = self.replica.query(request.command)
                reply(target, request, ReplyStatus.OK, result=result)
            return
        if not request.read_only and not self._inflight_snapshot:
            done = self.replica.applied_result(request.command)
            if done is not None:
                # Transaction mode (leaderless): a retry of a transaction applied here. The
                # core drops it as a duplicate submit, so nothing else would answer it (a
                # node that learned it from its peers never had a waiter for it).
                self.stats.session_replies += 1
                reply(target, request, ReplyStatus.OK, result=done)
                return
            session = self.replica.session(request.client_id)
            if session is not None and request.request_no <= session.request_no:
                # A retry of a write already applied here: answer from the session table (a
                # PBFT core never orders an executed request again, so nothing else would).
                self.stats.session_replies += 1
                if request.request_no == session.request_no:
                    reply(target, request, ReplyStatus.OK, result=session.result)
                else:
                    reply(target, request, ReplyStatus.ERROR, message="expired: a newer "
                          "request of this client was already applied")
                return
        key = (request.client_id, request.request_no)
        waiting = self._waiters.get(key)
        if (not waiting and not request.read_only and self._was_leader
                and len(self._waiters) >= self._max_pending_calls):
            self.stats.overloaded_calls += 1
            reply(target, request, ReplyStatus.RETRY, leader_hint=self.node_id,
                  message=f"overloaded: {len(self._waiters)} calls pending")
            return
        self._waiters.add(key, target)
        if waiting and not request.read_only and self._was_leader:
            # A retry of a write this leader already proposed and has not answered: it will
            # commit or this node will lose leadership (which answers every waiter), so the
            # retry just waits with it instead of adding a duplicate to the log. (Clients
            # retry after a lost connection or a silent node; duplicates would snowball.)
            self.stats.duplicate_calls += 1
            return
        if self._propose_batch is not None and not request.read_only:
            self._proposals.append(request)  # stepped together at the end of this pass
            self._proposal_bytes += len(request.command)
            if (len(self._proposals) >= PROPOSAL_MAX_REQUESTS
                    or self._proposal_bytes >= PROPOSAL_MAX_BYTES):
                self._propose()
        else:
            self._step(Submit(request=request))

    def _refuse_unavailable(self, call: ClientCall, target: ReplyTarget) -> None:
        """While storage is unavailable (`phalanx.runtime.driver_persist`): a STALE read is served
        as always; anything else is answered UNAVAILABLE with the reason."""
        request = call.request
        if request.read_only and call.consistency is ReadConsistency.STALE:
            self._on_call(call, target)
        else:
            self._waiters.reply(target, request, ReplyStatus.UNAVAILABLE,
                                message=self._storage_error or "storage unavailable")

    def _propose(self) -> None:
        """Step the writes batched so far as one proposal (one log entry)."""
        propose_batch = self._propose_batch
        if propose_batch is None:  # our own misuse: writes are only batched when it is set
            raise RuntimeError("_propose without propose_batch")
        requests, self._proposals = tuple(self._proposals), []
        self._proposal_bytes = 0
        self.stats.proposal_batches += 1
        self._queue(propose_batch(requests))

    def _serve_reads(self) -> None:
        """Answer the reads whose index is applied; keep the rest."""
        applied = self.replica.applied_index
        waiting: list[ReadState] = []
        for read in self._reads:
            if read.index <= applied:
                request = read.request
                self._waiters.answer(request.client_id, request.request_no, ReplyStatus.OK,
                                     result=self.replica.query(request.command))
            else:
                waiting.append(read)
        self._reads = waiting

    def _fail_waiters(self, reason: str) -> None:
        """Answer RETRY to every waiter: this node stopped being leader. Their requests may
        still commit (under the next leader); the client retries with the same ids and the
        session table answers a duplicate from its cache."""
        self._waiters.fail_all(ReplyStatus.RETRY, leader_hint=self._leader, message=reason)
        self._reads.clear()

    def waiter_count(self) -> int:
        return len(self._waiters)

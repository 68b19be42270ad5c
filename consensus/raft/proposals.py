"""Client proposals and ReadIndex reads for the Raft core (§6.4).

Owns: turning `Submit` / `ProposeBatch` into COMMAND entries at the leader (or refusing them
with a `Rejection`), and ReadIndex rounds: a read waits for a round of heartbeats that a
quorum acknowledged after the leader committed an entry of its term, then is released at
the commit index it recorded (`readonly.py` keeps the rounds).

Rules:
- A base class of `RaftCore` (core.py) on top of `Membership`, split out to keep files
  cohesive. It must not import core.py. It never changes `role` or `term`.
- Each write `Submit` becomes one entry at once; `ProposeBatch` makes one entry of all its
  writes; reads never enter the log.
- A leader's heartbeats go out early (`RaftCore._send`, §10.2.1): they depend on nothing
  that is not durable.
"""

from __future__ import annotations

from phalanx.consensus._fastpath import new_send
from phalanx.consensus.core import ReadState, Rejection
from phalanx.consensus.raft.election import Role
from phalanx.consensus.raft.membership import Membership
from phalanx.consensus.raft.messages import new_heartbeat
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId


class Proposals(Membership):
    """Proposal and read half of `RaftCore` (state is initialised by the core)."""

    _reads: list[ReadState]
    _rejected: list[Rejection]
    _read_ctx: int

    def _submit(self, request: ClientRequest) -> None:
        if self.role is not Role.LEADER:
            self._rejected.append(Rejection(request=request, reason="not leader",
                                            leader_hint=self.leader))
            return
        if request.read_only:
            self.readonly.add(request)
            if not self.readonly.rounds:
                self._start_read_round()
            return
        if self.lead_transferee is not None:
            self._rejected.append(Rejection(request=request,
                                            reason="leadership transfer in progress",
                                            leader_hint=self.lead_transferee))
            return
        self._append_local([Entry(index=self.log.last_index() + 1, term=self.term,
                                  kind=EntryKind.COMMAND, requests=(request,))])
        self._broadcast_append(allow_empty=False)

    def _propose_batch(self, requests: tuple[ClientRequest, ...]) -> None:
        writes: list[ClientRequest] = []
        for request in requests:
            if request.read_only or self.role is not Role.LEADER or (
                    self.lead_transferee is not None):
                self._submit(request)  # a read, or refused exactly as a lone Submit
            else:
                writes.append(request)
        if writes:
            self._append_local([Entry(index=self.log.last_index() + 1, term=self.term,
                                      kind=EntryKind.COMMAND, requests=tuple(writes))])
            self._broadcast_append(allow_empty=False)

    def _start_read_round(self) -> None:
        # Ref: §6.4 step 1: only once the leader committed an entry of its own term.
        if self.log.term_at(self.commit) != self.term:
            return
        self._read_ctx += 1
        rnd = self.readonly.start_round(index=self.commit, context=self._read_ctx)
        if rnd is None:
            return
        self._ack_read(self._read_ctx, self.id)
        if self.readonly.rounds:
            self._broadcast_heartbeat(context=self._read_ctx)

    def _ack_read(self, context: int, node: NodeId) -> None:
        joint = self.joint
        released = self.readonly.ack(context, node, joint.has_quorum)
        for request, index in released:
            self._reads.append(ReadState(request=request, index=index))
        if released and self.readonly.queued and not self.readonly.rounds:
            self._start_read_round()  # reads that arrived during the last round

    def _broadcast_heartbeat(self, context: int = 0) -> None:
        if context == 0 and self.readonly.queued and not self.readonly.rounds:
            self._start_read_round()
            if self.readonly.rounds:
                return  # that round's heartbeat went out
        if context == 0 and self.readonly.rounds:
            context = self.readonly.rounds[-1].context  # re-confirm the newest round
        early = self._early  # a leader's heartbeats go out early (`_send`, §10.2.1)
        for p, pr in self.prs.items():
            early.append(new_send(p, new_heartbeat(
                self.term, self.id, min(pr.match, self.commit), context)))

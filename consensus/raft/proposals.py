"""Client proposals and ReadIndex reads for the Raft core (§6.4).

Owns: `Proposals`: turning `Submit` / `ProposeBatch` into COMMAND entries at the leader (or
refusing them with a `Rejection`), and ReadIndex rounds: a read waits for a round of
heartbeats that a quorum acknowledged after the leader committed an entry of its term, then
is released at the commit index it recorded (`readonly`, a `ReadOnly`, keeps the rounds).
Also the step's released reads (`reads`) and rejections (`rejected`), which the core hands
over in its Ready and resets.

Invariants:
- It never changes `role`, `term` or `vote`.
- Each write `Submit` becomes one entry at once; `ProposeBatch` makes one entry of all its
  writes; reads never enter the log.
- A read is released only at an index committed in the leader's current term, after a
  quorum acknowledged a heartbeat sent after it arrived; on losing leadership every
  pending read is rejected (`step_down`).
- A leader's heartbeats go out early (`RaftState.send`, §10.2.1): they depend on nothing
  that is not durable.
"""

from __future__ import annotations

from phalanx.consensus._fastpath import new_send
from phalanx.consensus.core import ReadState, Rejection
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import new_heartbeat
from phalanx.consensus.raft.readonly import ReadOnly
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId


class Proposals:
    """Client writes into the log, ReadIndex reads out of it."""

    __slots__ = ("_ls", "_read_ctx", "_repl", "_st", "readonly", "reads", "rejected")

    def __init__(self, st: RaftState, ls: LogState, repl: Replication) -> None:
        self._st = st
        self._ls = ls
        self._repl = repl
        self.readonly = ReadOnly()
        self._read_ctx = 0
        self.reads: list[ReadState] = []
        self.rejected: list[Rejection] = []

    def take_office(self) -> None:
        """A new leader starts with no read rounds."""
        self.readonly = ReadOnly()

    def step_down(self, leader: NodeId | None) -> None:
        """A leader steps down: every pending read is refused, pointing at `leader`."""
        for r in self.readonly.drain():
            self.rejected.append(Rejection(request=r, reason="leadership lost",
                                           leader_hint=leader))

    def submit(self, request: ClientRequest) -> None:
        st = self._st
        if st.role is not Role.LEADER:
            self.rejected.append(Rejection(request=request, reason="not leader",
                                           leader_hint=st.leader))
            return
        if request.read_only:
            self.readonly.add(request)
            if not self.readonly.rounds:
                self.start_read_round()
            return
        if st.lead_transferee is not None:
            self.rejected.append(Rejection(request=request,
                                           reason="leadership transfer in progress",
                                           leader_hint=st.lead_transferee))
            return
        self._append_command((request,))

    def propose_batch(self, requests: tuple[ClientRequest, ...]) -> None:
        st = self._st
        writes: list[ClientRequest] = []
        for request in requests:
            if request.read_only or st.role is not Role.LEADER or (
                    st.lead_transferee is not None):
                self.submit(request)  # a read, or refused exactly as a lone Submit
            else:
                writes.append(request)
        if writes:
            self._append_command(tuple(writes))

    def _append_command(self, requests: tuple[ClientRequest, ...]) -> None:
        """Leader: append one COMMAND entry (block-stamped when `block_stamps`) and send it."""
        st = self._st
        log = self._ls.log
        index = log.last_index() + 1
        if st.cfg.block_stamps:
            floor = 0  # the newest command entry's stamp (NOOP and CONFIG carry none)
            for e in reversed(log.entries):
                if e.kind is EntryKind.COMMAND:
                    floor = e.timestamp
                    break
            entry = Entry(index=index, term=st.term, kind=EntryKind.COMMAND, requests=requests,
                          timestamp=max(st.now_ms, floor), proposer=st.id)
        else:
            entry = Entry(index=index, term=st.term, kind=EntryKind.COMMAND, requests=requests)
        self._ls.append([entry])
        self._repl.broadcast_append(allow_empty=False)

    def start_read_round(self) -> None:
        """Leader: start a ReadIndex round for the queued reads."""
        ls = self._ls
        # Ref: §6.4 step 1: only once the leader committed an entry of its own term.
        if ls.log.term_at(ls.commit) != self._st.term:
            return
        self._read_ctx += 1
        rnd = self.readonly.start_round(index=ls.commit, context=self._read_ctx)
        if rnd is None:
            return
        self.ack_read(self._read_ctx, self._st.id)
        if self.readonly.rounds:
            self.broadcast_heartbeat(context=self._read_ctx)

    def ack_read(self, context: int, node: NodeId) -> None:
        """Leader: `node` acknowledged the ReadIndex round `context`."""
        readonly = self.readonly
        released = readonly.ack(context, node, self._ls.joint.has_quorum)
        for request, index in released:
            self.reads.append(ReadState(request=request, index=index))
        if released and readonly.queued and not readonly.rounds:
            self.start_read_round()  # reads that arrived during the last round

    def broadcast_heartbeat(self, context: int = 0) -> None:
        """Leader: send every follower a heartbeat (confirming read round `context`, or the
        newest round in progress)."""
        readonly = self.readonly
        if context == 0 and readonly.queued and not readonly.rounds:
            self.start_read_round()
            if readonly.rounds:
                return  # that round's heartbeat went out
        if context == 0 and readonly.rounds:
            context = readonly.rounds[-1].context  # re-confirm the newest round
        st = self._st
        term, me, commit = st.term, st.id, self._ls.commit
        early = st.early  # a leader's heartbeats go out early (`RaftState.send`, §10.2.1)
        for p, pr in self._repl.prs.items():
            early.append(new_send(p, new_heartbeat(term, me, min(pr.match, commit), context)))

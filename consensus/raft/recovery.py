"""Recovery mode for the Raft core: a node that lost durable state it once had (amnesia: an
empty data directory of a known member, a missing hard state, a log cut short by repair)
rejoins without voting until it is safe to (Protocol-Aware Recovery, FAST'18).

Owns: the two phases of `RaftRestoredState.recovering`. First the node learns the newest
term from a majority of the other voters (`TermQuery`, `_query_terms`, `_learn_term`) and
follows no leader meanwhile; then it catches up from a leader of that term and leaves
recovery once it holds, durably and matching, a committed entry of the leader's own term
(`_maybe_recovered`). Votes, pre-votes and campaigns are refused throughout
(`Election._handle_request_vote`, `Election._promotable`).

Rules:
- A base class of `RaftCore` (core.py) on top of `Proposals`, split out to keep files
  cohesive. It must not import core.py. `RaftCore.step` calls `_maybe_recovered` after each
  input while `recovering`; ticks call `_query_terms` while the first phase lasts.
- Deterministic: answers are counted per voter, never by arrival order or set iteration.
"""

from __future__ import annotations

from phalanx.consensus.raft.election import Role
from phalanx.consensus.raft.messages import TermQuery
from phalanx.consensus.raft.proposals import Proposals
from phalanx.consensus.types import NodeId


class Recovery(Proposals):
    """Recovery half of `RaftCore` (state is initialised by the core)."""

    _term_answers: dict[NodeId, int] | None
    _query_elapsed: int

    def _query_terms(self) -> None:
        """Recovery, first phase: ask every voter that has not answered yet for its term,
        once per heartbeat interval."""
        self._query_elapsed += 1
        if self._query_elapsed < self.cfg.heartbeat_ticks:
            return
        self._query_elapsed = 0
        answered = self._term_answers or {}
        for v in self.joint.voters():
            if v != self.id and v not in answered:
                self._send(v, TermQuery(term=self.term))

    def _learn_term(self, src: NodeId, term: int) -> None:
        """A `TermQueryResponse`. Once a majority of the voters other than us answered, any
        term in which our acknowledgement helped commit an entry is among the answers (that
        entry's quorum, less us, meets every such majority): adopt the highest, so a deposed
        leader of an older term can no longer use our acknowledgements, and move on to
        catching up (`_maybe_recovered`)."""
        answers = self._term_answers
        voters = self.config.voters
        if answers is None or src not in voters:
            self._drop("unexpected_message")
            return
        answers[src] = max(term, answers.get(src, 0))
        if len(answers) < len(voters) // 2 + 1:
            return
        self._term_answers = None
        top = max(answers.values())
        if top > self.term:
            self._become_follower(top, None)

    def _maybe_recovered(self) -> None:
        """Leave recovery once this follower holds, durably and matching its leader's log,
        an entry of the leader's own term that the leader reports committed: every entry
        committed in an earlier term precedes it in the leader's log (Leader Completeness;
        the leader was elected without our vote, which we withheld), so whatever we may
        have acknowledged before losing our state is back. The leader becomes our vote for
        this term: we may have voted in it before and must not vote again."""
        if (self._term_answers is not None or self.role is not Role.FOLLOWER
                or self.leader is None or self.durable < self.commit or self.commit == 0
                or self.log.term_at(self.commit) != self.term):
            return
        self.recovering = False
        if self.vote is None:
            self.vote = self.leader

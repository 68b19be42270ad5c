"""Recovery mode for the Raft core: a node that lost durable state it once had (amnesia: an
empty data directory of a known member, a missing hard state, a log cut short by repair)
rejoins without voting until it is safe to (Protocol-Aware Recovery, FAST'18).

Owns: `Recovery`: the two phases of `RaftRestoredState.recovering`. First the node learns
the newest term from a majority of the other voters (`TermQuery`, `query_terms`,
`learn_term`) and follows no leader meanwhile (`term_answers`); then it catches up from a
leader of that term and leaves recovery once it holds, durably and matching, a committed
entry of the leader's own term (`maybe_recovered`). Votes, pre-votes and campaigns are
refused throughout (`Election` reads `recovering`).

Invariants:
- `recovering` only goes from True to False; `term_answers` is not None only in the first
  phase (and only while `recovering`).
- The core calls `maybe_recovered` after each input while `recovering`, and `query_terms`
  on each tick while the first phase lasts; the one transition it needs (stepping down to
  a newer term) is the `become_follower` hook the core passes in.
- Deterministic: answers are counted per voter, never by arrival order or set iteration.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import TermQuery
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.types import NodeId


class Recovery:
    """Recovery after a lost disk: learn the term, catch up, then vote again."""

    __slots__ = ("_become_follower", "_ls", "_query_elapsed", "_st", "_target", "recovering",
                 "term_answers")

    def __init__(self, st: RaftState, ls: LogState, *, recovering: bool,
                 become_follower: Callable[[int, NodeId | None], None]) -> None:
        self._st = st
        self._ls = ls
        self._become_follower = become_follower
        self.recovering = recovering
        """Amnesia (`RaftRestoredState.recovering`): no votes, no campaigns until
        `maybe_recovered` finds the log caught up."""
        self.term_answers: dict[NodeId, int] | None = {} if recovering else None
        """Recovery, first phase (not None): the terms other voters answered to our
        `TermQuery`. Until a majority of the voters other than us answered, we follow no
        leader: we forgot our term, so a deposed leader of an older term would look current
        (`learn_term`)."""
        self._query_elapsed = 0
        self._target = -1
        """The highest commit index our leader reported (AppendEntries, Heartbeat) while we
        recover, not bounded by our log as our own commit index is; -1 until the first one:
        an InstallSnapshot alone tells us no commit index."""

    def note_leader_commit(self, commit: int) -> None:
        """An AppendEntries or a Heartbeat from our leader while we recover: remember the
        commit index it carries (a heartbeat's is min(the match the leader holds for us, its
        commit): it covers every entry committed with an acknowledgement of ours)."""
        if commit > self._target:
            self._target = commit

    def query_terms(self) -> None:
        """Recovery, first phase: ask every voter that has not answered yet for its term,
        once per heartbeat interval."""
        st = self._st
        self._query_elapsed += 1
        if self._query_elapsed < st.cfg.heartbeat_ticks:
            return
        self._query_elapsed = 0
        answered = self.term_answers or {}
        for v in self._ls.joint.voters():
            if v != st.id and v not in answered:
                st.send(v, TermQuery(term=st.term))

    def learn_term(self, src: NodeId, term: int) -> None:
        """A `TermQueryResponse`. Once a majority of the voters other than us answered, any
        term in which our acknowledgement helped commit an entry is among the answers (that
        entry's quorum, less us, meets every such majority): adopt the highest, so a deposed
        leader of an older term can no longer use our acknowledgements, and move on to
        catching up (`maybe_recovered`)."""
        answers = self.term_answers
        voters = self._ls.config.voters
        if answers is None or src not in voters:
            self._st.drop("unexpected_message")
            return
        answers[src] = max(term, answers.get(src, 0))
        if len(answers) < len(voters) // 2 + 1:
            return
        self.term_answers = None
        top = max(answers.values())
        if top > self._st.term:
            self._become_follower(top, None)

    def maybe_recovered(self) -> None:
        """Leave recovery once this follower holds, durably and matching its leader's log,
        an entry of the leader's own term that the leader reports committed, at or past the
        highest commit index the leader reported to us (`note_leader_commit`: our own commit
        index is bounded by our log, so an entry of the leader's term early in a long catch-up
        would do, while entries we acknowledged before losing our state lie beyond it:
        found by the simulator, raft n=5 seed 29 with kill and lose-disk): every entry
        committed in an earlier term precedes it in the leader's log (Leader Completeness;
        the leader was elected without our vote, which we withheld), so whatever we may
        have acknowledged before losing our state is back. The leader becomes our vote for
        this term: we may have voted in it before and must not vote again."""
        st = self._st
        ls = self._ls
        if (self.term_answers is not None or st.role is not Role.FOLLOWER
                or st.leader is None or ls.durable < ls.commit or ls.commit == 0
                or self._target < 0 or ls.commit < self._target
                or ls.log.term_at(ls.commit) != st.term):
            return
        self.recovering = False
        if st.vote is None:
            st.vote = st.leader

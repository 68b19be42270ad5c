"""Elections for the Raft core: timers, pre-vote (§9.6), candidacy, voting (§3.4, §3.6.1) and
check-quorum (§6.2).

Owns: `Election`: the election and heartbeat timers (`tick`), the randomized election
timeout drawn from the injected `random.Random`, the votes of the current round (`votes`),
the pre-candidate and candidate transitions, RequestVote handling on the voter side and the
tally on the candidate side.

Invariants:
- Randomness is the injected `random.Random` only (the election timeout); no clocks.
- A candidate counts its own vote only once the Ready carrying it is `Persisted`
  (`self_vote_number`: the core numbers that Ready and counts the vote); pre-votes never
  change terms or votes.
- A node in recovery (`Recovery.recovering`) neither votes, pre-votes nor campaigns.
- What it needs from the rest of the node are hooks the core passes in: `become_follower`,
  `become_leader` (the core owns the transitions) and `broadcast_heartbeat`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from phalanx.consensus.quorum import VoteResult
from phalanx.consensus.raft.bugs import RaftBugs
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import RequestVote, RequestVoteResponse
from phalanx.consensus.raft.recovery import Recovery
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.types import LocalProtocolError, NodeId


class Election:
    """Timers, candidacy and voting of one node."""

    __slots__ = ("_bug_skip_vote_term", "_ls", "_recovery", "_repl", "_rng", "_st",
                 "become_follower", "become_leader", "broadcast_heartbeat",
                 "election_elapsed", "heartbeat_elapsed", "randomized_timeout",
                 "self_vote_number", "votes")

    def __init__(self, st: RaftState, ls: LogState, repl: Replication, recovery: Recovery,
                 *, rng: random.Random, bugs: RaftBugs,
                 become_follower: Callable[[int, NodeId | None], None],
                 become_leader: Callable[[], None],
                 broadcast_heartbeat: Callable[[], None]) -> None:
        self._st = st
        self._ls = ls
        self._repl = repl
        self._recovery = recovery
        self._rng = rng
        self._bug_skip_vote_term = bugs.skip_vote_term_check
        self.votes: dict[NodeId, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        self.self_vote_number = 0
        """Candidate: the Ready carrying our own vote (-1: the Ready being built)."""
        self.become_follower = become_follower
        """Step down to follower of a leader in a term (the core owns the transitions)."""
        self.become_leader = become_leader
        """Take office after winning an election."""
        self.broadcast_heartbeat = broadcast_heartbeat
        """Leader: send every follower a heartbeat (`Proposals`: it confirms reads)."""

    def reset_election_timeout(self) -> None:
        self.election_elapsed = 0
        e = self._st.cfg.election_ticks
        self.randomized_timeout = self._rng.randrange(e, 2 * e)

    def _become_pre_candidate(self) -> None:
        st = self._st
        st.role = Role.PRE_CANDIDATE
        st.leader = None
        self.votes = {st.id: True}
        self.reset_election_timeout()

    def _become_candidate(self) -> None:
        st = self._st
        if st.role is Role.LEADER:
            raise LocalProtocolError("a leader cannot become candidate")
        st.term += 1
        st.vote = st.id
        st.role = Role.CANDIDATE
        st.leader = None
        self.votes = {}
        self.self_vote_number = -1  # counted once the Ready carrying it is Persisted
        self.reset_election_timeout()

    def _promotable(self) -> bool:
        if self._recovery.recovering:
            return False  # amnesia: no candidacy until caught up (RaftRestoredState)
        config = self._ls.config
        me = self._st.id
        return me in config.voters or me in config.voters_outgoing

    # ------------------------------------------------------------------------ time

    def tick(self) -> None:
        st = self._st
        cfg = st.cfg
        match st.role:
            case Role.LEADER:
                self.heartbeat_elapsed += 1
                self.election_elapsed += 1
                if self.election_elapsed >= cfg.election_ticks:
                    self.election_elapsed = 0
                    st.lead_transferee = None  # Ref: §3.10: abort after an election timeout
                    if cfg.check_quorum and not self._repl.quorum_active():
                        self.become_follower(st.term, None)  # Ref: §6.2
                        return
                if self.heartbeat_elapsed >= cfg.heartbeat_ticks:
                    self.heartbeat_elapsed = 0
                    self.broadcast_heartbeat()
            case Role.FOLLOWER | Role.PRE_CANDIDATE | Role.CANDIDATE:
                self.election_elapsed += 1
                if self.election_elapsed >= self.randomized_timeout:
                    self.election_elapsed = 0
                    if self._promotable():
                        self.campaign(transfer=False)

    # ------------------------------------------------------------------------ elections

    def campaign(self, *, transfer: bool) -> None:
        st = self._st
        if not self._promotable() or st.role is Role.LEADER:
            return
        pre = st.cfg.pre_vote and not transfer
        if pre:
            self._become_pre_candidate()
        else:
            self._become_candidate()
        term = st.term + 1 if pre else st.term
        log = self._ls.log
        for v in self._ls.joint.voters():
            if v != st.id:
                st.send(v, RequestVote(
                    term=term, candidate_id=st.id, last_log_index=log.last_index(),
                    last_log_term=log.last_term(), pre_vote=pre,
                    leadership_transfer=transfer))
        self.tally()

    def tally(self) -> None:
        st = self._st
        result = self._ls.joint.vote_result(self.votes)
        if result is VoteResult.WON:
            if st.role is Role.PRE_CANDIDATE:
                self._campaign_after_pre_vote()
            elif st.role is Role.CANDIDATE:
                self.become_leader()
        elif result is VoteResult.LOST:
            self.become_follower(st.term, None)

    def _campaign_after_pre_vote(self) -> None:
        self._become_candidate()
        st = self._st
        log = self._ls.log
        for v in self._ls.joint.voters():
            if v != st.id:
                st.send(v, RequestVote(
                    term=st.term, candidate_id=st.id,
                    last_log_index=log.last_index(), last_log_term=log.last_term()))
        self.tally()

    def handle_request_vote(self, src: NodeId, m: RequestVote) -> None:
        # Ref: §3.6.1 (election restriction) and §9.6 (pre-vote: no state change).
        st = self._st
        if self._recovery.recovering:
            # Amnesia: we may have voted in this term before losing our state, and our log
            # may lack entries we acknowledged; neither vote nor pre-vote until caught up.
            st.drop("vote_while_recovering")
            st.send(src, RequestVoteResponse(term=st.term, vote_granted=False,
                                             pre_vote=m.pre_vote))
            return
        vote = st.vote
        if self._bug_skip_vote_term and not m.pre_vote and m.term == st.term:
            vote = None  # BUG (test-only): `>=` for "a newer term", forgetting this term's vote
        can_vote = (vote == src or (vote is None and st.leader is None)
                    or (m.pre_vote and m.term > st.term))
        if can_vote and self._ls.log.is_up_to_date(m.last_log_index, m.last_log_term):
            if m.pre_vote:
                st.send(src, RequestVoteResponse(term=m.term, vote_granted=True,
                                                 pre_vote=True))
                return
            st.vote = src
            self.reset_election_timeout()
            st.send(src, RequestVoteResponse(term=st.term, vote_granted=True))
            return
        st.send(src, RequestVoteResponse(term=st.term, vote_granted=False,
                                         pre_vote=m.pre_vote))

    def handle_vote_response(self, src: NodeId, m: RequestVoteResponse) -> None:
        st = self._st
        if m.pre_vote != (st.role is Role.PRE_CANDIDATE) or (
                m.pre_vote and m.vote_granted and m.term != st.term + 1):
            st.drop("stale_vote_response")  # from an earlier round
            return
        if src not in self.votes:
            self.votes[src] = m.vote_granted
        self.tally()

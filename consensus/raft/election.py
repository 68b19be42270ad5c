"""Elections for the Raft core: timers, pre-vote (§9.6), candidacy, voting (§3.4, §3.6.1) and
check-quorum (§6.2).

Owns: the election and heartbeat timers (`_tick`), the randomized election timeout, the
pre-candidate and candidate transitions, RequestVote handling on the voter side and the
vote tally on the candidate side.

Rules:
- A base class of `RaftCore` (core.py) on top of `Replication`, split out to keep files
  cohesive. It must not import core.py; the transitions it needs from the core
  (`_become_follower`, `_become_leader`) and the leader's heartbeat are abstract methods.
- `_become_*` are the only methods that change `role`.
- Randomness is the injected `random.Random` only (the election timeout); no clocks.
- A candidate counts its own vote only once the Ready carrying it is `Persisted`
  (`_self_vote_number`, handled by the core); pre-votes never change terms or votes.
"""

from __future__ import annotations

import abc
import enum
import random

from phalanx.consensus.quorum import VoteResult
from phalanx.consensus.raft.messages import RequestVote, RequestVoteResponse
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.types import LocalProtocolError, NodeId


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class Election(Replication):
    """Election half of `RaftCore` (state is declared here, initialised by the core)."""

    role: Role
    vote: NodeId | None
    votes: dict[NodeId, bool]
    leader: NodeId | None
    election_elapsed: int
    heartbeat_elapsed: int
    randomized_timeout: int
    _rng: random.Random
    _self_vote_number: int
    recovering: bool

    @abc.abstractmethod
    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        """Step down to follower of `leader` in `term` (the core owns the leader's state)."""

    @abc.abstractmethod
    def _become_leader(self) -> None:
        """Take office after winning an election."""

    @abc.abstractmethod
    def _broadcast_heartbeat(self, context: int = 0) -> None:
        """Leader: send a heartbeat to every peer."""

    def _reset_election_timeout(self) -> None:
        self.election_elapsed = 0
        e = self.cfg.election_ticks
        self.randomized_timeout = self._rng.randrange(e, 2 * e)

    def _become_pre_candidate(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader = None
        self.votes = {self.id: True}
        self._reset_election_timeout()

    def _become_candidate(self) -> None:
        if self.role is Role.LEADER:
            raise LocalProtocolError("a leader cannot become candidate")
        self.term += 1
        self.vote = self.id
        self.role = Role.CANDIDATE
        self.leader = None
        self.votes = {}
        self._self_vote_number = -1  # counted once the Ready carrying it is Persisted
        self._reset_election_timeout()

    def _promotable(self) -> bool:
        if self.recovering:
            return False  # amnesia: no candidacy until caught up (RaftRestoredState)
        return self.id in self.config.voters or self.id in self.config.voters_outgoing

    # ------------------------------------------------------------------------ time

    def _tick(self) -> None:
        match self.role:
            case Role.LEADER:
                self.heartbeat_elapsed += 1
                self.election_elapsed += 1
                if self.election_elapsed >= self.cfg.election_ticks:
                    self.election_elapsed = 0
                    self.lead_transferee = None  # Ref: §3.10: abort after an election timeout
                    if self.cfg.check_quorum and not self._quorum_active():
                        self._become_follower(self.term, None)  # Ref: §6.2
                        return
                if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
                    self.heartbeat_elapsed = 0
                    self._broadcast_heartbeat()
            case Role.FOLLOWER | Role.PRE_CANDIDATE | Role.CANDIDATE:
                self.election_elapsed += 1
                if self.election_elapsed >= self.randomized_timeout:
                    self.election_elapsed = 0
                    if self._promotable():
                        self._campaign(transfer=False)

    def _quorum_active(self) -> bool:
        active = [self.id]
        for p, pr in self.prs.items():
            if pr.recent_active:
                active.append(p)
            pr.recent_active = False
        return self.joint.has_quorum(active)

    # ------------------------------------------------------------------------ elections

    def _campaign(self, *, transfer: bool) -> None:
        if not self._promotable() or self.role is Role.LEADER:
            return
        pre = self.cfg.pre_vote and not transfer
        if pre:
            self._become_pre_candidate()
        else:
            self._become_candidate()
        term = self.term + 1 if pre else self.term
        for v in self.joint.voters():
            if v != self.id:
                self._send(v, RequestVote(
                    term=term, candidate_id=self.id, last_log_index=self.log.last_index(),
                    last_log_term=self.log.last_term(), pre_vote=pre,
                    leadership_transfer=transfer))
        self._tally()

    def _tally(self) -> None:
        result = self.joint.vote_result(self.votes)
        if result is VoteResult.WON:
            if self.role is Role.PRE_CANDIDATE:
                self._campaign_after_pre_vote()
            elif self.role is Role.CANDIDATE:
                self._become_leader()
        elif result is VoteResult.LOST:
            self._become_follower(self.term, None)

    def _campaign_after_pre_vote(self) -> None:
        self._become_candidate()
        for v in self.joint.voters():
            if v != self.id:
                self._send(v, RequestVote(
                    term=self.term, candidate_id=self.id,
                    last_log_index=self.log.last_index(), last_log_term=self.log.last_term()))
        self._tally()

    def _handle_request_vote(self, src: NodeId, m: RequestVote) -> None:
        # Ref: §3.6.1 (election restriction) and §9.6 (pre-vote: no state change).
        if self.recovering:
            # Amnesia: we may have voted in this term before losing our state, and our log
            # may lack entries we acknowledged; neither vote nor pre-vote until caught up.
            self._drop("vote_while_recovering")
            self._send(src, RequestVoteResponse(term=self.term, vote_granted=False,
                                                pre_vote=m.pre_vote))
            return
        vote = self.vote
        if "skip_vote_term_check" in self.cfg.bugs and not m.pre_vote and m.term == self.term:
            vote = None  # BUG (test-only): `>=` for "a newer term", forgetting this term's vote
        can_vote = (vote == src or (vote is None and self.leader is None)
                    or (m.pre_vote and m.term > self.term))
        if can_vote and self.log.is_up_to_date(m.last_log_index, m.last_log_term):
            if m.pre_vote:
                self._send(src, RequestVoteResponse(term=m.term, vote_granted=True,
                                                    pre_vote=True))
                return
            self.vote = src
            self._reset_election_timeout()
            self._send(src, RequestVoteResponse(term=self.term, vote_granted=True))
            return
        self._send(src, RequestVoteResponse(term=self.term, vote_granted=False,
                                            pre_vote=m.pre_vote))

    def _handle_vote_response(self, src: NodeId, m: RequestVoteResponse) -> None:
        if m.pre_vote != (self.role is Role.PRE_CANDIDATE) or (
                m.pre_vote and m.vote_granted and m.term != self.term + 1):
            self._drop("stale_vote_response")  # from an earlier round
            return
        if src not in self.votes:
            self.votes[src] = m.vote_granted
        self._tally()

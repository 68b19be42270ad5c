"""The Raft core: a sans-IO, deterministic Raft node (Ongaro's dissertation, 2014).

Owns: `RaftCore`, which composes the sub-machines and routes inputs to them: the shared
term/role/vote state and the step's messages (`state.py`, `RaftState`), the log and its
commit/applied/durable points (`logstate.py`, `LogState`), log replication, flow control
and the commit rule (`replication.py`), elections with pre-vote §9.6 and check-quorum §6.2
(`election.py`), joint-consensus membership changes §4.3 and leadership transfer §3.10
(`membership.py`), client proposals and ReadIndex reads §6.4 (`proposals.py`) and recovery
after a lost disk (`recovery.py`). The core itself owns the role transitions, the message
dispatch, and the building and numbering of each step's `Ready`.

Rules:
- Implements `phalanx.consensus.core.Core`. No I/O, clocks or global randomness: time is
  `Tick`, randomness the injected `random.Random` (election timeouts only).
- `_receive` handles terms once for every role (as etcd's `Step`), then dispatches on the
  role to `_step_leader` / `_step_follower` / `_step_candidate`; `_become_follower` and
  `_become_leader` here and `Election`'s candidacy are the only changes of `role`.
- Sub-machines never import core.py; the calls they make upwards (`become_follower`, ...)
  are hooks wired once in `__init__`.
- Deliberate test-only bugs arrive as one injected `RaftBugs` (`bugs.py`), never config.
- Persistence before dependence: term, vote and entries go out in `Ready` (persisted before
  its messages are sent), and the node never counts its *own* vote or entries towards a
  quorum before `Persisted` says they are durable (`Election.self_vote_number`,
  `LogState.durable`). The one exception is `Ready.early_messages`: a leader's
  AppendEntries and heartbeats (`RaftState.send`), which depend on nothing unpersisted
  (§10.2.1) and so overlap its disk write with the followers'.
- Peer input is never trusted: malformed messages (`validate.py`) and impossible ones
  (a match beyond our log, an unknown peer) are dropped and counted in `status().dropped`.
- Batching: each client `Submit` at the leader becomes one COMMAND entry at once (no added
  latency); `ProposeBatch` makes one COMMAND entry of all its writes (a driver's batch of
  requests that arrived together); AppendEntries carry up to `max_batch_entries` entries, so
  entries proposed while a follower's window is full go out together.
- Lease reads are not implemented: every read goes through ReadIndex, which needs no clock
  assumption.
"""

from __future__ import annotations

import random
from typing import TypeAlias

from phalanx.consensus._fastpath import make_ready, maker, new_send
from phalanx.consensus.core import (
    EMPTY_READY,
    CheckpointInstalled,
    CheckpointTaken,
    Input,
    Persisted,
    ReadState,
    Ready,
    Receive,
    Rejection,
    Send,
    Snapshot,
    Submit,
    Tick,
)
from phalanx.consensus.raft.bugs import NO_BUGS, RaftBugs
from phalanx.consensus.raft.config import (
    Campaign,
    ProposeBatch,
    ProposeConfChange,
    RaftConfig,
    RaftRestoredState,
    RaftStatus,
    TransferLeadership,
)
from phalanx.consensus.raft.election import Election
from phalanx.consensus.raft.log import RaftLog
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.membership import Membership
from phalanx.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    RequestVote,
    RequestVoteResponse,
    TermQuery,
    TermQueryResponse,
    TimeoutNow,
)
from phalanx.consensus.raft.messages import (
    new_heartbeat_response as _new_heartbeat_response,
)
from phalanx.consensus.raft.progress import Progress, ProgressState
from phalanx.consensus.raft.proposals import Proposals
from phalanx.consensus.raft.recovery import Recovery
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.raft.validate import drop_reason
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
)

RaftInput: TypeAlias = Input | Campaign | ProposeBatch | ProposeConfChange | TransferLeadership

_new_hard_state = maker(HardState)  # (term, vote, view, commit): `HardState(...)`, cheaper


_EARLY_KINDS = (AppendEntries, Heartbeat)
_LEADER_KINDS = (AppendEntries, Heartbeat, InstallSnapshot)
_LEADER, _FOLLOWER, _CANDIDATE = Role.LEADER, Role.FOLLOWER, Role.CANDIDATE


class RaftCore:
    """One Raft node. See the module docstring for the rules it keeps."""

    def __init__(
        self,
        config: RaftConfig,
        *,
        rng: random.Random,
        restored: RaftRestoredState | None,
        bugs: RaftBugs = NO_BUGS,
    ) -> None:
        self.cfg = config
        self.id = config.node_id
        hs = restored.hard_state if restored is not None else HardState()
        self.st = st = RaftState(config, term=hs.term, vote=hs.vote)
        self.ls = ls = LogState(config, restored)
        self.repl = repl = Replication(st, ls, bugs)
        ls.on_config = repl.config_changed
        self.recovery = recovery = Recovery(
            st, ls, recovering=(restored is not None and restored.recovering
                                and not bugs.ignore_recovering),
            become_follower=self._become_follower)
        self.proposals = proposals = Proposals(st, ls, repl)
        self.election = election = Election(
            st, ls, repl, recovery, rng=rng, bugs=bugs, become_follower=self._become_follower,
            become_leader=self._become_leader, broadcast_heartbeat=proposals.broadcast_heartbeat)
        self.membership = membership = Membership(st, ls, repl, election, proposals,
                                                  become_follower=self._become_follower)
        # Replication reports to the sub-machines built on it (hooks set once, here).
        repl.after_commit = membership.after_commit
        repl.ack_read = proposals.ack_read
        self._bug_forget_persist_vote = bugs.forget_persist_vote
        self._ready_no = 0
        self._last_hs = HardState(term=hs.term, vote=hs.vote, commit=hs.commit)
        election.reset_election_timeout()

    # ------------------------------------------------------------------------ views
    # Read-only views of the sub-machines' state, for drivers, the simulator and tests.

    @property
    def node_id(self) -> NodeId:
        return self.id

    @property
    def term(self) -> int:
        return self.st.term

    @property
    def vote(self) -> NodeId | None:
        return self.st.vote

    @property
    def role(self) -> Role:
        return self.st.role

    @property
    def leader(self) -> NodeId | None:
        return self.st.leader

    @property
    def log(self) -> RaftLog:
        return self.ls.log

    @property
    def commit(self) -> int:
        return self.ls.commit

    @property
    def applied(self) -> int:
        return self.ls.applied

    @property
    def durable(self) -> int:
        return self.ls.durable

    @property
    def snapshot(self) -> Snapshot | None:
        return self.ls.snapshot

    @property
    def config(self) -> Configuration:
        return self.ls.config

    @property
    def prs(self) -> dict[NodeId, Progress]:
        return self.repl.prs

    @property
    def recovering(self) -> bool:
        return self.recovery.recovering

    @property
    def election_elapsed(self) -> int:
        return self.election.election_elapsed

    @property
    def randomized_timeout(self) -> int:
        return self.election.randomized_timeout

    # ------------------------------------------------------------------------ Core API

    def step(self, inp: RaftInput, /) -> Ready:
        """Feed one input; return what the driver must do (see `Ready`).

        The output lists are empty on entry: the step hands them over in its Ready, and a
        step that raises clears what it had produced."""
        try:
            kind = type(inp)
            if kind is Receive:  # the common inputs first, as the `match` below would
                self._receive(inp.src, inp.message)  # type: ignore[union-attr]
            elif kind is Persisted:
                self._persisted(inp.number)  # type: ignore[union-attr]
            else:
                self._dispatch(inp)
            recovery = self.recovery
            if recovery.recovering:
                recovery.maybe_recovered()
            # The Ready of this step (inlined: one call less per step). It hands the output
            # lists over; the next step starts with fresh ones.
            st = self.st
            ls = self.ls
            proposals = self.proposals
            commit = ls.commit
            last = self._last_hs
            msgs = st.msgs
            early = st.early
            new_entries = ls.new_entries
            if not (msgs or early or new_entries) and commit == last.commit and (
                    st.term == last.term and st.vote == last.vote
                    and ls.truncate is None and ls.snap_out is None
                    and not proposals.reads and not proposals.rejected
                    and (ls.applied >= commit or ls.applied >= ls.durable)):
                # Nothing to persist, send, apply or answer (about half of all steps: a
                # follower's Persisted, a duplicate acknowledgement): what the full
                # computation below would find, with fewer lookups.
                return EMPTY_READY
            hi = ls.durable
            if commit < hi:
                hi = commit
            applied = ls.applied
            committed: tuple[Entry, ...] = ()
            if hi > applied:
                committed = ls.log.between(applied + 1, hi + 1)
                ls.applied = hi
            vote = st.vote
            term = st.term
            if self._bug_forget_persist_vote and vote != self.id:
                # BUG (test-only): a vote granted to another node is never written.
                vote = last.vote if last.term == term else None
            truncate = ls.truncate
            snap = ls.snap_out
            must_sync = bool(new_entries) or truncate is not None or snap is not None
            hs: HardState | None = None
            if last.term != term or last.vote != vote:
                must_sync = True
                hs = self._last_hs = _new_hard_state(term, vote, 0, commit)
            elif last.commit != commit:
                hs = self._last_hs = _new_hard_state(term, vote, 0, commit)
            reads = proposals.reads
            rejected = proposals.rejected
            if hs is not None or must_sync:
                number = self._ready_no = self._ready_no + 1
                if must_sync:
                    log = ls.log
                    ls.pending_durable.append((number, log.offset + len(log.entries)))
                election = self.election
                if election.self_vote_number == -1:
                    election.self_vote_number = number
            elif msgs or early or committed or reads or rejected:
                number = 0
            else:
                return EMPTY_READY
            # Hand over what was produced; keep the lists that stayed empty (most do).
            early_t: tuple[Send, ...] = ()
            if early:
                early_t = tuple(early)
                st.early = []
            msgs_t: tuple[Send, ...] = ()
            if msgs:
                msgs_t = tuple(msgs)
                st.msgs = []
            entries_t: tuple[Entry, ...] = ()
            if new_entries:
                entries_t = tuple(new_entries)
                ls.new_entries = []
            reads_t: tuple[ReadState, ...] = ()
            if reads:
                reads_t = tuple(reads)
                proposals.reads = []
            rejected_t: tuple[Rejection, ...] = ()
            if rejected:
                rejected_t = tuple(rejected)
                proposals.rejected = []
            if truncate is not None:
                ls.truncate = None
            if snap is not None:
                ls.snap_out = None
            return make_ready(number, early_t, snap, truncate, entries_t, hs, must_sync, msgs_t,
                              committed, reads_t, rejected_t)
        except BaseException:
            self._clear_out()
            raise

    def _dispatch(self, inp: RaftInput) -> None:
        match inp:
            case Receive(src=src, message=m):
                self._receive(src, m)
            case Tick(now_ms=now_ms):
                if now_ms is not None:
                    self.st.now_ms = now_ms
                self.election.tick()
                if self.recovery.term_answers is not None:
                    self.recovery.query_terms()
            case Persisted(number=n):
                self._persisted(n)
            case Submit(request=r):
                self.proposals.submit(r)
            case ProposeBatch(requests=requests):
                self.proposals.propose_batch(requests)
            case CheckpointTaken(index=index, data=data):
                # Older snapshots still being sent keep the entries after them (LogState).
                sending = [pr.snapshot_index for pr in self.repl.prs.values()
                           if pr.state is ProgressState.SNAPSHOT]
                self.ls.checkpoint_taken(self.cfg, index, data, sending)
            case CheckpointInstalled(meta=meta, data=data):
                self.ls.checkpoint_installed(meta, data)
            case Campaign():
                self.election.campaign(transfer=False)
            case ProposeConfChange(change=change):
                self.membership.propose_conf_change(change)
            case TransferLeadership(to=to):
                self.membership.transfer_leadership(to)
            case _:
                raise LocalProtocolError(f"not a Raft input: {inp!r}")

    def status(self) -> RaftStatus:
        st = self.st
        ls = self.ls
        return RaftStatus(
            node=self.id,
            role=st.role.value,
            term=st.term,
            commit_index=ls.commit,
            leader=st.leader,
            dropped=dict(sorted(st.dropped.items())),
            vote=st.vote,
            last_index=ls.log.last_index(),
            last_term=ls.log.last_term(),
            applied=ls.applied,
            durable_index=ls.durable,
            snapshot_index=ls.snapshot.meta.index if ls.snapshot else 0,
            config=ls.config,
            progress={p: pr.describe() for p, pr in self.repl.prs.items()},
            lead_transferee=st.lead_transferee,
            conf_change_error=self.membership.conf_change_error,
            recovering=self.recovery.recovering,
        )

    # ------------------------------------------------------------------------ output

    def _clear_out(self) -> None:
        """Drop what a failed step produced, keeping the lists that are already empty."""
        st = self.st
        ls = self.ls
        proposals = self.proposals
        if st.msgs:
            st.msgs = []
        if st.early:
            st.early = []
        if ls.new_entries:
            ls.new_entries = []
        ls.truncate = None
        ls.snap_out = None
        if proposals.reads:
            proposals.reads = []
        if proposals.rejected:
            proposals.rejected = []

    def _persisted(self, n: int) -> None:
        if n > self._ready_no or n < 0:
            raise LocalProtocolError(f"Persisted({n}) but the last Ready was {self._ready_no}")
        self.ls.persisted(n)
        role = self.st.role
        if role is _CANDIDATE:
            election = self.election
            if 0 < election.self_vote_number <= n:
                election.self_vote_number = 0
                election.votes[self.id] = True
                election.tally()
        elif role is _LEADER:
            repl = self.repl
            if repl.maybe_commit():
                repl.after_commit()

    # ------------------------------------------------------------------------ roles

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        st = self.st
        if st.role is Role.LEADER:
            self.proposals.step_down(leader)
            self.repl.prs = {}
        if term != st.term:
            st.term = term
            st.vote = None
        st.role = Role.FOLLOWER
        st.leader = leader
        st.lead_transferee = None
        election = self.election
        election.self_vote_number = 0
        election.reset_election_timeout()

    def _become_leader(self) -> None:
        st = self.st
        st.role = Role.LEADER
        st.leader = self.id
        st.lead_transferee = None
        self.proposals.take_office()
        election = self.election
        election.heartbeat_elapsed = 0
        election.election_elapsed = 0
        repl = self.repl
        repl.prs = {}
        repl.sync_progress()
        for p, pr in repl.prs.items():
            pr.recent_active = election.votes.get(p) is True  # its vote is recent contact
        # Ref: §3.6.2 / §6.4: a new leader commits a no-op to learn what is committed.
        ls = self.ls
        ls.append([Entry(index=ls.log.last_index() + 1, term=st.term, kind=EntryKind.NOOP)])
        repl.broadcast_append()

    # ------------------------------------------------------------------------ receive

    def _receive(self, src: NodeId, m: Message) -> None:
        st = self.st
        if src == self.id:
            st.drop("from_self")
            return
        reason = drop_reason(src, m)
        if reason is not None:
            st.drop(reason)
            return
        kind = type(m)
        if kind is TermQuery:  # answered whatever the terms: it changes nothing here
            config = self.ls.config
            if src in config.voters or src in config.voters_outgoing or src in config.learners:
                st.send(src, TermQueryResponse(term=st.term))
            else:
                st.drop("unknown_peer")  # only members may ask (a recovering one does)
            return
        if kind is TermQueryResponse:
            self.recovery.learn_term(src, m.term)  # type: ignore[attr-defined]
            return
        term: int = m.term  # type: ignore[attr-defined]  # drop_reason admitted only Raft ones
        if term > st.term:
            if isinstance(m, RequestVote):
                cfg = self.cfg
                in_lease = (cfg.check_quorum and st.leader is not None
                            and self.election.election_elapsed < cfg.election_ticks)
                if in_lease and not m.leadership_transfer:
                    st.drop("vote_in_lease")  # Ref: §4.2.3 disruptive servers
                    return
            if (isinstance(m, RequestVote) and m.pre_vote) or (
                    isinstance(m, RequestVoteResponse) and m.pre_vote and m.vote_granted):
                pass  # Ref: §9.6: pre-votes never change terms
            else:
                leader = src if isinstance(m, _LEADER_KINDS) else None
                self._become_follower(term, leader)
        elif term < st.term:
            if isinstance(m, _EARLY_KINDS) and (
                    self.cfg.check_quorum or self.cfg.pre_vote):
                # A stale leader learns our term and steps down (etcd; needed with pre-vote,
                # where a partitioned node never bumps others' terms).
                st.send(src, AppendEntriesResponse(term=st.term, success=False))
            elif isinstance(m, RequestVote) and m.pre_vote:
                st.send(src, RequestVoteResponse(term=st.term, vote_granted=False,
                                                 pre_vote=True))
            else:
                st.drop("stale_term")
            return

        if self.recovery.term_answers is not None and kind in _LEADER_KINDS:
            st.drop("leader_before_term_known")  # recovery: see `Recovery.term_answers`
            return
        role = st.role
        # The two most common messages first, exactly as `_step_leader` / `_step_follower`
        # handle them (anything else, or a subclass, takes the general path below).
        if role is _LEADER:
            if kind is AppendEntriesResponse:
                repl = self.repl
                pr = repl.prs.get(src)
                if pr is not None:
                    pr.recent_active = True
                    repl.handle_append_response(src, pr, m)  # type: ignore[arg-type]
                    return
        elif role is _FOLLOWER and kind is AppendEntries:
            self.election.election_elapsed = 0  # _accept_leader(src), inlined
            st.leader = src
            if self.recovery.recovering:
                self.recovery.note_leader_commit(m.leader_commit)  # type: ignore[attr-defined]
            self.repl.handle_append_entries(src, m)  # type: ignore[arg-type]
            return
        if isinstance(m, RequestVote):
            self.election.handle_request_vote(src, m)
            return
        if role is _LEADER:
            self._step_leader(src, m)
        elif role is _FOLLOWER:
            self._step_follower(src, m)
        else:  # CANDIDATE, PRE_CANDIDATE
            self._step_candidate(src, m)

    def _step_candidate(self, src: NodeId, m: Message) -> None:
        match m:
            case RequestVoteResponse():
                self.election.handle_vote_response(src, m)
            case AppendEntries() | Heartbeat() | InstallSnapshot():
                # Ref: §3.4: a candidate recognises a leader of its term.
                self._become_follower(self.st.term, src)
                self._step_follower(src, m)
            case _:
                self.st.drop("unexpected_message")

    def _step_follower(self, src: NodeId, m: Message) -> None:
        st = self.st
        match m:
            case AppendEntries():
                self.election.election_elapsed = 0  # _accept_leader(src), inlined
                st.leader = src
                if self.recovery.recovering:
                    self.recovery.note_leader_commit(m.leader_commit)
                self.repl.handle_append_entries(src, m)
            case Heartbeat():
                self.election.election_elapsed = 0
                st.leader = src
                if self.recovery.recovering:
                    # min(the match the leader holds for us, its commit): covers every entry
                    # committed with an acknowledgement of ours we may have forgotten
                    self.recovery.note_leader_commit(m.leader_commit)
                ls = self.ls
                log = ls.log
                last = log.offset + len(log.entries)
                commit = min(m.leader_commit, last)
                if commit > ls.commit:
                    ls.commit = commit
                # The leader believes we match at least its `leader_commit`: past our log
                # end, we lost acknowledged entries (see `HeartbeatResponse.lost_from`).
                lost_from = last + 1 if m.leader_commit > last else 0
                st.msgs.append(new_send(src, _new_heartbeat_response(st.term, m.context,
                                                                     lost_from)))
            case InstallSnapshot():
                self._accept_leader(src)
                self.repl.handle_install_snapshot(src, m)
            case TimeoutNow():
                if st.leader == src:
                    self.election.campaign(transfer=True)  # Ref: §3.10
                else:
                    st.drop("timeout_now_not_from_leader")
            case _:
                st.drop("unexpected_message")

    def _accept_leader(self, src: NodeId) -> None:
        self.election.election_elapsed = 0
        self.st.leader = src

    def _step_leader(self, src: NodeId, m: Message) -> None:
        repl = self.repl
        pr = repl.prs.get(src)
        if pr is None:
            self.st.drop("unknown_peer")
            return
        match m:
            case AppendEntriesResponse():
                pr.recent_active = True
                repl.handle_append_response(src, pr, m)
            case HeartbeatResponse():
                pr.recent_active = True
                repl.handle_heartbeat_response(src, pr, m)
            case InstallSnapshotResponse():
                pr.recent_active = True
                repl.handle_snapshot_response(src, pr, m)
            case AppendEntries() | Heartbeat() | InstallSnapshot():
                self.st.drop("second_leader_in_term")
            case RequestVoteResponse():
                self.st.drop("stale_vote_response")
            case _:
                self.st.drop("unexpected_message")

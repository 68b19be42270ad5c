"""The Raft core: a sans-IO, deterministic Raft node (Ongaro's dissertation, 2014).

Owns: roles and terms, elections (with pre-vote §9.6 and check-quorum §6.2), log
replication with per-follower flow control (`progress.py`), commitment (§3.6.2), snapshot
transfer in chunks (§5.3), joint-consensus membership changes (§4.3, `confchange.py`),
leadership transfer (§3.10) and ReadIndex reads (§6.4, `readonly.py`).

Rules:
- Implements `phalanx.consensus.core.Core`. No I/O, clocks or global randomness: time is
  `Tick`, randomness the injected `random.Random` (election timeouts only).
- `step` handles terms once for every role (as etcd's `Step`), then dispatches with
  `match self.role:`; `_become_*` are the only methods that change `role`.
- Split into base classes to keep files cohesive: `RaftCore(Recovery(Proposals(Membership(
  Election(Replication)))))`; recovery after a lost disk (amnesia) lives in `recovery.py`,
  client proposals and ReadIndex rounds in `proposals.py`,
  membership changes, leadership transfer and the leader's reaction to a commit in
  `membership.py`, timers, pre-vote, candidacy and voting in `election.py`, log replication
  and the commit rule in `replication.py`.
- Persistence before dependence: term, vote and entries go out in `Ready` (persisted before
  its messages are sent), and the node never counts its *own* vote or entries towards a
  quorum before `Persisted` says they are durable (`_self_vote_number`, `durable`). The one
  exception is `Ready.early_messages`: a leader's AppendEntries and heartbeats (`_send`),
  which depend on nothing unpersisted (§10.2.1) and so overlap its disk write with the
  followers'.
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
from collections import deque
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
    SnapshotData,
    Submit,
    Tick,
)
from phalanx.consensus.raft.config import (
    Campaign,
    ProposeBatch,
    ProposeConfChange,
    RaftConfig,
    RaftRestoredState,
    RaftStatus,
    TransferLeadership,
)
from phalanx.consensus.raft.election import Role
from phalanx.consensus.raft.log import RaftLog
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
from phalanx.consensus.raft.readonly import ReadOnly
from phalanx.consensus.raft.recovery import Recovery
from phalanx.consensus.raft.replication import SnapshotReassembly
from phalanx.consensus.raft.validate import drop_reason
from phalanx.consensus.types import (
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
    SnapshotMeta,
)

RaftInput: TypeAlias = Input | Campaign | ProposeBatch | ProposeConfChange | TransferLeadership

_new_hard_state = maker(HardState)  # (term, vote, view, commit): `HardState(...)`, cheaper


_UNBOUNDED = 1 << 62
_EARLY_KINDS = (AppendEntries, Heartbeat)
"""What a leader may send before its Ready is persisted (see `_send`)."""
_LEADER_KINDS = (AppendEntries, Heartbeat, InstallSnapshot)
_LEADER, _FOLLOWER, _CANDIDATE = Role.LEADER, Role.FOLLOWER, Role.CANDIDATE


class RaftCore(Recovery):
    """One Raft node. See the module docstring for the rules it keeps."""

    # A step's outputs are declared by the base classes (see `_reset_out`).

    def __init__(
        self,
        config: RaftConfig,
        *,
        rng: random.Random,
        restored: RaftRestoredState | None,
    ) -> None:
        self.cfg = config
        self.id = config.node_id
        self._rng = rng
        hs = restored.hard_state if restored is not None else HardState()
        snap = restored.snapshot if restored is not None else None
        if snap is not None:
            self.log = RaftLog(offset=snap.meta.index, offset_term=snap.meta.term,
                               base_config=snap.meta.config)
        else:
            self.log = RaftLog(offset=0, offset_term=0, base_config=config.bootstrap_config())
        if restored is not None:
            self.log.append([e for e in restored.entries if e.index > self.log.offset])
        self.snapshot: Snapshot | None = snap
        """The latest checkpoint this node can send in InstallSnapshot."""
        self.term = hs.term
        self.vote: NodeId | None = hs.vote
        self.commit = min(max(hs.commit, self.log.offset), self.log.last_index())
        # Invariant: log.offset <= applied <= commit <= last_index.
        self.applied = self.log.offset
        self.durable = self.log.last_index()
        """Invariant: entries 1..durable of the in-memory log are durable on disk."""
        self.config = self.log.latest_config()[1]
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        self.votes: dict[NodeId, bool] = {}
        self.prs: dict[NodeId, Progress] = {}
        self.readonly = ReadOnly()
        self.lead_transferee: NodeId | None = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        self.dropped: dict[str, int] = {}
        self.conf_change_error: str | None = None
        self._read_ctx = 0
        self._snap_recv: SnapshotReassembly | None = None
        """Follower: the prefix received so far of a snapshot being installed."""
        self._ready_no = 0
        self._pending_durable: deque[tuple[int, int]] = deque()
        """(Ready number, log last index after it) for Readys not yet `Persisted`."""
        self._self_vote_number = 0
        """Candidate: the Ready carrying our own vote (-1: the Ready being built)."""
        self._last_hs = HardState(term=hs.term, vote=hs.vote, commit=hs.commit)
        self._bug_forget_persist_vote = "forget_persist_vote" in config.bugs
        self.recovering = (restored is not None and restored.recovering
                           and "ignore_recovering" not in config.bugs)
        """Amnesia (`RaftRestoredState.recovering`): no votes, no campaigns until
        `_maybe_recovered` finds the log caught up."""
        self._term_answers: dict[NodeId, int] | None = {} if self.recovering else None
        """Recovery, first phase (not None): the terms other voters answered to our
        `TermQuery`. Until a majority of the voters other than us answered, we follow no
        leader: we forgot our term, so a deposed leader of an older term would look current
        (`_learn_term`)."""
        self._query_elapsed = 0
        self._reset_out()
        self._reset_election_timeout()

    # ------------------------------------------------------------------------ Core API

    @property
    def node_id(self) -> NodeId:
        return self.id

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
            if self.recovering:
                self._maybe_recovered()
            # The Ready of this step (inlined: one call less per step). It hands the output
            # lists over; the next step starts with fresh ones.
            commit = self.commit
            last = self._last_hs
            msgs = self._msgs
            early = self._early
            new_entries = self._new_entries
            if not (msgs or early or new_entries) and commit == last.commit and (
                    self.term == last.term and self.vote == last.vote
                    and self._truncate is None and self._snap_out is None
                    and not self._reads and not self._rejected
                    and (self.applied >= commit or self.applied >= self.durable)):
                # Nothing to persist, send, apply or answer (about half of all steps: a
                # follower's Persisted, a duplicate acknowledgement): what the full
                # computation below would find, with fewer lookups.
                return EMPTY_READY
            hi = self.durable
            if commit < hi:
                hi = commit
            applied = self.applied
            committed: tuple[Entry, ...] = ()
            if hi > applied:
                committed = self.log.between(applied + 1, hi + 1)
                self.applied = hi
            vote = self.vote
            term = self.term
            if self._bug_forget_persist_vote and vote != self.id:
                # BUG (test-only): a vote granted to another node is never written.
                vote = last.vote if last.term == term else None
            truncate = self._truncate
            snap = self._snap_out
            must_sync = bool(new_entries) or truncate is not None or snap is not None
            hs: HardState | None = None
            if last.term != term or last.vote != vote:
                must_sync = True
                hs = self._last_hs = _new_hard_state(term, vote, 0, commit)
            elif last.commit != commit:
                hs = self._last_hs = _new_hard_state(term, vote, 0, commit)
            reads = self._reads
            rejected = self._rejected
            if hs is not None or must_sync:
                number = self._ready_no = self._ready_no + 1
                if must_sync:
                    log = self.log
                    self._pending_durable.append((number, log.offset + len(log.entries)))
                if self._self_vote_number == -1:
                    self._self_vote_number = number
            elif msgs or early or committed or reads or rejected:
                number = 0
            else:
                return EMPTY_READY
            # Hand over what was produced; keep the lists that stayed empty (most do).
            early_t: tuple[Send, ...] = ()
            if early:
                early_t = tuple(early)
                self._early = []
            msgs_t: tuple[Send, ...] = ()
            if msgs:
                msgs_t = tuple(msgs)
                self._msgs = []
            entries_t: tuple[Entry, ...] = ()
            if new_entries:
                entries_t = tuple(new_entries)
                self._new_entries = []
            reads_t: tuple[ReadState, ...] = ()
            if reads:
                reads_t = tuple(reads)
                self._reads = []
            rejected_t: tuple[Rejection, ...] = ()
            if rejected:
                rejected_t = tuple(rejected)
                self._rejected = []
            if truncate is not None:
                self._truncate = None
            if snap is not None:
                self._snap_out = None
            return make_ready(number, early_t, snap, truncate, entries_t, hs, must_sync, msgs_t,
                              committed, reads_t, rejected_t)
        except BaseException:
            self._clear_out()
            raise

    def _dispatch(self, inp: RaftInput) -> None:
        match inp:
            case Receive(src=src, message=m):
                self._receive(src, m)
            case Tick():
                self._tick()
                if self._term_answers is not None:
                    self._query_terms()
            case Persisted(number=n):
                self._persisted(n)
            case Submit(request=r):
                self._submit(r)
            case ProposeBatch(requests=requests):
                self._propose_batch(requests)
            case CheckpointTaken(index=index, data=data):
                self._checkpoint_taken(index, data)
            case CheckpointInstalled(meta=meta, data=data):
                if meta.index <= self.applied and (
                        self.snapshot is None or meta.index > self.snapshot.meta.index):
                    self.snapshot = Snapshot(meta=meta, data=data)
            case Campaign():
                self._campaign(transfer=False)
            case ProposeConfChange(change=change):
                self._propose_conf_change(change)
            case TransferLeadership(to=to):
                self._transfer_leadership(to)
            case _:
                raise LocalProtocolError(f"not a Raft input: {inp!r}")

    def status(self) -> RaftStatus:
        return RaftStatus(
            node=self.id,
            role=self.role.value,
            term=self.term,
            commit_index=self.commit,
            leader=self.leader,
            dropped=dict(sorted(self.dropped.items())),
            vote=self.vote,
            last_index=self.log.last_index(),
            last_term=self.log.last_term(),
            applied=self.applied,
            durable_index=self.durable,
            snapshot_index=self.snapshot.meta.index if self.snapshot else 0,
            config=self.config,
            progress={p: pr.describe() for p, pr in self.prs.items()},
            lead_transferee=self.lead_transferee,
            conf_change_error=self.conf_change_error,
            recovering=self.recovering,
        )

    # ------------------------------------------------------------------------ output

    def _send(self, to: NodeId, message: Message) -> None:
        # Ref: §10.2.1: a leader's AppendEntries and heartbeats depend on nothing that is not
        # durable: its term was durable before its RequestVotes left (so before it could
        # win), and it counts its own entries only after `Persisted`. They go out early, in
        # parallel with the leader's own disk write. Everything else (votes, responses,
        # anything a follower or candidate says) waits for step 1 of its Ready.
        if self.role is _LEADER and isinstance(message, _EARLY_KINDS):
            self._early.append(new_send(to, message))
        else:
            self._msgs.append(new_send(to, message))

    def _reset_out(self) -> None:
        """Start the outputs of a step afresh (`step` copies the lists into its Ready)."""
        self._msgs = []
        self._early = []
        self._new_entries = []
        self._truncate = None
        self._snap_out = None
        self._reads = []
        self._rejected = []

    def _clear_out(self) -> None:
        """`_reset_out`, keeping the lists that are already empty (after a failed step)."""
        if self._msgs:
            self._msgs = []
        if self._early:
            self._early = []
        if self._new_entries:
            self._new_entries = []
        self._truncate = None
        self._snap_out = None
        if self._reads:
            self._reads = []
        if self._rejected:
            self._rejected = []

    def _persisted(self, n: int) -> None:
        if n > self._ready_no or n < 0:
            raise LocalProtocolError(f"Persisted({n}) but the last Ready was {self._ready_no}")
        pend = self._pending_durable
        durable = self.durable
        while pend and pend[0][0] <= n:
            index = pend.popleft()[1]
            if index > durable:
                durable = index
        # Invariant kept by `_truncate_log`: recorded indexes never exceed the current log.
        log = self.log
        last = log.offset + len(log.entries)
        self.durable = last if last < durable else durable
        role = self.role
        if role is _CANDIDATE and 0 < self._self_vote_number <= n:
            self._self_vote_number = 0
            self.votes[self.id] = True
            self._tally()
        elif role is _LEADER and self._maybe_commit():
            self._after_commit()

    # ------------------------------------------------------------------------ roles

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        if self.role is Role.LEADER:
            for r in self.readonly.drain():
                self._rejected.append(Rejection(request=r, reason="leadership lost",
                                                leader_hint=leader))
            self.prs = {}
        if term != self.term:
            self.term = term
            self.vote = None
        self.role = Role.FOLLOWER
        self.leader = leader
        self.lead_transferee = None
        self._self_vote_number = 0
        self._reset_election_timeout()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        self.lead_transferee = None
        self.readonly = ReadOnly()
        self.heartbeat_elapsed = 0
        self.election_elapsed = 0
        self.prs = {}
        self._sync_progress()
        for p, pr in self.prs.items():
            pr.recent_active = self.votes.get(p) is True  # its vote is recent contact
        # Ref: §3.6.2 / §6.4: a new leader commits a no-op to learn what is committed.
        self._append_local([Entry(index=self.log.last_index() + 1, term=self.term,
                                  kind=EntryKind.NOOP)])
        self._broadcast_append()

    # ------------------------------------------------------------------------ receive

    def _receive(self, src: NodeId, m: Message) -> None:
        if src == self.id:
            self._drop("from_self")
            return
        reason = drop_reason(src, m)
        if reason is not None:
            self._drop(reason)
            return
        kind = type(m)
        if kind is TermQuery:  # answered whatever the terms: it changes nothing here
            self._send(src, TermQueryResponse(term=self.term))
            return
        if kind is TermQueryResponse:
            self._learn_term(src, m.term)  # type: ignore[attr-defined]
            return
        term: int = m.term  # type: ignore[attr-defined]  # drop_reason admitted only Raft ones
        if term > self.term:
            if isinstance(m, RequestVote):
                in_lease = (self.cfg.check_quorum and self.leader is not None
                            and self.election_elapsed < self.cfg.election_ticks)
                if in_lease and not m.leadership_transfer:
                    self._drop("vote_in_lease")  # Ref: §4.2.3 disruptive servers
                    return
            if (isinstance(m, RequestVote) and m.pre_vote) or (
                    isinstance(m, RequestVoteResponse) and m.pre_vote and m.vote_granted):
                pass  # Ref: §9.6: pre-votes never change terms
            else:
                leader = src if isinstance(m, _LEADER_KINDS) else None
                self._become_follower(term, leader)
        elif term < self.term:
            if isinstance(m, _EARLY_KINDS) and (
                    self.cfg.check_quorum or self.cfg.pre_vote):
                # A stale leader learns our term and steps down (etcd; needed with pre-vote,
                # where a partitioned node never bumps others' terms).
                self._send(src, AppendEntriesResponse(term=self.term, success=False))
            elif isinstance(m, RequestVote) and m.pre_vote:
                self._send(src, RequestVoteResponse(term=self.term, vote_granted=False,
                                                    pre_vote=True))
            else:
                self._drop("stale_term")
            return

        if self._term_answers is not None and kind in _LEADER_KINDS:
            self._drop("leader_before_term_known")  # recovery: see `_term_answers`
            return
        role = self.role
        # The two most common messages first, exactly as `_step_leader` / `_step_follower`
        # handle them (anything else, or a subclass, takes the general path below).
        if role is _LEADER:
            if kind is AppendEntriesResponse:
                pr = self.prs.get(src)
                if pr is not None:
                    pr.recent_active = True
                    self._handle_append_response(src, pr, m)  # type: ignore[arg-type]
                    return
        elif role is _FOLLOWER and kind is AppendEntries:
            self.election_elapsed = 0  # _accept_leader(src), inlined
            self.leader = src
            self._handle_append_entries(src, m)  # type: ignore[arg-type]
            return
        if isinstance(m, RequestVote):
            self._handle_request_vote(src, m)
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
                self._handle_vote_response(src, m)
            case AppendEntries() | Heartbeat() | InstallSnapshot():
                # Ref: §3.4: a candidate recognises a leader of its term.
                self._become_follower(self.term, src)
                self._step_follower(src, m)
            case _:
                self._drop("unexpected_message")

    def _step_follower(self, src: NodeId, m: Message) -> None:
        match m:
            case AppendEntries():
                self.election_elapsed = 0  # _accept_leader(src), inlined on this hot path
                self.leader = src
                self._handle_append_entries(src, m)
            case Heartbeat():
                self.election_elapsed = 0
                self.leader = src
                log = self.log
                last = log.offset + len(log.entries)
                commit = min(m.leader_commit, last)
                if commit > self.commit:
                    self.commit = commit
                # The leader believes we match at least its `leader_commit`: past our log
                # end, we lost acknowledged entries (see `HeartbeatResponse.lost_from`).
                lost_from = last + 1 if m.leader_commit > last else 0
                self._msgs.append(new_send(src, _new_heartbeat_response(self.term, m.context,
                                                                        lost_from)))
            case InstallSnapshot():
                self._accept_leader(src)
                self._handle_install_snapshot(src, m)
            case TimeoutNow():
                if self.leader == src:
                    self._campaign(transfer=True)  # Ref: §3.10
                else:
                    self._drop("timeout_now_not_from_leader")
            case _:
                self._drop("unexpected_message")

    def _accept_leader(self, src: NodeId) -> None:
        self.election_elapsed = 0
        self.leader = src

    def _step_leader(self, src: NodeId, m: Message) -> None:
        pr = self.prs.get(src)
        if pr is None:
            self._drop("unknown_peer")
            return
        match m:
            case AppendEntriesResponse():
                pr.recent_active = True
                self._handle_append_response(src, pr, m)
            case HeartbeatResponse():
                pr.recent_active = True
                self._handle_heartbeat_response(src, pr, m)
            case InstallSnapshotResponse():
                pr.recent_active = True
                self._handle_snapshot_response(src, pr, m)
            case AppendEntries() | Heartbeat() | InstallSnapshot():
                self._drop("second_leader_in_term")
            case RequestVoteResponse():
                self._drop("stale_vote_response")
            case _:
                self._drop("unexpected_message")

    # ------------------------------------------------------------------------ snapshots

    def _checkpoint_taken(self, index: int, data: SnapshotData) -> None:
        if index > self.applied:
            raise LocalProtocolError(f"checkpoint at {index} beyond applied {self.applied}")
        if self.snapshot is not None and index <= self.snapshot.meta.index:
            return
        term = self.log.term_at(index)
        if term is None:
            raise LocalProtocolError(f"checkpoint at {index} is already compacted")
        meta = SnapshotMeta(index=index, term=term, config=self.log.config_at(index))
        self.snapshot = Snapshot(meta=meta, data=data)
        cfg = self.cfg
        log = self.log
        upto = log.tail_start(index, max_entries=cfg.log_tail_after_compaction,
                              max_bytes=cfg.log_tail_max_bytes)
        # A follower receiving an older snapshot keeps it (`Progress.snapshot`): keep the
        # entries after it too, within `snapshot_retain_log_bytes`, so it catches up from
        # there instead of needing this newer snapshot as well.
        sending = [pr.snapshot_index for pr in self.prs.values()
                   if pr.state is ProgressState.SNAPSHOT and pr.snapshot_index < upto]
        if sending and cfg.snapshot_retain_log_bytes:
            floor = log.tail_start(index, max_entries=index - log.offset,
                                   max_bytes=cfg.snapshot_retain_log_bytes)
            upto = max(min(sending), floor)
        log.compact(upto)

"""Unit tests of the Raft core, one per rule of the dissertation (tagged `# Ref: §x.y`).

Cores are driven by hand: inputs in, `Ready` out; `Persisted` is fed explicitly so the tests
can check what happens before and after durability.
"""

from __future__ import annotations

import random

import pytest
from raft_harness import Cluster

from phalanx.consensus.core import (
    CheckpointTaken,
    Persisted,
    Ready,
    Receive,
    Snapshot,
    Submit,
    Tick,
)
from phalanx.consensus.raft import (
    BUG_NAMES,
    AppendEntries,
    AppendEntriesResponse,
    Campaign,
    ConfChange,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    ProposeConfChange,
    RaftBugs,
    RaftConfig,
    RaftCore,
    RaftRestoredState,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from phalanx.consensus.raft.bugs import NO_BUGS
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
    SnapshotMeta,
)

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
VOTERS = (N1, N2, N3)


def core(nid: NodeId = N1, *, voters: tuple[NodeId, ...] = VOTERS,
         restored: RaftRestoredState | None = None, bugs: frozenset[str] = frozenset(),
         **kw: object) -> RaftCore:
    cfg = RaftConfig(node_id=nid, voters=voters, **kw)  # type: ignore[arg-type]
    return RaftCore(cfg, rng=random.Random(7), restored=restored,
                    bugs=RaftBugs.from_names(bugs))


def step(c: RaftCore, inp: object, *, persist: bool = True) -> Ready:
    rd = c.step(inp)  # type: ignore[arg-type]
    if persist and rd.number:
        c.step(Persisted(number=rd.number))
    return rd


def recv(c: RaftCore, src: NodeId, m: Message, *, persist: bool = True) -> Ready:
    return step(c, Receive(src=src, message=m), persist=persist)


def sent(rd: Ready, kind: type) -> list[tuple[NodeId, Message]]:
    return [(s.to, s.message) for s in (*rd.early_messages, *rd.messages)
            if isinstance(s.message, kind)]


def ent(index: int, term: int, cmd: str | None = None) -> Entry:
    if cmd is None:
        return Entry(index=index, term=term, kind=EntryKind.NOOP)
    r = ClientRequest(client_id="c", request_no=index, command=cmd.encode())
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=(r,))


def restored(term: int, entries: list[Entry], *, vote: NodeId | None = None,
             commit: int = 0) -> RaftRestoredState:
    return RaftRestoredState(hard_state=HardState(term=term, vote=vote, commit=commit),
                             entries=tuple(entries))


def make_leader(c: RaftCore) -> None:
    """Win an election without pre-vote, with votes from n2 and n3."""
    step(c, Campaign())
    for v in (N2, N3):
        if c.role.value != "leader":
            recv(c, v, RequestVoteResponse(term=c.term, vote_granted=True))
    assert c.role.value == "leader"


# ------------------------------------------------------------------------------ elections


def test_vote_once_per_term() -> None:
    # Ref: §3.4 Election Safety: at most one vote per term.
    c = core(N3)
    rd = recv(c, N1, RequestVote(term=1, candidate_id=N1, last_log_index=0, last_log_term=0))
    assert sent(rd, RequestVoteResponse)[0][1] == RequestVoteResponse(term=1, vote_granted=True)
    assert rd.hard_state is not None
    assert rd.hard_state.vote == N1
    assert rd.must_sync
    rd = recv(c, N2, RequestVote(term=1, candidate_id=N2, last_log_index=0, last_log_term=0))
    assert sent(rd, RequestVoteResponse)[0][1] == RequestVoteResponse(term=1, vote_granted=False)
    # A retry from the same candidate is granted again (idempotent).
    rd = recv(c, N1, RequestVote(term=1, candidate_id=N1, last_log_index=0, last_log_term=0))
    assert sent(rd, RequestVoteResponse)[0][1].vote_granted  # type: ignore[attr-defined]


@pytest.mark.parametrize(("last_index", "last_term", "granted"), [
    (2, 2, True), (5, 2, True), (1, 2, False), (9, 1, False), (1, 3, True)])
def test_vote_restriction(last_index: int, last_term: int, granted: bool) -> None:
    # Ref: §3.6.1: grant only to a candidate whose log is at least as up-to-date.
    c = core(N3, restored=restored(2, [ent(1, 1), ent(2, 2)]))
    rd = recv(c, N1, RequestVote(term=3, candidate_id=N1, last_log_index=last_index,
                                 last_log_term=last_term))
    assert sent(rd, RequestVoteResponse)[0][1].vote_granted is granted  # type: ignore[attr-defined]


def test_pre_vote_does_not_bump_terms() -> None:
    # Ref: §9.6: neither the pre-candidate nor its voters change term or vote.
    c = core(N1, restored=restored(5, [ent(1, 5)]), check_quorum=False)
    rd = step(c, Campaign())
    assert c.role.value == "pre_candidate"
    assert c.term == 5
    assert rd.hard_state is None
    pre = sent(rd, RequestVote)
    assert [m.term for _, m in pre] == [6, 6]  # type: ignore[attr-defined]
    voter = core(N2, restored=restored(5, [ent(1, 5)]), check_quorum=False)
    rd = recv(voter, N1, pre[0][1])
    assert sent(rd, RequestVoteResponse)[0][1] == RequestVoteResponse(
        term=6, vote_granted=True, pre_vote=True)
    assert (voter.term, voter.vote, rd.hard_state) == (5, None, None)
    # A granted pre-vote quorum starts the real election.
    rd = recv(c, N2, RequestVoteResponse(term=6, vote_granted=True, pre_vote=True))
    assert c.role.value == "candidate"
    assert c.term == 6


def test_pre_vote_rejected_for_stale_log() -> None:
    voter = core(N2, restored=restored(5, [ent(1, 5), ent(2, 5)]), check_quorum=False)
    rd = recv(voter, N1, RequestVote(term=6, candidate_id=N1, last_log_index=1,
                                     last_log_term=5, pre_vote=True))
    assert not sent(rd, RequestVoteResponse)[0][1].vote_granted  # type: ignore[attr-defined]
    assert voter.term == 5


def test_rejoining_node_cannot_disrupt_a_leader() -> None:
    # Ref: §4.2.3: a voter that heard from a leader within the election timeout ignores
    # RequestVote, even with a higher term, and keeps its term.
    c = core(N2)
    recv(c, N1, Heartbeat(term=3, leader_id=N1, leader_commit=0))
    for pre in (True, False):
        rd = recv(c, N3, RequestVote(term=9, candidate_id=N3, last_log_index=5,
                                     last_log_term=5, pre_vote=pre))
        assert rd.messages == ()
        assert rd.early_messages == ()
        assert c.term == 3
    assert c.status().dropped["vote_in_lease"] == 2
    # A leadership transfer campaign is answered.
    rd = recv(c, N3, RequestVote(term=9, candidate_id=N3, last_log_index=5, last_log_term=5,
                                 leadership_transfer=True))
    assert c.term == 9
    assert sent(rd, RequestVoteResponse)[0][1].vote_granted  # type: ignore[attr-defined]


def test_check_quorum_step_down() -> None:
    # Ref: §6.2: a leader that has not heard from a quorum for an election timeout steps down.
    c = core(election_ticks=4, pre_vote=False)
    make_leader(c)
    for _ in range(4):
        step(c, Tick())
    assert c.role.value == "leader"  # heard from n2 and n3 while campaigning
    recv(c, N2, HeartbeatResponse(term=c.term))
    for _ in range(4):
        step(c, Tick())
    assert c.role.value == "leader"  # n2 + itself is a quorum
    for _ in range(4):
        step(c, Tick())
    assert c.role.value == "follower"


def test_stale_term_messages_are_dropped_or_answered() -> None:
    c = core(N2, restored=restored(5, []))
    rd = recv(c, N1, AppendEntries(term=3, leader_id=N1, prev_log_index=0, prev_log_term=0,
                                   entries=(), leader_commit=0))
    # The stale leader learns the newer term (needed with pre-vote/check-quorum).
    assert sent(rd, AppendEntriesResponse)[0][1].term == 5  # type: ignore[attr-defined]
    recv(c, N1, RequestVoteResponse(term=3, vote_granted=True))
    assert c.status().dropped["stale_term"] == 1


def test_election_randomized_timeout_in_range() -> None:
    # Ref: §3.4: election timeouts are random in [T, 2T).
    seen = set()
    for seed in range(30):
        c = RaftCore(RaftConfig(node_id=N1, voters=VOTERS, election_ticks=5),
                     rng=random.Random(seed), restored=None)
        ticks = 0
        while c.role.value == "follower":
            c.step(Tick())
            ticks += 1
        seen.add(ticks)
    assert min(seen) >= 5
    assert max(seen) < 10
    assert len(seen) > 1


# ------------------------------------------------------------------------ persistence


def test_own_vote_counts_only_after_persisted() -> None:
    # Ref: §3.8 / Ready contract: the candidate's own vote is durable before it counts.
    c = core(N1, voters=(N1,), pre_vote=False)
    rd = c.step(Campaign())
    assert c.role.value == "candidate"
    assert rd.hard_state == HardState(term=1, vote=N1, commit=0)
    assert rd.must_sync
    rd2 = c.step(Persisted(number=rd.number))
    assert c.role.value == "leader"
    assert [e.kind for e in rd2.entries] == [EntryKind.NOOP]  # Ref: §6.4 no-op on election
    assert c.commit == 0  # the no-op is not durable yet
    rd3 = c.step(Persisted(number=rd2.number))
    assert c.commit == 1
    assert [e.index for e in rd3.committed] == [1]


def test_leader_counts_own_entries_only_when_durable() -> None:
    c = core(pre_vote=False)
    make_leader(c)
    recv(c, N2, AppendEntriesResponse(term=1, success=True, match_index=1))
    assert c.commit == 1
    rd = c.step(Submit(request=ClientRequest(client_id="c", request_no=1, command=b"x")))
    assert [e.index for e in rd.entries] == [2]
    # n2 acks entry 2 before the leader's own write is durable: n2 + n3 would be a quorum,
    # but n2 alone plus a non-durable leader is not.
    recv(c, N2, AppendEntriesResponse(term=1, success=True, match_index=2))
    assert c.commit == 1
    rd2 = c.step(Persisted(number=rd.number))
    assert c.commit == 2
    assert [e.index for e in rd2.committed] == [2]
    with pytest.raises(LocalProtocolError):
        c.step(Persisted(number=99))


def test_committed_entries_require_local_durability() -> None:
    c = core(N2)
    rd = recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                                   entries=(ent(1, 1), ent(2, 1, "x")), leader_commit=2),
              persist=False)
    assert rd.committed == ()
    assert rd.entries == (ent(1, 1), ent(2, 1, "x"))
    rd2 = c.step(Persisted(number=rd.number))
    assert [e.index for e in rd2.committed] == [1, 2]


# ------------------------------------------------------------------------ replication


def test_conflict_hints_and_truncation_at_real_conflict() -> None:
    # Ref: §3.5 and the fast backtracking of §5.3.
    c = core(N2, restored=restored(2, [ent(1, 1), ent(2, 2), ent(3, 2), ent(4, 2)]))
    rd = recv(c, N1, AppendEntries(term=3, leader_id=N1, prev_log_index=4, prev_log_term=3,
                                   entries=(), leader_commit=0))
    assert sent(rd, AppendEntriesResponse)[0][1] == AppendEntriesResponse(
        term=3, success=False, reject_index=4, conflict_index=2, conflict_term=2)
    rd = recv(c, N1, AppendEntries(term=3, leader_id=N1, prev_log_index=9, prev_log_term=3,
                                   entries=(), leader_commit=0))
    assert sent(rd, AppendEntriesResponse)[0][1] == AppendEntriesResponse(
        term=3, success=False, reject_index=9, conflict_index=5, conflict_term=0)
    rd = recv(c, N1, AppendEntries(term=3, leader_id=N1, prev_log_index=2, prev_log_term=2,
                                   entries=(ent(3, 2), ent(4, 3)), leader_commit=0))
    assert rd.truncate_from == 4
    assert rd.entries == (ent(4, 3),)
    assert sent(rd, AppendEntriesResponse)[0][1].match_index == 4  # type: ignore[attr-defined]


def test_leader_uses_conflict_hint() -> None:
    c = core(pre_vote=False, restored=restored(1, [ent(1, 1), ent(2, 1), ent(3, 1)]))
    make_leader(c)  # term 2, appends 4@2; probes n2 at prev=3@1
    rd = recv(c, N2, AppendEntriesResponse(term=2, success=False, reject_index=3,
                                           conflict_index=1, conflict_term=1))
    # n2 holds term 1 from index 1; the leader's last term-1 index is 3 (> reject index),
    # so it falls back to min(3+1, reject index) = 3: prev=2.
    ae = sent(rd, AppendEntries)[0][1]
    assert ae.prev_log_index == 2  # type: ignore[attr-defined]
    rd = recv(c, N2, AppendEntriesResponse(term=2, success=False, reject_index=2,
                                           conflict_index=2, conflict_term=0))
    assert sent(rd, AppendEntries)[0][1].prev_log_index == 1  # type: ignore[attr-defined]
    # A stale rejection (for an earlier probe) is ignored.
    rd = recv(c, N2, AppendEntriesResponse(term=2, success=False, reject_index=3,
                                           conflict_index=1, conflict_term=0))
    assert rd.messages == ()
    assert rd.early_messages == ()


def test_stale_append_does_not_truncate_matching_suffix() -> None:
    # Ref: §3.5: "If an existing entry conflicts ... delete it and all that follow" — only
    # a conflict; a stale, reordered message whose entries match changes nothing.
    c = core(N2)
    recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                              entries=(ent(1, 1), ent(2, 1, "a"), ent(3, 1, "b")),
                              leader_commit=0))
    rd = recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                                   entries=(ent(1, 1), ent(2, 1, "a")), leader_commit=0))
    assert rd.truncate_from is None
    assert rd.entries == ()
    assert c.log.last_index() == 3
    # It acknowledges only what it carried.
    assert sent(rd, AppendEntriesResponse)[0][1].match_index == 2  # type: ignore[attr-defined]


def test_commit_only_current_term_entries_figure_8() -> None:
    # Ref: §3.6.2, Figure 3.7: a leader never commits an entry of an earlier term by
    # counting replicas; it commits once an entry of its own term is on a majority.
    c = core(pre_vote=False, restored=restored(3, [ent(1, 1), ent(2, 2)]))
    make_leader(c)  # term 4, appends 3@4
    assert c.log.entry(3).term == 4
    recv(c, N2, AppendEntriesResponse(term=4, success=True, match_index=2))
    assert c.commit == 0  # 2@2 is on a majority but is not of term 4
    recv(c, N2, AppendEntriesResponse(term=4, success=True, match_index=3))
    assert c.commit == 3


def test_flow_control_probe_and_inflight_bound() -> None:
    # Ref: §10.2.1 pipelining with a bounded window; one probe at a time.
    c = core(pre_vote=False, max_inflight=2)
    make_leader(c)
    for i in range(5):
        rd = step(c, Submit(request=ClientRequest(client_id="c", request_no=i,
                                                  command=b"x")))
        assert sent(rd, AppendEntries) == []  # probing: the first probe is unanswered
    rd = recv(c, N2, AppendEntriesResponse(term=1, success=True, match_index=1))
    batches = [m for to, m in sent(rd, AppendEntries) if to == N2]
    assert len(batches) == 1  # replicate: all 5 new entries fit in one batch
    assert [e.index for e in batches[0].entries] == [2, 3, 4, 5, 6]  # type: ignore[attr-defined]
    sends = []
    for i in range(5):
        rd = step(c, Submit(request=ClientRequest(client_id="c", request_no=10 + i,
                                                  command=b"y")))
        sends += [m for to, m in sent(rd, AppendEntries) if to == N2]
    assert len(sends) == 1  # the window of 2 is full after one more message
    assert c.prs[N2].inflights.full()


def test_batching_limits() -> None:
    c = core(pre_vote=False, max_batch_entries=2)
    make_leader(c)
    for i in range(4):
        step(c, Submit(request=ClientRequest(client_id="c", request_no=i, command=b"x")))
    rd = recv(c, N2, AppendEntriesResponse(term=1, success=True, match_index=1))
    sizes = [len(m.entries) for to, m in sent(rd, AppendEntries) if to == N2]  # type: ignore[attr-defined]
    assert sizes == [2, 2]


# ------------------------------------------------------------------------ snapshots


def test_install_snapshot_chunks_and_resume() -> None:
    # Ref: §5.3 (Figure 5.3): chunks at offsets, install when done.
    c = core(N2)
    cfg = Configuration(voters=VOTERS)

    def chunk(off: int, data: bytes, done: bool) -> InstallSnapshot:
        return InstallSnapshot(term=1, leader_id=N1, last_included_index=10,
                               last_included_term=1, config=cfg, offset=off, data=data,
                               done=done)
    rd = recv(c, N1, chunk(0, b"abc", False))
    assert sent(rd, InstallSnapshotResponse)[0][1].next_offset == 3  # type: ignore[attr-defined]
    rd = recv(c, N1, chunk(6, b"ghi", False))  # out of order: asks for 3 again
    assert sent(rd, InstallSnapshotResponse)[0][1].next_offset == 3  # type: ignore[attr-defined]
    assert rd.snapshot is None
    rd = recv(c, N1, chunk(3, b"def", True))
    assert rd.snapshot == Snapshot(meta=SnapshotMeta(index=10, term=1, config=cfg),
                                   data=b"abcdef")
    assert (c.commit, c.applied, c.log.last_index()) == (10, 10, 10)
    assert sent(rd, InstallSnapshotResponse)[0][1].done  # type: ignore[attr-defined]


def test_leader_sends_snapshot_in_chunks_when_log_compacted() -> None:
    c = core(pre_vote=False, snapshot_chunk_size=4, log_tail_after_compaction=0)
    make_leader(c)
    recv(c, N3, AppendEntriesResponse(term=1, success=True, match_index=1))
    c.step(CheckpointTaken(index=1, data=b"0123456789"))
    assert c.log.offset == 1
    rd = recv(c, N2, HeartbeatResponse(term=1))  # unpauses the probe for n2 (next=1)
    snaps = [m for to, m in sent(rd, InstallSnapshot) if to == N2]
    assert [(m.offset, m.data, m.done) for m in snaps] == [(0, b"0123", False)]  # type: ignore[attr-defined]
    rd = recv(c, N2, InstallSnapshotResponse(term=1, last_included_index=1, next_offset=4,
                                             done=False))
    assert sent(rd, InstallSnapshot)[0][1].offset == 4  # type: ignore[attr-defined]
    rd = recv(c, N2, InstallSnapshotResponse(term=1, last_included_index=1, next_offset=99,
                                             done=False))
    assert c.status().dropped["malformed"] == 1
    recv(c, N2, InstallSnapshotResponse(term=1, last_included_index=1, next_offset=10,
                                        done=True))
    assert c.prs[N2].match == 1
    with pytest.raises(LocalProtocolError):
        c.step(CheckpointTaken(index=50, data=b""))


# ------------------------------------------------------------------------ membership


def test_learner_promotion_requires_catch_up_and_learners_do_not_vote() -> None:
    c = Cluster(pre_vote=False)
    c.add_nodes(3)
    c.add_node(NodeId("n4"), ())
    c.step(N1, Campaign())
    c.stabilize()
    c.step(N1, ProposeConfChange(change=ConfChange(add_learners=(NodeId("n4"),))))
    # Promote before n4 has caught up: refused.
    c.step(N1, ProposeConfChange(change=ConfChange(add_voters=(NodeId("n4"),))))
    assert c.nodes[N1].core.status().conf_change_error == "a membership change is in progress"
    c.stabilize()
    n4 = c.nodes[NodeId("n4")].core
    assert n4.config.learners == (NodeId("n4"),)
    c.tick(NodeId("n4"), 50)
    assert n4.role.value == "follower"  # learners never campaign
    c.step(N1, ProposeConfChange(change=ConfChange(add_voters=(NodeId("n4"),))))
    assert c.nodes[N1].core.status().conf_change_error is None
    c.stabilize()
    assert n4.config.voters == (N1, N2, N3, NodeId("n4"))


def test_conf_change_refused_when_not_leader() -> None:
    c = core(N2)
    c.step(ProposeConfChange(change=ConfChange(add_voters=(NodeId("n4"),))))
    assert c.status().conf_change_error == "not leader"


def test_timeout_now_starts_election_without_prevote() -> None:
    # Ref: §3.10.
    c = core(N2)
    recv(c, N1, Heartbeat(term=1, leader_id=N1, leader_commit=0))
    rd = recv(c, N1, TimeoutNow(term=1, leader_id=N1))
    assert c.role.value == "candidate"
    assert c.term == 2
    votes = sent(rd, RequestVote)
    assert all(m.leadership_transfer and not m.pre_vote for _, m in votes)  # type: ignore[attr-defined]
    # TimeoutNow from a node that is not our leader is ignored.
    d = core(N3)
    recv(d, N2, TimeoutNow(term=0, leader_id=N2))
    assert d.role.value == "follower"


# ------------------------------------------------------------------------ restart


def test_restart_from_restored_state_reapplies_after_snapshot() -> None:
    cfg = Configuration(voters=VOTERS)
    rs = RaftRestoredState(
        hard_state=HardState(term=3, vote=N2, commit=5),
        snapshot=Snapshot(meta=SnapshotMeta(index=2, term=1, config=cfg), data=b"s"),
        entries=(ent(1, 1), ent(2, 1), ent(3, 2, "a"), ent(4, 3, "b"), ent(5, 3, "c"),
                 ent(6, 3, "d")),
    )
    c = core(N1, restored=rs)
    assert (c.term, c.vote, c.commit, c.applied) == (3, N2, 5, 2)
    assert (c.log.offset, c.log.last_index()) == (2, 6)
    rd = c.step(Tick())
    assert [e.index for e in rd.committed] == [3, 4, 5]
    assert rd.hard_state is None


# ------------------------------------------------------------------------ bugs switches


def test_unknown_bug_name_raises_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*known:.*'commit_on_minority'"):
        RaftBugs.from_names({"nope"})


def test_bugs_object_round_trips_the_names_and_defaults_to_none() -> None:
    assert RaftBugs() == NO_BUGS
    assert NO_BUGS.names() == frozenset()
    assert RaftBugs.from_names(BUG_NAMES).names() == BUG_NAMES
    bugs = RaftBugs.from_names({"commit_on_minority"})
    assert bugs.commit_on_minority
    assert not bugs.forget_persist_vote
    assert not hasattr(RaftConfig(node_id=N1, voters=VOTERS), "bugs")  # not config any more


def test_bug_truncate_matching_suffix() -> None:
    c = core(N2, bugs=frozenset({"truncate_matching_suffix"}))
    recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                              entries=(ent(1, 1), ent(2, 1, "a"), ent(3, 1, "b")),
                              leader_commit=0))
    rd = recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                                   entries=(ent(1, 1),), leader_commit=0))
    assert rd.truncate_from == 1
    assert c.log.last_index() == 1


def test_bug_skip_vote_term_check() -> None:
    for bugs, granted in ((frozenset(), False), (frozenset({"skip_vote_term_check"}), True)):
        c = core(N3, bugs=bugs)
        recv(c, N1, RequestVote(term=1, candidate_id=N1, last_log_index=0, last_log_term=0))
        rd = recv(c, N2, RequestVote(term=1, candidate_id=N2, last_log_index=0,
                                     last_log_term=0))
        assert sent(rd, RequestVoteResponse)[0][1].vote_granted is granted  # type: ignore[attr-defined]


def test_bug_forget_persist_vote() -> None:
    for bugs, vote in ((frozenset(), N1), (frozenset({"forget_persist_vote"}), None)):
        c = core(N2, bugs=bugs)
        rd = recv(c, N1, RequestVote(term=1, candidate_id=N1, last_log_index=0,
                                     last_log_term=0))
        assert rd.hard_state is not None
        assert rd.hard_state.vote == vote


def test_bug_commit_on_minority() -> None:
    for bugs, commit in ((frozenset(), 0), (frozenset({"commit_on_minority"}), 1)):
        c = core(pre_vote=False, bugs=bugs)
        make_leader(c)
        assert c.commit == commit  # the leader alone "commits" its no-op with the bug


def test_stale_pre_vote_grant_is_not_counted() -> None:
    c = core(N1, restored=restored(2, [ent(1, 2)]), check_quorum=False)
    step(c, Campaign())  # pre-votes for term 3
    recv(c, N2, RequestVoteResponse(term=2, vote_granted=True, pre_vote=True))  # an old round's
    assert c.role.value == "pre_candidate"
    assert c.status().dropped["stale_vote_response"] == 1
    recv(c, N2, RequestVoteResponse(term=3, vote_granted=True, pre_vote=True))
    assert c.role.value == "candidate"

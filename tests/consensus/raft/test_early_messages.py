"""`Ready.early_messages` in the Raft core (Ref: §10.2.1) and `ProposeBatch`.

Only a leader's AppendEntries and heartbeats may leave before the Ready that produced them is
durable: the leader's term was durable before it could win, and it counts its own entries
only after `Persisted`. Votes, vote requests and every answer a follower gives depend on state
of their own Ready (a vote, a term, appended entries) and must wait for it.
"""

from __future__ import annotations

import random

import pytest
from fuzz_cluster import run_schedule
from raft_harness import Cluster, Node
from test_core import N1, N2, N3, core, make_leader, recv, step

from phalanx.consensus.core import Persisted, Ready, Submit, Tick
from phalanx.consensus.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Campaign,
    Heartbeat,
    HeartbeatResponse,
    ProposeBatch,
    RaftCore,
    RequestVote,
)
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId


def req(n: int, *, read_only: bool = False) -> ClientRequest:
    return ClientRequest(client_id="c", request_no=n, command=f"v{n}".encode(),
                         read_only=read_only)


def replicating_leader() -> RaftCore:
    """n1 as leader with both followers acknowledging its no-op (REPLICATE state)."""
    c = core(pre_vote=False)
    make_leader(c)
    for p in (N2, N3):
        recv(c, p, AppendEntriesResponse(term=c.term, success=True,
                                         match_index=c.log.last_index()))
    return c


def test_leader_append_entries_leave_before_the_entries_are_durable() -> None:
    c = replicating_leader()
    rd = c.step(Submit(request=req(1)))  # not persisted yet
    assert rd.entries
    assert rd.must_sync
    early = [(s.to, type(s.message)) for s in rd.early_messages]
    assert early == [(N2, AppendEntries), (N3, AppendEntries)]
    assert rd.messages == ()
    # The leader does not count its own undurable entry: one follower's ack is not enough.
    last = rd.entries[-1].index
    rd2 = recv(c, N2, AppendEntriesResponse(term=c.term, success=True, match_index=last),
               persist=False)
    assert c.commit < last
    assert rd2.committed == ()
    c.step(Persisted(number=rd.number))
    assert c.commit == last


def test_leader_heartbeats_are_early() -> None:
    c = core(pre_vote=False)
    make_leader(c)
    rd = step(c, Tick())
    assert {type(s.message) for s in rd.early_messages} == {Heartbeat}
    assert rd.messages == ()


def test_candidate_vote_requests_wait_for_the_term_to_be_durable() -> None:
    c = core(pre_vote=False)
    rd = c.step(Campaign())
    assert rd.hard_state is not None
    assert rd.early_messages == ()
    assert [type(s.message) for s in rd.messages] == [RequestVote, RequestVote]


def test_follower_answers_are_never_early() -> None:
    c = core(N2)
    rd = recv(c, N1, AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0,
                                   entries=(Entry(index=1, term=1, kind=EntryKind.NOOP),),
                                   leader_commit=0), persist=False)
    assert rd.early_messages == ()
    assert [type(s.message) for s in rd.messages] == [AppendEntriesResponse]
    rd = recv(c, N1, Heartbeat(term=1, leader_id=N1, leader_commit=0), persist=False)
    assert rd.early_messages == ()
    assert [type(s.message) for s in rd.messages] == [HeartbeatResponse]
    granted = core(N3, pre_vote=False)
    rd = recv(granted, N1, RequestVote(term=1, candidate_id=N1, last_log_index=0,
                                       last_log_term=0), persist=False)
    assert rd.early_messages == ()
    assert rd.messages  # the vote, after the Ready is durable


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_send_early_only_what_is_durable(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over random schedules (loss, crashes, partitions, elections): every early message is a
    leader's AppendEntries or heartbeat whose term is already on the sender's disk BEFORE the
    Ready that carries it is persisted."""
    original = Cluster._handle_ready
    problems: list[str] = []
    early_seen = [0]

    def checking(self: Cluster, nid: NodeId, node: Node, rd: Ready) -> None:
        for s in rd.early_messages:
            early_seen[0] += 1
            m = s.message
            if not isinstance(m, AppendEntries | Heartbeat):
                problems.append(f"{nid} sent {type(m).__name__} early")
            elif node.core.role.value != "leader" or m.leader_id != nid:
                problems.append(f"{nid} ({node.core.role.value}) sent an early {m}")
            elif m.term != node.disk.hard_state.term:
                problems.append(f"{nid} sent term {m.term} early with durable term "
                                f"{node.disk.hard_state.term}")
        original(self, nid, node, rd)

    monkeypatch.setattr(Cluster, "_handle_ready", checking)
    out = run_schedule(seed, steps=300)
    assert out.violations == []
    assert problems == []
    assert early_seen[0] > 0


# ---------------------------------------------------------------------------- ProposeBatch


def test_propose_batch_appends_one_entry_and_one_message_per_follower() -> None:
    c = replicating_leader()
    before = c.log.last_index()
    rd = step(c, ProposeBatch(requests=(req(1), req(2), req(3))))
    assert len(rd.entries) == 1
    entry = rd.entries[0]
    assert entry.index == before + 1
    assert entry.kind is EntryKind.COMMAND
    assert [r.request_no for r in entry.requests] == [1, 2, 3]
    aes = [(s.to, s.message) for s in rd.early_messages]
    assert [to for to, _ in aes] == [N2, N3]
    for _, m in aes:
        assert isinstance(m, AppendEntries)
        assert m.entries == (entry,)


def test_propose_batch_reads_take_the_read_path_and_followers_refuse_all() -> None:
    c = core(pre_vote=False)
    make_leader(c)
    before = c.log.last_index()
    rd = step(c, ProposeBatch(requests=(req(1), req(2, read_only=True))))
    assert [len(e.requests) for e in rd.entries] == [1]
    assert c.log.last_index() == before + 1  # the read added no entry
    follower = core(N2)
    rd = follower.step(ProposeBatch(requests=(req(5), req(6, read_only=True))))
    assert [r.request.request_no for r in rd.rejected] == [5, 6]
    assert rd.entries == ()


def test_propose_batch_matches_submits_applied_order() -> None:
    """A batch applies exactly the requests, in order, on every node (harness cluster)."""
    rng = random.Random(3)
    c = Cluster(election_ticks=4)
    c.verbose = False
    c.add_nodes(3)
    c.tick_election(NodeId("n1"))
    c.stabilize()
    leader = c.leader()
    assert leader is not None
    words = [f"w{rng.randrange(1000)}" for _ in range(7)]
    reqs = tuple(ClientRequest(client_id="b", request_no=i + 1, command=w.encode())
                 for i, w in enumerate(words))
    c.step(leader, ProposeBatch(requests=reqs))
    c.stabilize()
    for nid in c.nodes:
        c.tick(nid)
    c.stabilize()
    for node in c.nodes.values():
        assert node.app[-7:] == words

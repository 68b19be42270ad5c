"""Amnesia: a Raft node that lost its durable state (`RaftRestoredState.recovering`).

The attack of the hardening issue, on three cores: n1 is down; a write is acknowledged by
n2 and n3; n2 and n3 stop; n3 restarts with an empty data directory. Without recovery mode
n1 and n3 elect a leader and the acknowledged write is gone for good (the harness's State
Machine Safety check fires when another command commits at its index). In recovery mode n3
neither votes nor campaigns, so no leader forms until n2 returns; n3 then catches up and
votes again, and the write survives.
"""

from __future__ import annotations

import random

import pytest
from raft_harness import Cluster, Disk

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.raft import (
    RaftCore,
    RaftRestoredState,
    RequestVote,
    RequestVoteResponse,
    TermQuery,
    TermQueryResponse,
)
from phalanx.consensus.types import HardState, NodeId

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def lose_disk(c: Cluster, nid: NodeId, *, recovering: bool) -> None:
    """Restart `nid` with an empty disk, in recovery mode or (today's behaviour) not."""
    node = c.nodes[nid]
    node.disk = Disk()
    c.seed += 1
    node.core = RaftCore(node.config, rng=random.Random(c.seed),
                         restored=RaftRestoredState(hard_state=HardState(),
                                                    recovering=recovering), bugs=c.bugs)
    node.app = []
    node.applied_index = 0
    node.up = True


def elect(c: Cluster, nid: NodeId) -> None:
    c.tick_election(nid)
    c.stabilize()
    assert c.leader() == nid


def acknowledged_write_on_n2_n3() -> Cluster:
    c = Cluster()
    c.add_nodes(3)
    elect(c, N2)
    c.crash(N1)
    c.propose(N2, "x")
    c.stabilize()
    assert "x" in c.nodes[N2].app
    assert "x" in c.nodes[N3].app
    c.crash(N2)
    c.crash(N3)
    return c


def run_for(c: Cluster, ticks: int, nodes: tuple[NodeId, ...]) -> None:
    for _ in range(ticks):
        for nid in nodes:
            c.step(nid, Tick())
        c.stabilize()


def test_without_recovery_mode_the_acknowledged_write_is_lost() -> None:
    """The control: today's behaviour (an empty node votes at once) loses the write."""
    c = acknowledged_write_on_n2_n3()
    c.restart(N1)
    lose_disk(c, N3, recovering=False)
    # n1 and the empty n3 elect a leader, whose no-op commits at the write's index.
    with pytest.raises(AssertionError, match="State Machine Safety violated at 2"):
        run_for(c, 60, (N1, N3))


def test_recovering_node_withholds_votes_until_caught_up() -> None:
    c = acknowledged_write_on_n2_n3()
    c.restart(N1)
    lose_disk(c, N3, recovering=True)
    run_for(c, 80, (N1, N3))
    assert c.leader() is None, "n1 must not win with the vote of a node that lost its disk"
    assert c.nodes[N3].core.status().recovering
    assert c.nodes[N3].core.status().dropped.get("vote_while_recovering", 0) > 0
    assert c.nodes[N3].core.term == 0 or c.nodes[N3].core.vote is None
    # n2 comes back: it holds the write, wins, and n3 catches up from it.
    c.restart(N2)
    run_for(c, 80, (N1, N2, N3))
    leader = c.leader()
    assert leader == N2
    assert not c.nodes[N3].core.status().recovering
    assert c.nodes[N3].core.vote == N2, "the caught-up node's vote for this term is the leader"
    assert "x" in c.nodes[N3].app
    assert "x" in c.nodes[N1].app
    c.propose(N2, "z")
    c.stabilize()
    assert c.nodes[N3].app[-1] == "z"


def test_recovering_node_never_campaigns() -> None:
    c = Cluster()
    c.add_nodes(3)
    lose_disk(c, N1, recovering=True)
    sent: list[object] = []
    for _ in range(100):
        rd = c.nodes[N1].core.step(Tick())
        sent.extend(s.message for s in (*rd.messages, *rd.early_messages))
    assert not any(isinstance(m, RequestVote) for m in sent)


def test_recovering_node_refuses_pre_votes_and_votes() -> None:
    c = Cluster()
    c.add_nodes(3)
    lose_disk(c, N1, recovering=True)
    for pre in (True, False):
        rd = c.nodes[N1].core.step(Receive(src=N2, message=RequestVote(
            term=1, candidate_id=N2, last_log_index=5, last_log_term=1, pre_vote=pre)))
        replies = [s.message for s in rd.messages]
        assert replies
        assert all(isinstance(m, RequestVoteResponse) for m in replies)
        assert not any(getattr(m, "vote_granted", True) for m in replies), replies
    assert c.nodes[N1].core.vote is None


def test_caught_up_only_after_an_entry_of_the_leaders_term_commits() -> None:
    """Catching up to a new leader's commit index is not enough while that index is from an
    earlier term: entries we acknowledged may lie beyond it until the leader's no-op commits."""
    c = Cluster()
    c.add_nodes(3)
    elect(c, N1)
    c.propose(N1, "a")
    c.stabilize()
    lose_disk(c, N3, recovering=True)
    # Deliver n1's next heartbeat round but hold back nothing: the leader's no-op of term 1 is
    # committed, so n3 recovers once it holds it durably.
    run_for(c, 20, (N1, N2, N3))
    st = c.nodes[N3].core.status()
    assert not st.recovering
    assert st.commit_index >= 2
    assert "a" in c.nodes[N3].app


def test_recovery_survives_a_crash_midway() -> None:
    """The flag is the driver's to keep durably; a core restarted with it stays recovering
    even though its hard state now names a term."""
    c = Cluster()
    c.add_nodes(3)
    elect(c, N1)
    lose_disk(c, N3, recovering=True)
    node = c.nodes[N3]
    restarted = RaftCore(node.config, rng=random.Random(99),
                         restored=RaftRestoredState(hard_state=HardState(term=c.nodes[N1].core.term),
                                                    recovering=True))
    assert restarted.status().recovering
    assert restarted.status().role == "follower"


def test_follower_that_lost_its_log_under_a_steady_leader_catches_up() -> None:
    """The leader keeps its belief that the follower matches its old log end; the follower's
    heartbeat answer (`lost_from`) lowers it, so the missing entries are sent again. Without
    it every rejection below the old match counts as stale and the follower never catches up
    (nor, in recovery mode, ever votes again)."""
    c = Cluster()
    c.add_nodes(3)
    elect(c, N1)
    for k in range(5):
        c.propose(N1, f"w{k}")
    c.stabilize()
    lose_disk(c, N3, recovering=True)
    run_for(c, 10, (N1, N2, N3))
    c.propose(N1, "after")
    run_for(c, 10, (N1, N2, N3))
    assert c.nodes[N3].app == c.nodes[N1].app
    assert "w0" in c.nodes[N3].app
    assert c.nodes[N3].app[-1] == "after"
    assert not c.nodes[N3].core.status().recovering


def test_recovering_node_learns_the_term_before_it_follows_anyone() -> None:
    """The simulator's seed 38 (lose-disk + isolate-leader, check-quorum and pre-vote off):
    n2, leader of term 1, is cut off and keeps appending; n1 and n3 move on to term 2 and
    commit `x`; n3 loses its disk. Back at term 0, n3 would take n2's term-1 AppendEntries
    for current, acknowledge them, and n2 would commit its stale entries over `x` (the
    harness's State Machine Safety check fires). Asking a majority of the other voters for
    their term first (TermQuery) makes n3 start at term 2, where n2 is stale."""
    c = Cluster(check_quorum=False, pre_vote=False)
    c.add_nodes(3)
    elect(c, N2)
    c.propose(N2, "a")
    c.stabilize()
    c.partition((N2,), (N1, N3))
    c.propose(N2, "stale1")
    c.propose(N2, "stale2")
    c.stabilize()
    elect(c, N3)
    c.propose(N3, "x")
    c.stabilize()
    assert "x" in c.nodes[N1].app
    lose_disk(c, N3, recovering=True)
    c.blocked = {(N1, N2), (N2, N1)}  # n1 never tells n2 about term 2
    run_for(c, 40, (N1, N2, N3))
    assert c.nodes[N3].core.term >= 2
    assert "stale1" not in c.nodes[N2].app, "the deposed leader committed over `x`"
    assert c.nodes[N3].core.status().dropped.get("stale_term", 0) > 0
    c.heal()
    run_for(c, 80, (N1, N2, N3))
    assert not c.nodes[N3].core.status().recovering
    for nid in (N1, N2, N3):
        assert "x" in c.nodes[nid].app
        assert "stale1" not in c.nodes[nid].app


def test_term_queries_are_answered_without_changing_anything() -> None:
    c = Cluster()
    c.add_nodes(3)
    elect(c, N1)
    before = c.nodes[N2].core.status()
    rd = c.nodes[N2].core.step(Receive(src=N3, message=TermQuery(term=0)))
    assert [type(s.message) for s in rd.messages] == [TermQueryResponse]
    assert rd.messages[0].message == TermQueryResponse(term=before.term)
    assert c.nodes[N2].core.status() == before


def test_a_recovering_node_stays_recovering_until_it_holds_what_the_leader_committed() -> None:
    """Found by the simulator (raft, 5 nodes, seed 29 with kill and lose-disk: committed-
    durable): a node that lost its disk left recovery as soon as ITS commit index (bounded by
    its short log) reached an entry of the leader's term, while the leader had committed far
    more with that node's forgotten acknowledgements. It could then vote with a lagging node
    for a leader lacking an acknowledged write. It must stay recovering until it holds the
    leader's reported commit index."""
    c = Cluster(max_batch_entries=1, max_inflight=1)
    c.add_nodes(3)
    elect(c, N1)
    c.propose(N1, "a")
    c.stabilize()
    c.blocked = {(N1, N2), (N2, N1)}  # n2 lags: it hears from n3 only
    for command in ("b", "x"):
        c.propose(N1, command)
        c.stabilize()
    assert "x" in c.nodes[N1].app  # acknowledged with n3's vote
    committed = c.nodes[N1].core.status().commit_index
    lose_disk(c, N3, recovering=True)
    for _ in range(2000):  # one message at a time: n3 catches up one entry per round trip
        if not c.deliver(limit=1):
            c.step(N3, Tick())
            c.step(N1, Tick())
            continue
        st = c.nodes[N3].core.status()
        if not st.recovering:
            assert st.commit_index >= committed, (
                f"n3 left recovery at commit {st.commit_index}; n1 had committed {committed}")
            break
    assert not c.nodes[N3].core.status().recovering
    assert "x" in c.nodes[N3].app

"""Raft block stamps (`RaftConfig.block_stamps`): the leader stamps each command entry with its
clock and id, never below the newest stamp in its log (a new leader whose clock is behind,
a clock stepped back); every replica applies the same stamp (it travels in the entry);
without `block_stamps` entries carry none. Raft trusts its leader (crash faults): followers
take the stamp as it comes."""

from __future__ import annotations

from raft_harness import Cluster

from phalanx.consensus.core import Tick
from phalanx.consensus.types import NodeId

T = 1_700_000_000_000


def elect(c: Cluster, nid: NodeId) -> None:
    c.tick_election(nid)
    c.stabilize()
    assert c.leader() == nid


def test_leaders_stamp_and_time_never_goes_back() -> None:
    c = Cluster(block_stamps=True, pre_vote=False, check_quorum=False)
    c.verbose = False
    c.add_nodes(3)
    n1, n2 = NodeId("n1"), NodeId("n2")
    elect(c, n1)
    c.step(n1, Tick(now_ms=T))
    c.propose(n1, "a", request_no=1)
    c.step(n1, Tick(now_ms=T - 50))  # the clock steps back: the stamp keeps the floor
    c.propose(n1, "b", request_no=2)
    c.stabilize()
    c.crash(n1)
    c.step(n2, Tick(now_ms=T - 1000))  # the next leader's clock is behind
    elect(c, n2)
    c.propose(n2, "c", request_no=3)
    c.stabilize()
    got = sorted((i, e.timestamp, e.proposer) for i, e in c.committed_at.items() if e.requests)
    assert [(ts, who) for _, ts, who in got] == [(T, "n1"), (T, "n1"), (T, "n2")]
    for nid in (n2, NodeId("n3")):
        assert c.nodes[nid].app[-3:] == ["a", "b", "c"]


def test_without_block_stamps_entries_carry_none() -> None:
    c = Cluster()
    c.verbose = False
    c.add_nodes(3)
    n1 = NodeId("n1")
    elect(c, n1)
    c.step(n1, Tick(now_ms=T))
    c.propose(n1, "a", request_no=1)
    c.stabilize()
    assert [(e.timestamp, e.proposer) for e in c.committed_at.values() if e.requests] == [
        (0, "")]

"""Each deliberate bug (`RaftBugs`, consensus/raft/bugs.py) breaks a safety property in a
small, exact scenario that the correct core survives. (The random sweep in test_fuzz.py catches the
frequent ones too; these pin down the exact mechanism.)"""

from __future__ import annotations

import pytest
from raft_harness import Cluster

from phalanx.consensus.core import Receive
from phalanx.consensus.raft import AppendEntries, Campaign
from phalanx.consensus.types import NodeId

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def cluster(bugs: frozenset[str]) -> Cluster:
    c = Cluster(pre_vote=False, check_quorum=False, bugs=bugs)
    c.verbose = False
    c.add_nodes(3)
    return c


def leaders_by_term(c: Cluster) -> dict[int, list[NodeId]]:
    out: dict[int, list[NodeId]] = {}
    for nid, node in c.nodes.items():
        if node.core.role.value == "leader":
            out.setdefault(node.core.term, []).append(nid)
    return out


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({"forget_persist_vote"}),
                                  frozenset({"skip_vote_term_check"})])
def test_double_vote_bugs_elect_two_leaders(bugs: frozenset[str]) -> None:
    # n1 and n2 campaign in term 1; n3 votes for n1, then hears n2 (after a crash and
    # restart for forget_persist_vote).
    c = cluster(bugs)
    c.step(N1, Campaign())
    c.step(N2, Campaign())
    c.deliver(lambda s, t, m: (s, t) == (N1, N3))
    if "forget_persist_vote" in bugs:
        c.crash(N3)
        c.restart(N3)
    c.deliver(lambda s, t, m: (s, t) == (N2, N3))
    c.stabilize()
    expected = [N1, N2] if bugs else [N1]
    assert leaders_by_term(c) == {1: expected}


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({"truncate_matching_suffix"})])
def test_truncating_a_matching_suffix_loses_a_committed_entry(bugs: frozenset[str]) -> None:
    c = cluster(bugs)
    c.step(N1, Campaign())
    c.stabilize()
    c.partition((N1, N2), (N3,))
    c.propose(N1, "a")
    stale = next(m for s, t, m in c.queue if (s, t) == (N1, N2))
    assert isinstance(stale, AppendEntries)
    c.propose(N1, "b", request_no=1)
    c.deliver(lambda s, t, m: (s, t) == (N1, N2))  # n2 appends a and b
    c.deliver(lambda s, t, m: (s, t) == (N2, N1))  # n1 commits and applies both
    assert c.nodes[N1].app == ["a", "b"]
    c.drop()  # n2 does not learn the new commit index
    c.step(N2, Receive(src=N1, message=stale))  # a duplicated, late AppendEntries
    c.crash(N1)
    c.heal()
    c.step(N2, Campaign())
    if bugs:
        with pytest.raises(AssertionError, match="State Machine Safety violated at 3"):
            c.stabilize()
    else:
        c.stabilize()
        assert c.nodes[N2].core.role.value == "leader"
        assert c.nodes[N3].app == ["a", "b"]


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({"commit_on_minority"})])
def test_commit_on_minority_loses_a_committed_entry(bugs: frozenset[str]) -> None:
    c = cluster(bugs)
    c.step(N1, Campaign())
    c.stabilize()
    c.partition((N1,), (N2, N3))
    c.propose(N1, "a")
    c.stabilize()
    assert c.nodes[N1].app == (["a"] if bugs else [])  # "committed" by n1 alone
    c.step(N2, Campaign())
    if bugs:
        with pytest.raises(AssertionError, match="State Machine Safety violated at 2"):
            c.stabilize()  # n2 and n3 commit their own entry 2
    else:
        c.stabilize()
        c.propose(N2, "b")
        c.heal()
        c.tick(N2)
        c.stabilize()
        assert c.nodes[N1].app == ["b"]

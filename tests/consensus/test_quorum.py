"""Tests of `phalanx.consensus.quorum`: sizes, tallies, joint composition, intersections."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.consensus.quorum import (
    JointConfig,
    MajorityConfig,
    VoteResult,
    byzantine_quorum,
    leaderless_quorum,
    majority,
    max_byzantine_faults,
    reply_quorum,
)
from phalanx.consensus.types import Configuration, NodeId

NAMES = tuple(NodeId(f"n{i}") for i in range(1, 8))
voter_sets = st.sets(st.sampled_from(NAMES), min_size=1).map(lambda s: tuple(sorted(s)))


def test_sizes() -> None:
    assert [majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]
    assert [byzantine_quorum(n) for n in (4, 7, 10)] == [3, 5, 7]
    assert [max_byzantine_faults(n) for n in (1, 3, 4, 7)] == [0, 0, 1, 2]
    assert reply_quorum(2) == 3
    assert leaderless_quorum(4, 1) == 3
    assert leaderless_quorum(7, 2) == 5
    for bad in (lambda: majority(0), lambda: reply_quorum(-1), lambda: leaderless_quorum(3, 1)):
        with pytest.raises(ValueError):  # noqa: PT011
            bad()


@given(voter_sets, st.dictionaries(st.sampled_from(NAMES), st.integers(0, 20)))
def test_committed_index_is_acked_by_a_majority(voters: tuple[NodeId, ...],
                                                acked: dict[NodeId, int]) -> None:
    idx = MajorityConfig(voters).committed_index(acked)
    holders = [v for v in voters if acked.get(v, 0) >= idx]
    assert len(holders) >= majority(len(voters))
    # ... and it is the largest such index.
    bigger = [v for v in voters if acked.get(v, 0) >= idx + 1]
    assert len(bigger) < majority(len(voters))


@given(voter_sets, voter_sets, st.dictionaries(st.sampled_from(NAMES), st.integers(0, 20)))
def test_joint_commit_is_min_of_halves(a: tuple[NodeId, ...], b: tuple[NodeId, ...],
                                       acked: dict[NodeId, int]) -> None:
    jc = JointConfig(MajorityConfig(a), MajorityConfig(b))
    assert jc.committed_index(acked) == min(MajorityConfig(a).committed_index(acked),
                                            MajorityConfig(b).committed_index(acked))


def test_empty_outgoing_half_is_neutral() -> None:
    cfg = Configuration(voters=NAMES[:3])
    jc = JointConfig.of(cfg)
    acked = {NAMES[0]: 5, NAMES[1]: 3, NAMES[2]: 1}
    assert jc.committed_index(acked) == MajorityConfig(NAMES[:3]).committed_index(acked) == 3
    assert JointConfig.of(Configuration(voters=())).committed_index(acked) == 0


@given(voter_sets, voter_sets, st.dictionaries(st.sampled_from(NAMES), st.booleans()))
def test_joint_vote_needs_both_halves(a: tuple[NodeId, ...], b: tuple[NodeId, ...],
                                      votes: dict[NodeId, bool]) -> None:
    ra = MajorityConfig(a).vote_result(votes)
    rb = MajorityConfig(b).vote_result(votes)
    r = JointConfig(MajorityConfig(a), MajorityConfig(b)).vote_result(votes)
    if VoteResult.LOST in (ra, rb):
        assert r is VoteResult.LOST
    elif ra is rb is VoteResult.WON:
        assert r is VoteResult.WON
    else:
        assert r is VoteResult.PENDING


@given(voter_sets, voter_sets)
def test_two_joint_quorums_intersect_in_each_half(a: tuple[NodeId, ...],
                                                  b: tuple[NodeId, ...]) -> None:
    """Any two quorums of a joint config share a voter of each half (so two leaders of one
    term, or a committed entry and a winning candidate, always meet)."""
    jc = JointConfig(MajorityConfig(a), MajorityConfig(b))
    members = jc.voters()
    quorums = [set(q) for r in range(len(members) + 1)
               for q in itertools.combinations(members, r) if jc.has_quorum(q)]
    for q1, q2 in itertools.combinations(quorums[:40], 2):
        assert q1 & q2 & set(a)
        assert q1 & q2 & set(b)


@given(st.integers(1, 13).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, (n - 1) // 3))))
def test_leaderless_quorums_intersect_in_f_plus_one(nf: tuple[int, int]) -> None:
    n, f = nf
    q = leaderless_quorum(n, f)
    assert q <= n - f  # live: the honest nodes alone form a quorum
    assert 2 * q - n >= f + 1  # any two quorums share f+1 nodes, one of them honest


@given(st.integers(1, 40))
def test_byzantine_quorums_intersect_in_an_honest_node(n: int) -> None:
    q, f = byzantine_quorum(n), max_byzantine_faults(n)
    assert 2 * q - n >= f + 1
    assert q <= n - f

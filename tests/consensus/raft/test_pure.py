"""Unit and property tests of Raft's pure sub-machines: log, progress, confchange, readonly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.consensus.core import Snapshot
from phalanx.consensus.quorum import JointConfig
from phalanx.consensus.raft.confchange import ConfChange, ConfChangeError, enter_joint, leave_joint
from phalanx.consensus.raft.log import RaftLog
from phalanx.consensus.raft.progress import (
    STALL_LIMIT,
    Inflights,
    Progress,
    ProgressState,
    stall_limit,
)
from phalanx.consensus.raft.readonly import ReadOnly
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    NodeId,
    SnapshotMeta,
)

CFG = Configuration(voters=(NodeId("n1"), NodeId("n2"), NodeId("n3")))


def ents(start: int, terms: list[int]) -> list[Entry]:
    return [Entry(index=start + k, term=t, kind=EntryKind.NOOP) for k, t in enumerate(terms)]


def make_log(terms: list[int]) -> RaftLog:
    log = RaftLog(offset=0, offset_term=0, base_config=CFG)
    log.append(ents(1, terms))
    return log


# ------------------------------------------------------------------------------------ log


def test_log_basics() -> None:
    log = make_log([1, 1, 2, 3])
    assert (log.first_index(), log.last_index(), log.last_term()) == (1, 4, 3)
    assert [log.term_at(i) for i in range(6)] == [0, 1, 1, 2, 3, None]
    assert log.match_term(3, 2)
    assert not log.match_term(3, 1)
    assert log.first_index_of_term(2) == 1
    assert log.last_index_of_term(1, at_most=4) == 2
    assert log.last_index_of_term(4, at_most=4) == 0
    with pytest.raises(LocalProtocolError):
        log.append(ents(6, [3]))


def test_find_conflict_only_at_real_conflicts() -> None:
    # Ref: §3.5: a matching suffix (or a stale prefix of it) is not a conflict.
    log = make_log([1, 1, 2, 3])
    assert log.find_conflict(ents(2, [1, 2])) == 0
    assert log.find_conflict(ents(2, [1, 2, 3, 3])) == 5  # only new entries
    assert log.find_conflict(ents(3, [3])) == 3  # a real term conflict


def test_up_to_date() -> None:
    # Ref: §3.6.1: compare last terms, then lengths.
    log = make_log([1, 2, 2])
    assert log.is_up_to_date(3, 2)
    assert log.is_up_to_date(1, 3)
    assert not log.is_up_to_date(2, 2)
    assert not log.is_up_to_date(9, 1)


def test_compact_keeps_terms_and_configs() -> None:
    log = RaftLog(offset=0, offset_term=0, base_config=CFG)
    new_cfg = Configuration(voters=(NodeId("n1"), NodeId("n2")))
    log.append(ents(1, [1, 1]))
    log.append([Entry(index=3, term=2, kind=EntryKind.CONFIG, config=new_cfg)])
    log.append(ents(4, [2, 2]))
    assert log.config_at(2) == CFG
    assert log.config_at(3) == new_cfg
    log.compact(3)
    assert (log.offset, log.offset_term, log.base_config) == (3, 2, new_cfg)
    assert log.term_at(2) is None
    assert log.term_at(3) == 2
    assert log.find_conflict(ents(2, [1, 2, 2])) == 0  # compacted entries count as matching
    log.check_invariants()
    with pytest.raises(LocalProtocolError):
        log.truncate_from(3)


def test_truncate_drops_config_history() -> None:
    log = make_log([1])
    new_cfg = Configuration(voters=(NodeId("n1"),))
    log.append([Entry(index=2, term=1, kind=EntryKind.CONFIG, config=new_cfg)])
    assert log.latest_config() == (2, new_cfg)
    log.truncate_from(2)
    assert log.latest_config() == (0, CFG)


def test_slice_limits() -> None:
    log = make_log([1] * 10)
    assert len(log.slice(2, 11, max_entries=3, max_bytes=1 << 20)) == 3
    assert len(log.slice(2, 11, max_entries=100, max_bytes=1)) == 1  # always one entry
    with pytest.raises(LocalProtocolError):
        log.slice(0, 3, max_entries=5, max_bytes=100)


@given(st.integers(0, 12), st.integers(0, 12), st.integers(0, 4))
def test_between_is_an_unlimited_slice(lo: int, hi: int, compacted: int) -> None:
    log = make_log([1] * 10)
    log.compact(compacted)
    try:
        want = log.slice(lo, hi, max_entries=1 << 62, max_bytes=1 << 62)
    except LocalProtocolError:
        with pytest.raises(LocalProtocolError):
            log.between(lo, hi)
        return
    assert log.between(lo, hi) == want


@given(st.lists(st.integers(1, 4), min_size=1, max_size=30), st.integers(0, 30),
       st.lists(st.integers(1, 6), max_size=10))
def test_log_append_truncate_property(terms: list[int], cut: int, more: list[int]) -> None:
    terms = sorted(terms)
    log = make_log(terms)
    cut = max(1, min(cut, log.last_index() + 1))
    if cut <= log.last_index():
        log.truncate_from(cut)
    assert log.last_index() == cut - 1
    base = log.last_term()
    log.append(ents(cut, sorted(max(t, base) for t in more)))
    log.check_invariants()


# ------------------------------------------------------------------------------ progress


def test_inflights_bound() -> None:
    inf = Inflights(2)
    inf.add(3)
    inf.add(5)
    assert inf.full()
    with pytest.raises(ValueError, match="full"):
        inf.add(7)
    inf.free_le(4)
    assert inf.count() == 1
    assert not inf.full()


def test_progress_probe_and_replicate() -> None:
    # Ref: §10.2.1 flow control (etcd's probe/replicate states).
    pr = Progress(next_index=5, max_inflight=2)
    assert pr.state is ProgressState.PROBE
    assert not pr.is_blocked()
    pr.sent_entries(5)
    assert pr.is_blocked()  # one probe at a time
    assert pr.maybe_update(5)
    pr.become_replicate()
    pr.sent_entries(7)
    pr.sent_entries(9)
    assert pr.next == 10
    assert pr.is_blocked()
    assert pr.maybe_update(7)
    assert not pr.is_blocked()
    assert not pr.maybe_update(6)  # stale
    pr.become_snapshot(Snapshot(meta=SnapshotMeta(index=20, term=1,
                                                  config=CFG),
                                data=b""))
    assert pr.is_blocked()
    pr.match = 20
    pr.become_probe()
    assert pr.next == 21


def test_progress_stall_detection() -> None:
    pr = Progress(next_index=1, max_inflight=8)
    pr.become_replicate()
    pr.sent_entries(4)
    results = [pr.heartbeat_acked(4) for _ in range(STALL_LIMIT)]
    assert results[-1]
    assert not any(results[:-1])
    pr.maybe_update(4)
    assert not pr.heartbeat_acked(4)


def test_stall_limit_is_two_election_timeouts_of_heartbeats() -> None:
    assert stall_limit(10, 1) == 20
    assert stall_limit(10, 3) == 7  # rounded up
    assert stall_limit(30, 2) == 30
    assert stall_limit(2, 1) == 4
    assert stall_limit(3, 2) == 3
    assert stall_limit(1, 1) == STALL_LIMIT  # never below the floor
    with pytest.raises(ValueError, match="must be >= 1"):
        stall_limit(0, 1)
    with pytest.raises(ValueError, match="stall_limit"):
        Progress(next_index=1, max_inflight=1, stall_limit=0)


def test_a_follower_whose_answers_trail_heartbeats_is_not_stalled_once_learnt() -> None:
    # Issue #4: a round trip of five heartbeat intervals puts five heartbeat answers ahead of
    # each AppendEntries answer. The first such round is taken for a lost window (nothing is
    # known yet); its late answer teaches the follower's lag, and later rounds are waited for.
    pr = Progress(next_index=1, max_inflight=2, stall_limit=stall_limit(30, 2))
    pr.become_replicate()
    pr.sent_entries(1)
    assert [pr.heartbeat_acked(1) for _ in range(STALL_LIMIT)][-1]
    pr.become_probe()
    for _ in range(3):
        assert not pr.heartbeat_acked(1)
    assert pr.maybe_update(1)
    pr.become_replicate()
    assert pr.lag == 5
    for last in range(2, 22):
        pr.sent_entries(last)
        for _ in range(5):
            assert not pr.heartbeat_acked(last)
        assert pr.maybe_update(last)
        assert pr.state is ProgressState.REPLICATE
    # A window that is really lost is still found, STALL_LIMIT answers past the lag.
    pr.sent_entries(22)
    results = [pr.heartbeat_acked(22) for _ in range(5 + STALL_LIMIT)]
    assert results[-1]
    assert not any(results[:-1])


def test_the_learnt_lag_is_capped_and_decays() -> None:
    pr = Progress(next_index=1, max_inflight=1, stall_limit=6)
    pr.become_replicate()
    pr.sent_entries(1)
    for _ in range(5):
        pr.heartbeat_acked(1)
    pr.become_probe()  # (the fifth answer stalled it)
    for _ in range(10):
        pr.heartbeat_acked(1)
    assert pr.maybe_update(1)
    assert pr.lag == 15
    assert pr.stall_threshold() == 6  # capped at stall_limit
    for last in range(2, 12):  # fast answers: the lag decays one per progress
        pr.become_replicate()
        pr.sent_entries(last)
        assert pr.maybe_update(last)
    assert pr.lag == 5
    assert pr.stall_threshold() == 6
    for last in range(12, 16):
        pr.sent_entries(last)
        assert pr.maybe_update(last)
    assert pr.lag == 1
    assert pr.stall_threshold() == STALL_LIMIT + 1


def test_progress_full_window_with_progress_is_not_a_stall() -> None:
    # Under load the window is full all the time; as long as each heartbeat round sees
    # progress, the follower must stay in REPLICATE (probing would resend the whole window).
    pr = Progress(next_index=1, max_inflight=2)
    pr.become_replicate()
    last = 0
    for _ in range(10 * STALL_LIMIT):
        pr.sent_entries(last + 1)
        pr.sent_entries(last + 2)
        assert pr.inflights.full()
        assert not pr.heartbeat_acked(last + 2)
        pr.maybe_update(last + 1)
        last += 2
        pr.maybe_update(last)
    assert pr.state is ProgressState.REPLICATE


# ---------------------------------------------------------------------------- confchange


def n(*names: str) -> tuple[NodeId, ...]:
    return tuple(NodeId(x) for x in names)


def test_enter_and_leave_joint() -> None:
    # Ref: §4.3 joint consensus.
    joint = enter_joint(CFG, ConfChange(add_voters=n("n4"), remove_voters=n("n1")))
    assert joint.voters == n("n2", "n3", "n4")
    assert joint.voters_outgoing == n("n1", "n2", "n3")
    assert leave_joint(joint) == Configuration(voters=n("n2", "n3", "n4"))
    with pytest.raises(ConfChangeError):
        enter_joint(joint, ConfChange(add_voters=n("n5")))


def test_learner_changes_skip_joint_and_promotion() -> None:
    with_learner = enter_joint(CFG, ConfChange(add_learners=n("n4")))
    assert not with_learner.joint
    assert with_learner.learners == n("n4")
    promoted = enter_joint(with_learner, ConfChange(add_voters=n("n4")))
    assert promoted.joint
    assert promoted.learners == ()
    assert "n4" in promoted.voters


@pytest.mark.parametrize("change", [
    ConfChange(add_voters=n("n1")),
    ConfChange(remove_voters=n("n9")),
    ConfChange(remove_voters=n("n1", "n2", "n3")),
    ConfChange(add_learners=n("n1")),
    ConfChange(remove_learners=n("n4")),
])
def test_invalid_changes(change: ConfChange) -> None:
    with pytest.raises(ConfChangeError):
        enter_joint(CFG, change)


def test_conf_change_rejects_duplicates_and_empty() -> None:
    with pytest.raises(ConfChangeError):
        ConfChange()
    with pytest.raises(ConfChangeError):
        ConfChange(add_voters=n("n4"), add_learners=n("n4"))


@given(st.sets(st.sampled_from(n("n1", "n2", "n3", "n4", "n5")), min_size=1),
       st.sets(st.sampled_from(n("n1", "n2", "n3", "n4", "n5")), min_size=1))
def test_joint_quorums_intersect_both_halves(old: set[NodeId], new: set[NodeId]) -> None:
    """Any quorum of C_old,new contains a majority of C_old and of C_new."""
    old_cfg = Configuration(voters=tuple(sorted(old)))
    adds, removes = sorted(new - old), sorted(old - new)
    if not adds and not removes:
        return
    joint = enter_joint(old_cfg, ConfChange(add_voters=tuple(adds), remove_voters=tuple(removes)))
    jc = JointConfig.of(joint)
    for mask in range(1 << 5):
        members = [x for i, x in enumerate(n("n1", "n2", "n3", "n4", "n5")) if mask >> i & 1]
        if jc.has_quorum(members):
            assert sum(m in old for m in members) > len(old) // 2
            assert sum(m in new for m in members) > len(new) // 2


# ------------------------------------------------------------------------------ readonly


def req(k: str) -> ClientRequest:
    return ClientRequest(client_id="c", request_no=0, command=k.encode(), read_only=True)


def test_readonly_rounds_release_in_order() -> None:
    # Ref: §6.4: reads batched per round; a later ack confirms earlier rounds.
    ro = ReadOnly()
    quorum = JointConfig.of(CFG).has_quorum
    ro.add(req("a"))
    ro.add(req("b"))
    r1 = ro.start_round(index=5, context=1)
    assert r1 is not None
    assert len(r1.requests) == 2
    ro.add(req("c"))
    assert ro.start_round(index=6, context=2) is not None
    assert ro.ack(1, NodeId("n1"), quorum) == []
    released = ro.ack(2, NodeId("n2"), quorum) + ro.ack(2, NodeId("n1"), quorum)
    assert [(r.command, i) for r, i in released] == [(b"a", 5), (b"b", 5), (b"c", 6)]
    assert ro.pending() == 0
    assert ro.start_round(index=7, context=3) is None
    ro.add(req("d"))
    ro.start_round(index=7, context=4)
    ro.add(req("e"))
    with pytest.raises(ValueError, match="increase"):
        ro.start_round(index=7, context=4)

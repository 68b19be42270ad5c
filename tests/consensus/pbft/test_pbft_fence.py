"""Early votes and the view fence: pre-prepares and prepares leave before they are durable
(`Ready.early_messages`), and a replica restarted after losing the record of one never
contradicts it. With the ``no_view_fence`` deliberate bug it does, and these tests see it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pbft_harness import Cluster, req

from phalanx.consensus.core import Ready, Receive, Submit
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.pbft.bugs import UnfencedSafetyRules
from phalanx.consensus.pbft.messages import (
    Commit,
    PbftDurableState,
    Prepare,
    PrePrepare,
    SafetyData,
)
from phalanx.consensus.pbft.safety import SafetyRules, SafetyViolation
from phalanx.consensus.types import Message, NodeId


def _votes(msgs: list[Message] | tuple[Message, ...]) -> list[PrePrepare | Prepare]:
    return [m for m in msgs if isinstance(m, PrePrepare | Prepare)]


def _settled(bugs: frozenset[str] = frozenset()) -> Cluster:
    """A 4-replica cluster that ordered one request, so every replica's view-0 `early_view`
    record is durable (its votes now go early)."""
    c = Cluster(4, batch_size=1, bugs=bugs)
    c.submit_all(req("a", 0))
    c.deliver()
    assert all(c.app[i] == [b"a:0"] for i in c.ids)
    return c


def test_votes_go_early_once_the_view_is_recorded_and_commits_never_do() -> None:
    c = Cluster(4, batch_size=1)
    primary, backup = c.ids[0], c.ids[1]
    first = c.cores[primary].step(Submit(request=req("a", 0)))
    # The very first proposal waits for the early_view record it rides with.
    assert first.early_messages == ()
    assert [type(s.message) for s in first.messages] == [PrePrepare] * 3
    c.handle(primary, first)
    c.deliver()
    ready = c.cores[primary].step(Submit(request=req("b", 0)))
    assert [type(s.message) for s in ready.early_messages] == [PrePrepare] * 3
    assert ready.messages == ()
    assert ready.number == 0  # nothing to persist: the fence covers an early vote's record
    pp = ready.early_messages[0].message
    assert isinstance(pp, PrePrepare)
    c.handle(primary, ready)
    backup_ready = c.cores[backup].step(Receive(src=primary, message=pp))
    assert [type(s.message) for s in backup_ready.early_messages] == [Prepare] * 3
    c.handle(backup, backup_ready)
    sent: list[tuple[Ready, NodeId]] = []
    original = c.handle

    def spy(node: NodeId, r: Ready) -> None:
        sent.append((r, node))
        original(node, r)

    c.handle = spy  # type: ignore[method-assign]
    c.deliver()
    assert all(c.app[i] == [b"a:0", b"b:0"] for i in c.ids)
    commits_early = [s for r, _ in sent for s in r.early_messages if isinstance(s.message, Commit)]
    commits_late = [s for r, _ in sent for s in r.messages if isinstance(s.message, Commit)]
    assert commits_early == []
    assert commits_late


def _crash_primary_after_early_pre_prepare(c: Cluster) -> tuple[PrePrepare, NodeId]:
    """The primary proposes b:0 early; the pre-prepare reaches the backups; the primary dies
    before the Ready recording it is durable, and restarts from the older record."""
    primary = c.ids[0]
    ready = c.cores[primary].step(Submit(request=req("b", 0)))
    early = _votes([s.message for s in ready.early_messages])
    assert early
    assert isinstance(early[0], PrePrepare)
    c.crash(primary)  # the record of seq 2's pre-prepare never reached the disk
    c.net += [(primary, s.to, s.message) for s in ready.early_messages]  # but it left
    c.restart(primary)
    return early[0], primary


def test_restarted_primary_is_fenced_out_of_the_view_it_sent_early_votes_in() -> None:
    c = _settled()
    lost, primary = _crash_primary_after_early_pre_prepare(c)
    ready = c.cores[primary].step(Submit(request=req("c", 0)))
    assert _votes([s.message for s in ready.early_messages + ready.messages]) == []
    # It keeps quiet in view 0; the backups time out, a view change follows, and both
    # requests are ordered once each, identically everywhere.
    for i in c.ids[1:]:
        c.submit(i, req("c", 0))
    c.deliver()
    for _ in range(200):
        c.tick()
        c.deliver()
        if all(len(c.app[i]) >= 3 for i in c.ids):
            break
    assert all(c.cores[i].view >= 1 for i in c.ids)
    assert all(c.app[i][:3] == [b"a:0", b"b:0", b"c:0"] for i in c.ids)
    c.assert_agreement()
    assert lost.seq == 2


def test_no_view_fence_bug_makes_a_restarted_primary_equivocate() -> None:
    c = _settled(frozenset({"no_view_fence"}))
    lost, primary = _crash_primary_after_early_pre_prepare(c)
    ready = c.cores[primary].step(Submit(request=req("c", 0)))
    again = [v for v in _votes([s.message for s in ready.early_messages + ready.messages])
             if v.view == lost.view and v.seq == lost.seq]
    assert again
    assert all(v.digest != lost.digest for v in again)


def _crash_backup_after_early_prepare(c: Cluster) -> tuple[Prepare, NodeId, NodeId]:
    """A Byzantine primary (n0) sends a pre-prepare at seq 2 to backup n1, which prepares
    it early and dies before that is durable; n1 restarts from the older record and the
    primary sends it a conflicting pre-prepare for the same (view, seq)."""
    primary, backup = c.ids[0], c.ids[1]
    batch = (req("b", 0),)
    pp = PrePrepare(view=0, seq=2, digest=digest_of(c.crypto[primary], batch), batch=batch,
                    replica=primary)
    ready = c.cores[backup].step(Receive(src=primary, message=c.byz_sign(primary, pp)))
    early = _votes([s.message for s in ready.early_messages])
    assert len(early) == 3
    assert len(set(early)) == 1
    assert isinstance(early[0], Prepare)
    c.crash(backup)
    c.restart(backup)
    other = (req("x", 9),)
    conflicting = PrePrepare(view=0, seq=2, digest=digest_of(c.crypto[primary], other),
                             batch=other, replica=primary)
    c.step(backup, Receive(src=primary, message=c.byz_sign(primary, conflicting)))
    return early[0], primary, backup


def _byzantine_primary_cluster(bugs: frozenset[str]) -> Cluster:
    c = Cluster(4, batch_size=1, byzantine=(0,), bugs=bugs)
    primary = c.ids[0]
    batch = (req("a", 0),)
    pp = PrePrepare(view=0, seq=1, digest=digest_of(c.crypto[primary], batch), batch=batch,
                    replica=primary)
    for b in c.ids[1:]:
        c.inject(primary, b, c.byz_sign(primary, pp))
    c.deliver()
    assert all(c.app[i] == [b"a:0"] for i in c.ids[1:])
    c.byz_inbox.clear()
    return c


def test_restarted_backup_refuses_a_conflicting_prepare_in_a_fenced_view() -> None:
    c = _byzantine_primary_cluster(frozenset())
    lost, _primary, backup = _crash_backup_after_early_prepare(c)
    sent = _votes([m for s, _, m in c.net + c.byz_inbox if s == backup])
    assert [v for v in sent if v.seq == lost.seq] == []
    assert c.dropped(backup).get("safety_refused") == 1


def test_no_view_fence_bug_makes_a_restarted_backup_equivocate() -> None:
    c = _byzantine_primary_cluster(frozenset({"no_view_fence"}))
    lost, _primary, backup = _crash_backup_after_early_prepare(c)
    sent = [v for v in _votes([m for s, _, m in c.net + c.byz_inbox if s == backup])
            if v.seq == lost.seq and v.view == lost.view]
    assert sent
    assert all(v.digest != lost.digest for v in sent)


# ---------------------------------------------------------------------------------------------
# SafetyRules alone, under any schedule of opens, signs, persists and crashes.


@dataclass(frozen=True)
class _Op:
    name: str
    view: int = 0
    seq: int = 0
    digest: int = 0


_ops = st.lists(
    st.one_of(
        st.builds(_Op, name=st.just("open"), view=st.integers(0, 3)),
        st.builds(_Op, name=st.just("sign"), view=st.integers(0, 3), seq=st.integers(1, 3),
                  digest=st.integers(0, 2)),
        st.just(_Op("persist")),
        st.just(_Op("crash")),
    ),
    max_size=40,
)


def _run(ops: list[_Op], *, fence: bool) -> list[str]:
    """Drive SafetyRules like the core does (a vote of view v goes early only once the
    record `early_view == v` is durable; any other vote leaves only once its record is);
    return the equivocations among everything that left, across crashes."""
    signer = FastCrypto(NodeId("n1"))
    durable = SafetyData()
    rules = (SafetyRules if fence else UnfencedSafetyRules)(signer, durable)
    held: list[Prepare] = []  # signed, waiting for their record to be durable
    sent: dict[tuple[int, int], bytes] = {}
    problems: list[str] = []

    def send(p: Prepare) -> None:
        known = sent.setdefault((p.view, p.seq), p.digest)
        if known != p.digest:
            problems.append(f"two prepares at view {p.view} seq {p.seq}")

    for op in ops:
        if op.name == "open":
            rules.open_early(op.view)
        elif op.name == "persist":
            durable = rules.data
            for p in held:
                send(p)
            held = []
        elif op.name == "crash":
            rules = (SafetyRules if fence else UnfencedSafetyRules)(signer, durable)
            held = []
        else:
            vote = Prepare(view=op.view, seq=op.seq, digest=bytes([op.digest]),
                           replica=NodeId("n1"))
            early = durable.early_view == op.view == rules.early_view
            try:
                signed = rules.sign_prepare(vote, early=early)
            except SafetyViolation:
                continue
            if early:
                send(signed)
            else:
                held.append(signed)
    return problems


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_safety_rules_never_equivocate_across_crashes(ops: list[_Op]) -> None:
    assert _run(ops, fence=True) == []


def test_the_same_driver_equivocates_without_the_fence() -> None:
    ops = [_Op("open", view=1), _Op("persist"), _Op("sign", view=1, seq=1, digest=0),
           _Op("crash"), _Op("sign", view=1, seq=1, digest=1), _Op("persist")]
    assert _run(ops, fence=True) == []
    assert _run(ops, fence=False) == ["two prepares at view 1 seq 1"]


def test_fence_survives_a_second_restart_and_lifts_in_the_next_view() -> None:
    signer = FastCrypto(NodeId("n1"))
    rules = SafetyRules(signer, SafetyData())
    assert rules.open_early(2)
    again = SafetyRules(signer, SafetyRules(signer, rules.data).data)
    assert again.fenced(2)
    assert again.fenced(0)
    assert not again.fenced(3)
    with pytest.raises(SafetyViolation):
        again.sign_prepare(Prepare(view=2, seq=1, digest=b"d", replica=NodeId("n1")))
    assert not again.open_early(2)
    assert again.open_early(3)
    assert again.data.early_view == 3
    state = PbftDurableState(safety=again.data)
    assert state.safety.early_view == 3


def test_backup_times_out_on_a_request_it_learned_only_from_a_stuck_pre_prepare() -> None:
    # An early pre-prepare often beats the client's own copy of a request to a backup,
    # which then finds it already ordered (`RequestBook.known`) and ignores it. The backup
    # must still wait for it: if that batch never commits in this view, its timer is what
    # starts the view change (Castro-Liskov §4.4). Here prepares are lost.
    c = _settled()
    primary = c.ids[0]
    c.submit(primary, req("b", 0))
    c.filter = lambda s, d, m: not isinstance(m, Prepare)
    c.deliver()
    for i in c.ids[1:]:
        c.submit(i, req("b", 0))  # the client's copy, after the pre-prepare
        assert c.cores[i].status().pending_requests == 1
    c.filter = None
    c.tick(c.config(c.ids[1]).view_change_ticks + 1)
    c.deliver()
    for _ in range(50):
        if all(c.app[i] == [b"a:0", b"b:0"] for i in c.ids):
            break
        c.tick()
        c.deliver()
    assert all(c.cores[i].view >= 1 for i in c.ids)
    assert all(c.app[i] == [b"a:0", b"b:0"] for i in c.ids)


def test_backup_does_not_blame_the_primary_for_a_request_its_client_moved_past() -> None:
    # A request only this backup heard of (say it skipped the sequence number that executed
    # it) while the client's next request executes: the timer expiring finds it done, and
    # the backup stays in the view instead of leaving alone for a view nobody else wants.
    c = _settled()
    backup = c.ids[1]
    c.submit(backup, req("b", 0))
    c.submit_all(req("b", 1))
    c.deliver()
    assert all(c.app[i][-1] == b"b:1" for i in c.ids)
    assert c.cores[backup].status().pending_requests == 1
    c.tick(c.config(backup).view_change_ticks + 2)
    c.deliver()
    assert all(c.cores[i].view == 0 for i in c.ids)
    assert c.cores[backup].status().pending_requests == 0

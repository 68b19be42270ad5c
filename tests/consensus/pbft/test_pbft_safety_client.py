"""SafetyRules (no conflicting votes, also after a restart) and ReplyCollector (f+1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pbft_harness import Cluster, req

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.pbft import ReplyCollector, SafetyRules, SafetyViolation
from phalanx.consensus.pbft.messages import Prepare, PrePrepare
from phalanx.consensus.types import NodeId

ME = NodeId("n1")


def test_safety_rules_refuse_conflicts_and_repeat_identical() -> None:
    rules = SafetyRules(FastCrypto(ME))
    p = Prepare(view=0, seq=1, digest=b"a", replica=ME)
    first = rules.sign_prepare(p)
    assert rules.sign_prepare(p) == first
    with pytest.raises(SafetyViolation):
        rules.sign_prepare(Prepare(view=0, seq=1, digest=b"b", replica=ME))
    pp = PrePrepare(view=1, seq=1, digest=b"a", batch=(), replica=ME)
    rules.sign_pre_prepare(pp)
    with pytest.raises(SafetyViolation):
        rules.sign_pre_prepare(PrePrepare(view=1, seq=1, digest=b"c", batch=(), replica=ME))
    # A restart from the persisted record keeps refusing, and still repeats identically.
    restarted = SafetyRules(FastCrypto(ME), rules.data)
    with pytest.raises(SafetyViolation):
        restarted.sign_prepare(Prepare(view=0, seq=1, digest=b"b", replica=ME))
    assert restarted.sign_prepare(p) == first
    restarted.prune(1)
    with pytest.raises(SafetyViolation):
        restarted.sign_prepare(Prepare(view=0, seq=1, digest=b"a", replica=ME))


def test_restarted_backup_refuses_conflicting_pre_prepare() -> None:
    c = Cluster(4, byzantine=(0,), batch_size=1)
    byz, b = c.ids[0], c.ids[1]
    first = (req("a", 1),)
    pp = PrePrepare(view=0, seq=1, digest=digest_of(c.crypto[byz], first), batch=first, replica=byz)
    c.step(b, Receive(src=byz, message=c.byz_sign(byz, pp)))
    c.crash(b)
    c.restart(b)
    other = (req("b", 1),)
    pp2 = PrePrepare(
        view=0, seq=1, digest=digest_of(c.crypto[byz], other), batch=other, replica=byz
    )
    c.step(b, Receive(src=byz, message=c.byz_sign(byz, pp2)))
    assert c.dropped(b) == {"safety_refused": 1}


def test_reply_collector_needs_f_plus_one_matching() -> None:
    ids = tuple(NodeId(f"n{i}") for i in range(4))
    rc = ReplyCollector(ids)
    assert rc.needed == 2
    assert rc.add(ids[0], b"bad") is None
    assert rc.add(ids[0], b"ok") is None  # equivocation, counted
    assert rc.add(NodeId("x"), b"ok") is None  # not a replica
    assert rc.add(ids[1], b"ok") is None
    assert rc.add(ids[2], b"ok") == b"ok"
    assert rc.add(ids[3], b"bad") == b"ok"
    assert rc.dropped == {"equivocation": 1, "unknown_replica": 1}


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([b"x", b"y", b"z"]))))
def test_reply_collector_decides_only_with_f_plus_one_distinct(
    replies: list[tuple[int, bytes]],
) -> None:
    ids = tuple(NodeId(f"n{i}") for i in range(7))
    rc = ReplyCollector(ids)
    first: dict[int, bytes] = {}
    decided = None
    for i, r in replies:
        first.setdefault(i, r)
        out = rc.add(ids[i], r)
        if decided is not None:
            assert out == decided
        elif out is not None:
            decided = out
            assert sum(1 for v in first.values() if v == out) >= 3
    counts = {v: sum(1 for x in first.values() if x == v) for v in set(first.values())}
    assert (decided is not None) == any(n >= 3 for n in counts.values())

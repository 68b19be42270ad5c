"""One test per gap of the reference code (docs/LEADERLESS.md "Where this departs"); each
fails with the matching bug switch or the reference's behaviour."""

from __future__ import annotations

import sys

import pytest
from leaderless_harness import (
    EPOCH,
    KvApp,
    endorsement,
    make_tx,
    run,
    solo,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import (
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    VoteEcho,
    VoteReady,
)
from phalanx.consensus.leaderless.rules import Rules
from phalanx.consensus.leaderless.store import TxStore
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.types import NodeId

N2, N3, N4 = NodeId("n2"), NodeId("n3"), NodeId("n4")


def _applied_commands(app: KvApp) -> list[str]:
    return [f"{k}={v.decode()}" for k, v in app.data.items()]


@pytest.mark.parametrize("bug", [False, True])
def test_no_drop_on_commit(bug: bool) -> None:
    """n1 sees T' endorsed on condition T, then T commits. The reference drops T' at once;
    the other nodes, which endorse T' after applying T, commit it: n1 diverges. Here T'
    stays pending and commits on the later unconditional endorsements."""
    core, app = solo(bugs=frozenset({"drop_on_commit"}) if bug else frozenset())
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("set x a", reqs={"x": version(None)})
    t2 = make_tx("set x b", client="c2", reqs={"x": version(b"a")})
    for tx in (t, t2):
        run(core, app, Receive(src=N2, message=tx))
    run(core, app, Receive(src=N4, message=endorsement("n4", t2, (tx_id(t),))))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t)))
    assert app.data == {"x": b"a"}  # T committed and applied
    aborted = []
    for node in ("n2", "n3"):
        ready = run(core, app, Receive(src=NodeId(node), message=endorsement(node, t2)))
        aborted += ready.aborted
    ready = run(core, app, Tick(now_ms=EPOCH + 10))  # n1 endorses T' now that T applied
    if bug:
        assert app.data == {"x": b"a"}
        assert core.status().dropped_txs == 1
    else:
        assert app.data == {"x": b"b"}
        assert core.status().committed == 2
        assert core.status().dropped_txs == 0


@pytest.mark.parametrize("bug", [False, True])
def test_version_gate(bug: bool) -> None:
    """T2 (requires x = a) commits before T1 (sets x = a): the gate holds T2 until T1 is
    applied. Without it T2 applies first and T1 overwrites it."""
    core, app = solo(bugs=frozenset({"no_version_gate"}) if bug else frozenset())
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set x a", reqs={"x": version(None)})
    t2 = make_tx("set x b", client="c2", reqs={"x": version(b"a")})
    for tx in (t1, t2):
        run(core, app, Receive(src=N2, message=tx))
    for node in ("n2", "n3", "n4"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t2)))
    assert core.status().committed == 1
    if not bug:
        assert core.status().gated == 1
        assert app.data == {}
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t1)))
    run(core, app, Tick(now_ms=EPOCH + 10))
    assert core.status().committed == 2
    assert app.data == ({"x": b"a"} if bug else {"x": b"b"})


def _reference_applicable(store: TxStore, tx: TxId, q: int) -> bool:
    """The reference's isApplicable: recursion with no visited set."""
    record = store.records[tx]
    valid = sum(not any(_reference_applicable(store, c, q) for c in e.conditions)
                for e in record.endorsements.values())
    return valid >= q


def test_cycle() -> None:
    """Byzantine endorsers condition A on B and B on A: not applicable here (the reference
    recurses forever); the core neither commits, vetoes nor raises."""
    a = make_tx("add x 1", deadline=EPOCH + 100)
    b = make_tx("add y 1", client="c2", deadline=EPOCH + 100)
    # n1 endorses both (no conflict); three others endorse each on the other.
    core2, app2 = solo()
    run(core2, app2, Tick(now_ms=EPOCH))
    for tx, other in ((a, b), (b, a)):
        for node in ("n2", "n3", "n4"):
            e = endorsement(node, tx, (tx_id(other),))
            run(core2, app2, Receive(src=NodeId(node), message=tx))
            run(core2, app2, Receive(src=NodeId(node), message=e))
    rules: Rules = core2._rules
    store: TxStore = core2._store
    assert not rules.applicable(tx_id(a))
    assert not rules.applicable(tx_id(b))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        with pytest.raises(RecursionError):
            _reference_applicable(store, tx_id(a), 3)
    finally:
        sys.setrecursionlimit(old)
    assert core2._proof_of(tx_id(a)) is None


def _veto(voter: str, tx_ids: tuple[TxId, ...], proof: TransactionProof) -> VetoChoice:
    crypto = FastCrypto(NodeId(voter))
    body = VetoChoice(checkpoint=checkpoint_id(crypto, tx_ids), tx_ids=tx_ids,
                      voter=NodeId(voter), drop=False, proofs=(proof,))
    return VetoChoice(checkpoint=body.checkpoint, tx_ids=tx_ids, voter=NodeId(voter),
                      drop=False, proofs=(proof,), signature=crypto.sign(body))


def _deliver(core: LeaderlessCore, app: KvApp, vote: VetoChoice,
             peers: tuple[str, ...] = ("n2", "n3", "n4")) -> None:
    """Play the reliable broadcast of `vote` at `core`: the voter's SEND, then the ECHO
    and READY of every node in `peers`."""
    run(core, app, Receive(src=vote.voter, message=vote))
    digest = digest_of(FastCrypto(NodeId("n1")), vote)
    for node in peers:
        run(core, app, Receive(src=NodeId(node), message=VoteEcho(vote=vote)))
    for node in peers:
        run(core, app, Receive(src=NodeId(node), message=VoteReady(
            checkpoint=vote.checkpoint, voter=vote.voter, digest=digest)))


@pytest.mark.parametrize("forgery", ["same_endorser", "bad_signature", "too_few",
                                     "unsigned_tx"])
def test_forged_veto(forgery: str) -> None:
    """A veto whose proof does not verify is ignored: not echoed, never delivered (the
    reference keeps on any veto)."""
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    stuck = make_tx("set x a", reqs={"x": version(b"zz")}, deadline=EPOCH + 10)
    run(core, app, Receive(src=N2, message=stuck))
    ends = [endorsement(n, stuck) for n in ("n2", "n3", "n4")]
    tx: Transaction = stuck
    if forgery == "same_endorser":
        ends = [ends[0]] * 3
    elif forgery == "bad_signature":
        ends[2] = endorsement("n3", stuck).__class__(tx_id=ends[2].tx_id, endorser=N4,
                                                     signature=ends[1].signature)
    elif forgery == "too_few":
        ends = ends[:2]
    else:
        tx = stuck.__class__(**{**{f: getattr(stuck, f) for f in stuck.__dataclass_fields__},
                                "signature": b""})
    proof = TransactionProof(tx=tx, endorsements=tuple(ends))
    ids = (tx_id(stuck),)
    run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=ids)))
    ready = run(core, app, Receive(src=N2, message=_veto("n2", ids, proof)))
    assert not any(isinstance(s.message, VoteEcho) for s in ready.messages)
    assert core.status().dropped.get("veto_forged_veto") == 1
    assert core._checkpoints.blocked(tx_id(stuck))
    assert core.status().dropped_txs == 0


def test_conditional_proof_keeps_deterministically() -> None:
    """A veto whose Q endorsements are conditioned on a transaction committed here still
    keeps: a proof's validity must not depend on local state (another correct node may not
    have committed the condition, and both must judge the veto alike); keeping is not
    committing: the transaction is not committed on those endorsements."""
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    stuck = make_tx("set x a", reqs={"x": version(b"zz")}, deadline=EPOCH + 10)
    done = make_tx("add y 1", client="c2")
    for tx in (stuck, done):
        run(core, app, Receive(src=N2, message=tx))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, done)))
    assert core.status().committed == 1
    ends = tuple(endorsement(n, stuck, (tx_id(done),)) for n in ("n2", "n3", "n4"))
    ids = (tx_id(stuck),)
    run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=ids)))
    _deliver(core, app, _veto("n2", ids, TransactionProof(tx=stuck, endorsements=ends)))
    assert not core._checkpoints.blocked(tx_id(stuck))
    assert core.status().dropped.get("veto_forged_veto") is None
    assert core.status().committed == 1
    assert core.status().dropped_txs == 0


def test_gc_bounded() -> None:
    """Hundreds of transactions over time: the store, the tombstones and the durable record
    stay bounded by the horizon; a replay of a collected transaction is ignored."""
    core, app = solo(gc_horizon_ms=1000)
    now = EPOCH
    first = None
    sizes = []
    for i in range(300):
        now += 50
        run(core, app, Tick(now_ms=now))
        tx = make_tx(f"add k{i % 7} 1", no=i + 1, deadline=now + 200)
        first = first or tx
        run(core, app, Receive(src=N2, message=tx))
        for node in ("n2", "n3"):
            run(core, app, Receive(src=NodeId(node), message=endorsement(node, tx)))
        state = core.durable_state()
        sizes.append(len(state.decided) + len(state.committed) + len(state.endorsed))
    assert core.status().committed == 300
    assert max(sizes[100:]) <= 3 * (1000 + 200) // 50 + 6
    assert len(core._store.records) + len(core._store.tombstones) < 60
    assert first is not None
    run(core, app, Receive(src=N2, message=first))
    assert core.status().dropped.get("stale_tx") == 1
    assert app.applied() == 300


def test_veto_keeps_what_a_slow_node_committed() -> None:
    """n4 committed T; n1 saw too few endorsements, proposes dropping T and votes drop. n4's
    veto carries a proof that verifies: n1 keeps T, feeds the proof and commits it."""
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 10)
    run(core, app, Receive(src=N2, message=t))
    ids = (tx_id(t),)
    run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=ids)))
    assert core._checkpoints.blocked(tx_id(t))
    assert core.status().committed == 0
    proof = TransactionProof(tx=t, endorsements=tuple(endorsement(n, t)
                                                      for n in ("n2", "n3", "n4")))
    run(core, app, Receive(src=N4, message=_veto("n4", ids, proof)))
    assert core.status().committed == 0  # blocked until the veto is delivered
    _deliver(core, app, _veto("n4", ids, proof))
    assert core.status().committed == 1
    assert app.data == {"x": b"a"}
    assert core.status().dropped_txs == 0


def test_a_committed_transaction_is_vetoed_with_its_certificate() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=t))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t)))
    assert core.status().committed == 1
    ready = run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=(tx_id(t),))))
    votes = {s.message for s in ready.messages if isinstance(s.message, VetoChoice)}
    (vote,) = votes
    assert isinstance(vote, VetoChoice)
    assert not vote.drop
    (proof,) = vote.proofs
    assert proof == core.durable_state().committed[0]
    assert ready.must_sync

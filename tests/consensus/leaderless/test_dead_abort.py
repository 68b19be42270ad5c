"""A transaction a veto checkpoint KEPT while its conditional endorsements were alive, whose
condition then committed, must not stay pending for ever (issue 15 item 9, the veto-mode
bank run of seed 4: docs/LEADERLESS.md "Dead endorsements abort").

The shape, found in the run's durable records: T (a transfer) endorsed by every node on
condition of C (an older conflicting transfer, past its deadline); a checkpoint {T} decided
KEEP on a veto whose voter saw T applicable (C not applicable there); C then committed, so
every endorsement of T died. The veto mode never checkpoints an id again once a remembered
checkpoint kept it on its own proof, and a pending id keeps its checkpoint remembered: T
stayed pending at all four nodes, and every later transaction touching its keys (all the
bank reads) was endorsed on condition of it and dropped. The rule: n-Q+1+f distinct nodes
that refused T or endorsed it only on a condition committed here form an abort certificate
(`intake.py` `_check_certificate`); `no_dead_abort` (bugs.py) is the old rule."""

from __future__ import annotations

import pytest
from leaderless_harness import (
    EPOCH,
    REGISTRY,
    Cluster,
    endorsement,
    make_tx,
    run,
    solo,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Send, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import Transaction, TransactionProof
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


class HoldingCluster(Cluster):
    """The harness's cluster, plus: while `hold` is set, a message to n4 whose encoding
    contains one of `hold` (a transaction id, a checkpoint id) waits in `held`."""

    def __init__(self, **config: object) -> None:
        super().__init__(4, **config)
        self.hold: tuple[bytes, ...] = ()
        self.held: list[tuple[NodeId, Send]] = []

    def deliver(self, limit: int = 100_000) -> int:
        count = 0
        while self.net and count < limit:
            src, send = self.net.pop(self.rng.randrange(len(self.net)))
            if self.hold and send.to == N4 and any(
                    h in REGISTRY.encode(send.message) for h in self.hold):
                self.held.append((src, send))
                continue
            self.step(send.to, Receive(src=src, message=send.message))
            count += 1
        return count

    def release(self) -> None:
        self.hold = ()
        self.net += self.held
        self.held = []


def state(c: Cluster, node: NodeId, tx: Transaction) -> TxState | None:
    return c.nodes[node].core._store.state_of(tx_id(tx))


def own_proof(c: Cluster, tx: Transaction, nodes: tuple[NodeId, ...]) -> TransactionProof:
    """`tx` with the endorsement each of `nodes` holds of its own."""
    return TransactionProof(tx=tx, endorsements=tuple(
        c.nodes[n].core._store.records[tx_id(tx)].endorsements[n] for n in nodes))


def kept_then_dead(bugs: frozenset[str] = frozenset()) -> tuple[
        HoldingCluster, Transaction, Transaction]:
    """C and T conflict (puts of x from the empty version). Links cut: n1, n2 and n3 each
    endorse C alone and, past its deadline (each votes drop on {C}: blocked), T on
    condition of C. Healed, n4 hears nothing of C yet: it gets T's three endorsements, so
    T is applicable there, and when n1-n3 (where C, with its three endorsements, is
    applicable: T is not) checkpoint T, n4 vetoes: {T} is KEPT on T's own proof. Then n4
    hears of C, commits it (not blocked there) and vetoes {C} with its certificate: C
    commits everywhere, and every endorsement of T names it."""
    ids = (N1, N2, N3, N4)
    c = HoldingCluster(delta_old_ms=100, checkpoint_ticks=2,
                       bugs=dict.fromkeys(ids, bugs))
    c.tick()
    tc = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 900)
    c.cut = {(a, b) for a in ids for b in ids if a != b}
    c.submit(tc, to=(N1, N2, N3))
    c.tick(rounds=5)  # past C's deadline and delta_old: each votes drop on {C}
    c.submit(t, to=(N1, N2, N3))
    for node in (N1, N2, N3):
        record = c.nodes[node].core._store.get(tx_id(t))
        assert record is not None
        assert [e.conditions for e in record.endorsements.values()] == [(tx_id(tc),)]
    c.net.clear()
    c.cut.clear()
    c.hold = (tx_id(tc), checkpoint_id(FastCrypto(N1), (tx_id(tc),)))
    proof = own_proof(c, t, (N1, N2, N3))
    c.step(N4, Receive(src=N1, message=proof))
    c.deliver()
    c.tick(rounds=20)  # T expires; n1-n3 checkpoint it, n4 vetoes: KEEP
    assert {state(c, n, t) for n in ids} == {TxState.PENDING}
    assert {state(c, n, tc) for n in (N1, N2, N3)} == {TxState.PENDING}
    assert state(c, N4, tc) is None
    proof_c = own_proof(c, tc, (N1, N2, N3))
    c.release()
    c.step(N4, Receive(src=N1, message=proof_c))  # committed at n4, which is not blocked
    assert state(c, N4, tc) is TxState.COMMITTED
    c.tick(rounds=20)
    assert {state(c, n, tc) for n in ids} == {TxState.COMMITTED}
    return c, tc, t


@pytest.mark.parametrize("bugs", [(), ("no_dead_abort", "veto_no_rounds")])
def test_a_kept_transaction_whose_endorsements_died_is_aborted(bugs: tuple[str, ...]) -> None:
    """After C commits, T can never commit: each node drops it on the abort certificate of
    its dead endorsements (f+1 abort notices: the client records a definite fail), and a
    new put of x from C's version commits. Control: `no_dead_abort` (the rule before)
    leaves T pending at every node for good, and the new put, endorsed on condition of T
    everywhere, never commits, when the veto mode's rounds are off too (`veto_no_rounds`:
    since 2026-12-03 a round drops T as well, `test_veto_rounds.py`)."""
    c, _, t = kept_then_dead(frozenset(bugs))
    c.tick(rounds=100)
    wedged = bool(bugs)
    assert {state(c, n, t) for n in c.ids} == ({TxState.PENDING} if wedged
                                               else {TxState.DROPPED})
    if not wedged:
        assert sum(any(a.request.client_id == "c2" for a in c.nodes[n].aborted)
                   for n in c.ids) >= 2
    t3 = make_tx("set x c", client="c3", reqs={"x": version(b"a")}, deadline=c.now + 2000)
    c.submit(t3, to=c.ids)
    c.tick(rounds=60)
    if wedged:  # endorsed on condition of T everywhere: pending (T is never queued again)
        assert TxState.COMMITTED not in {state(c, n, t3) for n in c.ids}
    else:
        assert {state(c, n, t3) for n in c.ids} == {TxState.COMMITTED}
    assert {c.nodes[n].app.data.get("x") for n in c.ids} == {b"a" if wedged else b"c"}


def test_dead_endorsements_count_only_once_their_condition_committed() -> None:
    """One core (n1): T is endorsed on condition of C by n1 itself and n2, unconditionally by
    n3. While C is pending nothing is dead; once C commits, two dead endorsements are no
    certificate (3 at n = 4); n4's endorsement on condition of C makes three, and the next
    periodic pass drops T, long before its deadline. (`delta_old_ms` is long: C is not
    checkpointed meanwhile, which would block it at n1.)"""
    core, app = solo(delta_old_ms=10_000)
    run(core, app, Tick(now_ms=EPOCH))
    tc = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 10)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 50_000)
    run(core, app, Receive(src=N2, message=tc))  # n1 endorses C
    run(core, app, Tick(now_ms=EPOCH + 20))  # C expired, pending
    run(core, app, Receive(src=N2, message=t))  # n1 endorses T on condition of C
    for node, conditions in (("n2", (tx_id(tc),)), ("n3", ())):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t, conditions)))
    record = core._store.get(tx_id(t))
    assert record is not None
    assert sorted(e.conditions for e in record.endorsements.values()) == [
        (), (tx_id(tc),), (tx_id(tc),)]
    now = EPOCH + 20
    for _ in range(45):  # two full passes: C pending, nothing dead
        now += 10
        run(core, app, Tick(now_ms=now))
    assert core._store.state_of(tx_id(t)) is TxState.PENDING
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, tc)))
    assert core._store.state_of(tx_id(tc)) is TxState.COMMITTED
    for _ in range(45):  # two dead endorsements (n1, n2): no certificate
        now += 10
        run(core, app, Tick(now_ms=now))
    assert core._store.state_of(tx_id(t)) is TxState.PENDING
    run(core, app, Receive(src=N4, message=endorsement("n4", t, (tx_id(tc),))))
    aborted = []
    for _ in range(25):
        now += 10
        aborted += run(core, app, Tick(now_ms=now)).aborted
    assert core._store.state_of(tx_id(t)) is TxState.DROPPED
    assert [a.reason for a in aborted] == [
        "aborted: its endorsements name a committed transaction"]
    assert now < t.deadline_ms
    assert app.data == {"x": b"a"}

"""A transaction KEPT by the ordered resolution on endorsements that can never become valid
(all conditional on a transaction that committed) must not stay pending for ever (issue 15,
the pbft-mode bank wedge; docs/LEADERLESS.md "Ordered resolution", "Kept, then stuck")."""

from __future__ import annotations

import dataclasses

import pytest
from leaderless_harness import EPOCH, make_tx, tx_id, version
from test_leaderless_ordered_state import IDS, NODES, machine, sign
from test_leaderless_ordered_veto import N1, N2, N3, OrderedCluster, state

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import OrderedVote, OrderingSnapshot, Transaction
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.net import wire


def wedge(bugs: frozenset[str] = frozenset()) -> tuple[
        OrderedCluster, Transaction, Transaction]:
    """C and T conflict (puts of x from the empty version). Links cut: n1, n2 and n3 each
    endorse C alone (one endorsement each: C stays pending), then, past C's deadline, each
    endorses T conditionally on C. Healed: C reaches Q = 3 and commits everywhere; T holds
    Q endorsements, every one conditional on the committed C: it can never commit."""
    ids = ("n1", "n2", "n3", "n4")
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                       stuck_resolution="pbft", bugs=dict.fromkeys(ids, bugs))
    c.tick()
    tc = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 900)
    c.cut = {(a, b) for a in c.ids for b in c.ids if a != b}
    c.submit(tc, to=(N1, N2, N3))
    c.tick(rounds=5)  # past C's deadline and delta_old
    c.submit(t, to=(N1, N2, N3))
    for node in (N1, N2, N3):
        record = c.nodes[node].core._store.get(tx_id(t))
        assert record is not None
        assert [e.conditions for e in record.endorsements.values()] == [(tx_id(tc),)], node
    c.net.clear()  # what the cut links held is lost
    c.cut.clear()
    c.submit(tc, to=c.ids)  # the clients retry to every node
    c.submit(t, to=c.ids)
    c.deliver()
    return c, tc, t


@pytest.mark.parametrize(("bugs", "wedged"), [
    ((), False), (("no_dead_abort",), False), (("ordered_decided_once",), False),
    (("no_dead_abort", "ordered_decided_once"), True),
    (("no_dead_abort", "ordered_dead_evidence"), True)])
def test_a_transaction_endorsed_only_on_a_committed_condition_is_dropped(
        bugs: tuple[str, ...], wedged: bool) -> None:
    """One checkpoint holds C and T while C is still pending: both kept; C commits, T can
    never. A later round drops T (its votes leave out the dead endorsements), and the key
    is free again: a new put of x from C's version commits. Controls: without the rounds
    (`ordered_decided_once`, the rule before) or with the dead endorsements as evidence
    (`ordered_dead_evidence`: every round keeps T again) T stays pending at every node,
    when the abort certificate of dead endorsements is off too (`no_dead_abort`: since
    2026-12-03 T's three dead endorsements drop it at once, docs/LEADERLESS.md "Dead
    endorsements abort", so the rounds are tested with it off)."""
    c, tc, t = wedge(frozenset(bugs))
    c.tick(rounds=40)
    assert {state(c, n, tc) for n in c.ids} == {TxState.COMMITTED}
    c.tick(rounds=100)
    assert {state(c, n, t) for n in c.ids} == ({TxState.PENDING} if wedged
                                               else {TxState.DROPPED})
    if not wedged:  # f+1 abort notices: the client records a definite fail
        assert sum(any(a.request.client_id == "c2" for a in c.nodes[n].aborted)
                   for n in c.ids) >= 2
        t3 = make_tx("set x c", client="c3", reqs={"x": version(b"a")},
                     deadline=c.now + 5000)
        c.submit(t3, to=c.ids)
        c.tick(rounds=3)
        assert {state(c, n, t3) for n in c.ids} == {TxState.COMMITTED}
    assert {c.nodes[n].app.data.get("x") for n in c.ids} == {b"a" if wedged else b"c"}


def test_a_round_names_a_new_checkpoint_and_travels_on_the_wire() -> None:
    """Round r > 0 is a different checkpoint of the same ids (decided round 0 does not hide
    it), survives the wire codec and a snapshot; a vote naming the round-0 id with round 1,
    or a negative round, is invalid everywhere."""
    crypto = FastCrypto(NODES[0])
    cid0, cid1 = checkpoint_id(crypto, IDS), checkpoint_id(crypto, IDS, 1)
    assert cid0 != cid1
    state = machine()
    for rnd, cid in ((0, cid0), (1, cid1)):
        decisions = [state.execute(b"%d%s" % (rnd, n.encode()), sign(
            OrderedVote(checkpoint=cid, tx_ids=IDS, voter=n, round=rnd), n)) for n in NODES]
        assert [d is not None for d in decisions] == [False, False, False, True]
        assert state.decided(cid)
    vote = sign(OrderedVote(checkpoint=checkpoint_id(crypto, IDS, 2), tx_ids=IDS,
                            voter=NODES[0], round=2), NODES[0])
    assert wire.decode(wire.encode(vote)) == vote
    plain = OrderedVote(checkpoint=cid0, tx_ids=IDS, voter=NODES[0])
    assert wire.decode(wire.encode(plain)) == plain  # round 0 is not sent: old encodings
    assert len(wire.encode(plain)) < len(wire.encode(dataclasses.replace(plain, round=1)))
    state.execute(b"open", vote)
    snap = state.snapshot()
    assert [s.round for s in snap.open] == [2]
    assert wire.decode(wire.encode(snap), expected=OrderingSnapshot) == snap
    for bad in (dataclasses.replace(vote, checkpoint=cid0, round=1),
                dataclasses.replace(vote, round=-1)):
        assert state.execute(b"bad", sign(bad, NODES[0])) is None
    assert state.counts().get("ordered_bad_checkpoint_id") == 1
    assert state.counts().get("ordered_bad_id_list") == 1

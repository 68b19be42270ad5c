"""Rounds in the veto mode (issue 15 item 3; docs/LEADERLESS.md "Rounds in the veto mode").

A veto checkpoint KEEPs on one applicable proof, and KEEP only says "not dropped now": the
store commits the kept transaction only once its endorsements are definitely valid. Before
rounds, an id kept on its own proof was never checkpointed again while that checkpoint was
remembered (and a pending id keeps it remembered), so a transaction kept while applicable
at one voter, whose endorsements then became unusable without reaching the dead-endorsement
abort threshold, stayed pending for ever, and everything conflicting with it behind it.
Now a still-stuck id kept on its own proof goes out again in round r + 1 (a new checkpoint
name, `checkpoint_id(ids, r + 1)`) once the last decision naming it is
`retry_wait(period, r)` ticks old. `veto_no_rounds` (bugs.py) is the old rule."""

from __future__ import annotations

import dataclasses

import pytest
from leaderless_harness import EPOCH, REGISTRY, make_tx, tx_id, version
from test_dead_abort import N1, N2, N3, N4, HoldingCluster, kept_then_dead, own_proof, state
from veto_harness import PERIOD, Cluster, proof, restarted, signed, start, tid

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    StartCheckpoint,
    Transaction,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.leaderless.veto_votes import retry_wait


def cluster(*, no_rounds: bool = False) -> Cluster:
    return Cluster(4, no_rounds=no_rounds)


def kept_on_its_own_proof(c: Cluster) -> None:
    """Checkpoint {5} (round 0) kept everywhere on the proof of 5 that n2 holds."""
    c.proofs["n2"][tid(5)] = proof(5)
    start(c, [5])
    c.run()
    assert all(c.decided(node) == "keep" for node in c.nodes)


def rounds_started(c: Cluster) -> list[int]:
    """The rounds of the checkpoints of {5} started (first sends, not pulls), in order."""
    seen: list[int] = []
    for _, _, m in c.log:
        if isinstance(m, StartCheckpoint) and m.tx_ids == (tid(5),) and not m.delivered \
                and m.round not in seen:
            seen.append(m.round)
    return seen


def periods(c: Cluster, count: int) -> list[list[int]]:
    """`count` checkpoint periods, every node queueing 5 each (the core asks again every
    period while it stays stuck); the rounds started so far after each period."""
    out = []
    for _ in range(count):
        for node in c.nodes:
            c.machines[node].queue(tid(5))
        c.tick()
        c.run()
        out.append(rounds_started(c))
    return out


def test_a_kept_id_still_stuck_goes_out_in_the_next_round_and_is_dropped() -> None:
    """n2 no longer holds 5 applicable: after the wait (two periods) every node queues it
    in round 1, every vote is a drop, and 5 is dropped and blocked everywhere; the decision
    in the record names its round."""
    c = cluster()
    kept_on_its_own_proof(c)
    del c.proofs["n2"][tid(5)]
    seen = periods(c, 4)
    assert retry_wait(PERIOD, 0) == 2 * PERIOD
    assert seen[0] == [0]  # one period after the KEEP: not yet
    assert seen[-1] == [0, 1]
    for node in c.nodes:
        m = c.machines[node]
        assert c.dropped[node] == [tid(5)]
        assert m.blocked(tid(5))
        assert [(d.round, d.drop) for d in m.veto_decisions()] == [(0, False), (1, True)]
        assert {v.round for v in m.votes()} == {0, 1}


def test_a_holder_of_a_proof_keeps_every_round_and_the_wait_doubles() -> None:
    """Each round is an ordinary checkpoint: n2, still holding 5 applicable, vetoes and
    keeps it again; round r + 1 starts no sooner than 2 * 2^r periods after round r."""
    c = cluster()
    kept_on_its_own_proof(c)
    seen = periods(c, 18)
    first = {r: next(i for i, s in enumerate(seen) if r in s) for r in (1, 2, 3)}
    assert first[1] >= 1
    assert first[2] - first[1] >= retry_wait(PERIOD, 1) // PERIOD
    assert first[3] - first[2] >= retry_wait(PERIOD, 2) // PERIOD
    for node in c.nodes:
        assert c.dropped[node] == []
        assert [d.round for d in c.machines[node].veto_decisions()][:4] == [0, 1, 2, 3]


def test_control_no_rounds_never_checkpoints_it_again() -> None:
    c = cluster(no_rounds=True)
    kept_on_its_own_proof(c)
    del c.proofs["n2"][tid(5)]
    assert periods(c, 8)[-1] == [0]
    assert all(c.dropped[node] == [] for node in c.nodes)


def test_rounds_survive_a_restart() -> None:
    """Rounds 0 and 1 kept; every node restarts from its record (votes and decisions carry
    the round): the next checkpoint is round 2, not a round it decided, and drops 5."""
    c = cluster()
    kept_on_its_own_proof(c)
    seen = periods(c, 4)
    assert seen[-1] == [0, 1]
    for node in c.nodes:
        m = restarted(c, node)
        assert [d.round for d in m.veto_decisions()] == [0, 1]
        assert not m.blocked(tid(5))
    del c.proofs["n2"][tid(5)]
    c.log.clear()
    seen = periods(c, 6)
    assert seen[-1] == [2]
    assert all(c.dropped[node][-1:] == [tid(5)] for node in c.nodes)


def test_a_round_travels_on_the_wire_and_names_its_checkpoint() -> None:
    """Round 0 encodes as before (the field is left off); a vote or decision of round 1
    survives the codec; a vote naming the round-0 checkpoint with round 1, or a round out
    of range, is invalid everywhere (counted, never raised)."""
    ids = (tid(5),)
    crypto = FastCrypto("n0")
    assert checkpoint_id(crypto, ids, 1) != checkpoint_id(crypto, ids)
    plain = signed("n1", ids, drop=True)
    one = signed("n1", ids, drop=True, checkpoint=checkpoint_id(crypto, ids, 1))
    one = dataclasses.replace(one, round=1)
    one = dataclasses.replace(one, signature=FastCrypto("n1").sign(one))
    for msg in (plain, one, CheckpointDecision(tx_ids=ids, drop=True, round=7)):
        assert REGISTRY.decode(REGISTRY.encode(msg)) == msg
    assert len(REGISTRY.encode(plain)) < len(REGISTRY.encode(dataclasses.replace(plain, round=1)))
    c = cluster()
    m = c.machines["n0"]
    wrong = dataclasses.replace(plain, round=1)
    m.on_choice("n1", dataclasses.replace(wrong, signature=FastCrypto("n1").sign(wrong)),
                c.proof_of("n0"))
    m.on_choice("n1", dataclasses.replace(plain, round=-1), c.proof_of("n0"))
    m.on_start("n1", StartCheckpoint(tx_ids=ids, round=2**32), c.proof_of("n0"))
    assert m.dropped_counts() == {"bad_checkpoint_id": 1, "bad_round": 2}
    assert len(m) == 0
    m.on_choice("n1", one, c.proof_of("n0"))  # a valid round-1 vote: n0 votes in round 1
    assert [(v.round, v.checkpoint) for v in m.votes()] == [(1, one.checkpoint)]


# The cores --------------------------------------------------------------------------


def x_is_free(c: HoldingCluster, wedged: bool) -> None:
    """A new put of x from C's version: committed everywhere unless T still wedges x."""
    t3 = make_tx("set x c", client="c3", reqs={"x": version(b"a")}, deadline=c.now + 2000)
    c.submit(t3, to=c.ids)
    c.tick(rounds=60)
    if wedged:  # endorsed on condition of T everywhere: pending
        assert TxState.COMMITTED not in {state(c, n, t3) for n in c.ids}
    else:
        assert {state(c, n, t3) for n in c.ids} == {TxState.COMMITTED}
    assert {c.nodes[n].app.data.get("x") for n in c.ids} == {b"a" if wedged else b"c"}


@pytest.mark.parametrize("rounds", [True, False])
def test_a_kept_transaction_whose_endorsements_died_goes_again(rounds: bool) -> None:
    """`test_dead_abort.py`'s shape (T kept on n4's veto while C was unknown there; C then
    commits, so all three endorsements of T die) with the dead-endorsement abort off: the
    next round drops T everywhere (every node votes drop: T is applicable nowhere), and x is
    writable again. Control `veto_no_rounds`: T pending at every node for good."""
    bugs = frozenset({"no_dead_abort"} | (set() if rounds else {"veto_no_rounds"}))
    c, _, t = kept_then_dead(bugs)
    c.tick(rounds=100)
    assert {state(c, n, t) for n in c.ids} == ({TxState.DROPPED} if rounds
                                               else {TxState.PENDING})
    if rounds:
        reasons = {a.reason for n in c.ids for a in c.nodes[n].aborted
                   if a.request.client_id == "c2"}
        assert reasons == {"dropped by a checkpoint (veto procedure)"}
    x_is_free(c, wedged=not rounds)


def kept_with_a_liar(bugs: frozenset[str]) -> tuple[HoldingCluster, Transaction, Transaction]:
    """C and T conflict. Links cut: n1, n2, n3 each endorse C alone (and, past its deadline,
    vote drop on {C}: blocked); then n1 and n2 endorse T on condition of C, but n3, the
    Byzantine member (`endorse_despite_conflict`: it lies about its conditions), endorses T
    unconditionally. Healed, n4 hears nothing of C yet: it endorses T (unconditionally) and
    holds it applicable, so when n1-n3 (where C is applicable: T is not) checkpoint {T}, n4
    vetoes: KEPT on T's own proof. Then n4 commits C (its three endorsements) and vetoes {C}
    with the certificate: C commits everywhere. T's endorsements: two dead (n1, n2), below
    the abort certificate's three, and two live (n3, n4), below Q = 3: it can never commit,
    is applicable nowhere, and nothing aborts it but a checkpoint."""
    ids = (N1, N2, N3, N4)
    liar = frozenset({"endorse_despite_conflict"})
    c = HoldingCluster(delta_old_ms=100, checkpoint_ticks=2,
                       bugs={n: bugs | (liar if n == N3 else frozenset()) for n in ids})
    c.tick()
    tc = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 900)
    c.cut = {(a, b) for a in ids for b in ids if a != b}
    c.submit(tc, to=(N1, N2, N3))
    c.tick(rounds=5)
    c.submit(t, to=(N1, N2, N3))
    conditions = {n: [e.conditions for e in c.nodes[n].core._store.records[tx_id(t)]
                      .endorsements.values()] for n in (N1, N2, N3)}
    assert conditions == {N1: [(tx_id(tc),)], N2: [(tx_id(tc),)], N3: [()]}
    c.net.clear()
    c.cut.clear()
    c.hold = (tx_id(tc), checkpoint_id(FastCrypto(N1), (tx_id(tc),)))
    proof_t = own_proof(c, t, (N1, N2, N3))
    c.step(N4, Receive(src=N1, message=proof_t))
    c.deliver()
    c.tick(rounds=20)  # T expires; n1-n3 checkpoint it, n4 vetoes: KEEP
    assert {state(c, n, t) for n in ids} == {TxState.PENDING}
    assert state(c, N4, tc) is None
    proof_c = own_proof(c, tc, (N1, N2, N3))
    c.release()
    c.step(N4, Receive(src=N1, message=proof_c))
    assert state(c, N4, tc) is TxState.COMMITTED
    c.tick(rounds=20)
    assert {state(c, n, tc) for n in ids} == {TxState.COMMITTED}
    return c, tc, t


@pytest.mark.parametrize("rounds", [True, False])
def test_a_kept_transaction_below_the_dead_abort_threshold_goes_again(rounds: bool) -> None:
    """With the dead-endorsement abort ON (the default rules): two dead endorsements are no
    certificate, so only a round ends T; it drops T everywhere and x is free again.
    Control `veto_no_rounds` (the rule before): T pending at every node for good, and the
    new put of x behind it. Checked failing on the code before rounds (T pending)."""
    c, _, t = kept_with_a_liar(frozenset() if rounds else frozenset({"veto_no_rounds"}))
    c.tick(rounds=100)
    assert {state(c, n, t) for n in c.ids} == ({TxState.DROPPED} if rounds
                                               else {TxState.PENDING})
    for n in c.ids if not rounds else ():  # below the certificate for good
        record = c.nodes[n].core._store.get(tx_id(t))
        assert record is not None
        assert len(c.nodes[n].core._rules.dead(record)) == 2
    x_is_free(c, wedged=not rounds)


def test_the_durable_record_keeps_the_rounds() -> None:
    """T's rounds in every node's record: round 0 KEEP (n4's veto), round 1 KEEP again (C
    not yet committed at n4 when it voted), round 2 DROP; a restarted node (its record
    through the wire codec) is decided on them again: blocked on T."""
    c, _, t = kept_with_a_liar(frozenset())
    c.tick(rounds=100)
    for node in c.ids:
        durable = c.nodes[node].durable
        assert durable is not None
        decided = [(d.round, d.drop) for d in durable.veto_decisions or ()
                   if d.tx_ids == (tx_id(t),)]
        assert decided == [(0, False), (1, False), (2, True)], node
    c.restart(N2)
    assert c.nodes[N2].core._checkpoints.blocked(tx_id(t))
    assert REGISTRY.decode(REGISTRY.encode(c.nodes[N2].durable)) == c.nodes[N2].durable

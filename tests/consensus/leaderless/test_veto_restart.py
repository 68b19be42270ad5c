"""CheckpointMachine across restarts: a restored vote is never voted the other way, a node
without its record adopts its old vote echoed back (in full, or fetched by digest while
fenced), a restored vote must be the node's own, and a restored decision decides again at
once (no vote, no pull) even when every peer has collected the checkpoint."""

from __future__ import annotations

import pytest
from veto_harness import (
    BATCH,
    PERIOD,
    Cluster,
    nodes_of,
    proof,
    restarted,
    signed,
    start,
    tid,
    verifier,
)

from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    FetchVote,
    StartCheckpoint,
    VetoChoice,
    VoteBody,
    VoteEcho,
    VoteEchoDigest,
)
from phalanx.consensus.leaderless.veto import CheckpointMachine, VetoEffects
from phalanx.consensus.types import LocalProtocolError, NodeId


def test_restart_with_restored_votes_never_votes_the_other_way() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: t == "n3"  # keeps the checkpoint undecided
    ids = start(c, [1])
    c.run()
    before = c.machines["n1"].votes()
    assert len(before) == 1
    assert before[0].drop
    assert c.machines["n1"].relays()
    c.wire.clear()
    m = restarted(c, "n1")
    assert m.relays() == c.machines["n1"].relays()
    c.proofs["n1"][tid(1)] = proof(1)  # it now sees tx 1 applicable
    assert m.blocked(ids[0])
    assert m.votes() == before
    m.on_start("n0", StartCheckpoint(tx_ids=ids), c.proof_of("n1"))
    m.on_choice("n2", signed("n2", ids, drop=True), c.proof_of("n1"))
    c.tick()
    eff_votes = [msg for s, _, msg in c.log if s == "n1" and isinstance(msg, VetoChoice)]
    assert eff_votes
    assert all(v == before[0] for v in eff_votes)
    assert not c.persisted["n1"][1:]  # no new vote was signed


def test_restart_without_record_adopts_its_echoed_old_vote() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: t == "n3"
    ids = start(c, [1])
    c.run()
    old = c.machines["n1"].votes()[0]
    m = restarted(c, "n1", record=False)
    c.proofs["n1"][tid(1)] = proof(1)
    m.on_echo("n0", VoteEcho(vote=old), c.proof_of("n1"))  # its old vote, echoed back
    m.on_start("n0", StartCheckpoint(tx_ids=ids), c.proof_of("n1"))
    eff = m.drain()
    assert eff.votes == ()
    assert eff.sync  # the adopted vote must be persisted before anything is sent
    assert m.votes() == (old,)
    assert m.blocked(ids[0])


def test_restored_vote_must_be_own_undecided_vote() -> None:
    ids = (tid(1),)
    for bad in (signed("n2", ids, drop=True), signed("n1", ids, drop=False),
                signed("n1", ids, drop=True, proofs=(proof(1),))):
        with pytest.raises(LocalProtocolError):
            CheckpointMachine(node_id="n1", nodes=nodes_of(4), crypto=FastCrypto("n1"),
                              checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=verifier(4),
                              restored_votes=(bad,))


def test_a_fenced_node_adopts_its_old_vote_fetched_by_digest() -> None:
    """n0 lost its record (fenced: it votes, echoes and readies nothing). Echoes by digest
    carry no vote, so f+1 = 2 echoes of one digest in its own instance (one of them correct:
    its old vote) make it fetch that body from those echoers and adopt it, as a full echo
    used to: never a second, different vote of its own. A forged body is dropped."""
    c = Cluster(4)
    ids = (tid(1),)
    m = c.machines["n0"]
    m.fenced = True
    m.on_start("n1", StartCheckpoint(tx_ids=ids), c.proof_of("n0"))
    c.collect("n0")
    assert m.votes() == ()
    old = signed("n0", ids, drop=True)
    echo = VoteEchoDigest(checkpoint=old.checkpoint, voter="n0",
                          digest=digest_of(FastCrypto("n0"), old))
    m.on_relay("n1", echo, c.proof_of("n0"))
    assert not any(isinstance(s.message, FetchVote) for s in c.collect("n0").sends)  # f
    m.on_relay("n2", echo, c.proof_of("n0"))
    fetches = [s for s in c.collect("n0").sends if isinstance(s.message, FetchVote)]
    assert [s.to for s in fetches] == ["n1", "n2"]
    m.on_relay("n1", VoteBody(vote=signed("n0", ids, drop=False, proofs=(proof(1),))),
               c.proof_of("n0"))
    assert m.votes() == ()
    assert m.dropped_counts() == {"vote_body_mismatch": 1}
    m.on_relay("n2", VoteBody(vote=old), c.proof_of("n0"))
    assert m.votes() == (old,)


# Decisions in the durable record (docs/LEADERLESS.md "Decisions in the record") ----------


@pytest.mark.parametrize("outcome", ["keep", "drop"])
def test_a_restarted_decider_is_decided_again_though_every_peer_collected_it(
        outcome: str) -> None:
    """All four decide; then every peer but n1 collects the checkpoint (`gc`: its ids past
    the horizon) and, holding nothing of tx 5 any more, abstains when asked (`unprovable`),
    and n1 restarts from its record. Before the decision was in the record, n1's restored
    checkpoint came back undecided, its own drop vote blocking tx 5, and n1 pulled it every
    period for ever: nobody could deliver a vote again. Now it is decided again at once:
    the same drops or kept proof go to the core, no pull, no vote."""
    c = Cluster(4)
    if outcome == "keep":
        c.proofs["n2"][tid(5)] = proof(5)
    ids = start(c, [5])
    c.run()
    assert {c.decided(x) for x in c.nodes} == {outcome}
    decisions = c.machines["n1"].veto_decisions()
    assert [(d.tx_ids, d.drop, d.kept) for d in decisions] == [
        (ids, outcome == "drop", (proof(5),) if outcome == "keep" else ())]
    for node in ("n0", "n2", "n3"):
        c.machines[node].gc(lambda t: False)
        c.machines[node].unprovable = lambda t: True
    c.proofs["n2"].clear()
    c.dropped["n1"].clear()
    c.kept["n1"].clear()
    c.log.clear()
    signed_before = len(c.persisted["n1"])
    m = restarted(c, "n1")
    for _ in range(4):
        c.tick()
        c.run()
    assert c.decided("n1") == outcome
    assert c.kept["n1"] == ([proof(5)] if outcome == "keep" else [])
    assert c.dropped["n1"] == (list(ids) if outcome == "drop" else [])
    # KEEP: no longer blocked by its restored drop vote; DROP: blocked, decided DROP.
    assert m.blocked(ids[0]) == (outcome == "drop")
    assert not [msg for s, _, msg in c.log if s == "n1" and isinstance(msg, StartCheckpoint)]
    assert len(c.persisted["n1"]) == signed_before  # no second vote
    assert m.veto_decisions() == decisions


def test_a_decision_is_synced_at_once_and_collected_by_gc(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain that reports a decision asks for a synced save of the record (which then
    holds the decision) before its sends, and `gc` forgets the decision with its
    checkpoint."""
    c = Cluster(4)
    m = c.machines["n0"]
    syncs: list[bool] = []
    collect = c.collect

    def spy(node: NodeId) -> VetoEffects:
        eff = collect(node)
        if node == "n0" and eff.dropped:
            syncs.append(eff.sync)
        return eff
    monkeypatch.setattr(c, "collect", spy)
    ids = start(c, [2])
    c.run()
    assert c.dropped["n0"] == list(ids)
    assert syncs == [True]
    assert m.veto_decisions() == (CheckpointDecision(tx_ids=ids, drop=True),)
    assert m.veto_decisions() is m.veto_decisions()  # the same tuple until it changes (fast deltas)
    m.gc(lambda t: True)
    assert len(m.veto_decisions()) == 1
    m.gc(lambda t: False)
    assert m.veto_decisions() == ()


def test_restored_decision_must_be_well_formed() -> None:
    ids = (tid(1),)
    for bad in (CheckpointDecision(tx_ids=ids, drop=True, kept=(proof(1),)),
                CheckpointDecision(tx_ids=(), drop=True),
                CheckpointDecision(tx_ids=tuple(sorted((tid(1), tid(2)), reverse=True)),
                                   drop=True),
                CheckpointDecision(tx_ids=ids, drop=False, kept=(proof(9),))):
        with pytest.raises(LocalProtocolError):
            CheckpointMachine(node_id="n1", nodes=nodes_of(4), crypto=FastCrypto("n1"),
                              checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=verifier(4),
                              restored_decisions=(bad,))

"""CheckpointMachine: unanimity drop, verified veto keep (both only from reliably delivered
votes), pulls after loss, forgeries, equivocation, and agreement against an equivocating
voter (the old agreement gap, closed). Restarts: `test_veto_restart.py`; inputs, bounds, gc
and properties: `test_veto_bounds.py`; the set-up: `veto_harness.py`."""

from __future__ import annotations

import dataclasses

import pytest
from veto_harness import (
    BATCH,
    PERIOD,
    Cluster,
    about,
    nodes_of,
    proof,
    signed,
    start,
    tid,
    verifier,
)

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    StartCheckpoint,
    TransactionProof,
    VetoChoice,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
)
from phalanx.consensus.leaderless.veto import CheckpointMachine, VetoEffects
from phalanx.consensus.types import Message, NodeId

# Unanimity ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 7])
def test_drop_is_decided_on_all_n_votes(n: int) -> None:
    c = Cluster(n)
    ids = start(c, [1, 2])
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)
        # Decided DROP: blocked while remembered (no path may commit a dropped id).
        assert all(c.machines[node].blocked(t) for t in ids)
        # Decided: the vote stays in the durable record until gc (a lagging peer may
        # still ask; test_veto_lagging.py), then goes.
        assert c.machines[node].votes() == tuple(c.persisted[node])
        assert c.persisted[node]
        assert c.persisted[node][0].drop
        c.machines[node].gc(lambda t: False)
        assert c.machines[node].votes() == ()
        assert c.machines[node].relays() == ()
        assert c.machines[node].veto_decisions() == ()
        assert not c.machines[node].blocked(ids[0])  # collected: forgotten


def test_n_minus_1_votes_do_not_decide_and_one_silent_node_blocks() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: "n3" in (s, t)  # n3 crashed
    ids = start(c, [1])
    c.run()
    for _ in range(5):  # resends do not help while it stays silent (the liveness cost)
        c.tick()
        c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])
        assert [v.tx_ids for v in c.machines[node].votes()] == [ids]
    # It comes back: resent votes (and its own, on the StartCheckpoint it missed) decide.
    c.lose = lambda s, t, m: False
    c.tick()
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)
        assert c.machines[node].blocked(ids[0])  # now decided DROP


def test_pull_after_loss() -> None:
    c = Cluster(4)
    # Everything about n2's vote that is sent to n1 is lost.
    c.lose = lambda s, t, m: t == "n1" and about(m, "n2")
    ids = start(c, [7])
    c.run()
    assert c.decided("n1") is None
    assert c.decided("n0") == "drop"
    c.lose = lambda s, t, m: False
    c.tick()  # n1 pulls (StartCheckpoint again); its peers answer
    c.run()
    assert c.dropped["n1"] == list(ids)


def test_lost_start_checkpoint_a_vote_makes_the_node_vote() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: isinstance(m, StartCheckpoint)
    ids = start(c, [3])
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)


def test_a_vote_sent_to_one_node_only_blocks_like_silence() -> None:
    """n3 sends its drop vote to n0 only (and ignores pulls): it is never delivered, so
    nobody decides (no relayed certificate can decide for it any more)."""
    c = Cluster(4)
    c.lose = lambda s, t, m: (s == "n3" and isinstance(m, VetoChoice) and t != "n0") \
        or (s == "n3" and isinstance(m, VoteEcho | VoteReady))
    ids = start(c, [4])
    c.run()
    for _ in range(3):
        c.tick()
        c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])


def test_valid_veto_decides_keep_everywhere_and_no_vote_is_relayed() -> None:
    c = Cluster(4)
    p = proof(5)
    c.proofs["n2"][tid(5)] = p
    ids = start(c, [5, 6])
    c.run()
    for node in c.nodes:
        assert c.decided(node) == "keep"
        assert c.kept[node] == [p]
        assert not c.machines[node].blocked(ids[0])
    assert all(m.voter == s for s, _, m in c.log if isinstance(m, VetoChoice))


def test_a_node_holding_a_proof_never_lets_drop_be_decided() -> None:
    c = Cluster(7)
    c.proofs["n6"][tid(1)] = proof(1, 7)
    c.lose = lambda s, t, m: s == "n6"  # its veto (and all it says) is lost
    ids = start(c, [1])
    c.run()
    for _ in range(3):
        c.tick()
        c.run()
    for node in c.nodes[:6]:
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])


def forged_cases() -> dict[str, tuple[NodeId, VetoChoice, str]]:
    ids = (tid(1),)
    bad_proof = proof(1, endorsers=2)  # Q-1 endorsements
    other = proof(9)  # a genuine proof, of a transaction not in the checkpoint
    good = proof(1)
    return {
        "bad proof": ("n1", signed("n1", ids, drop=False, proofs=(bad_proof,)), "forged_veto"),
        "no proof": ("n1", signed("n1", ids, drop=False), "forged_veto"),
        "foreign proof": ("n1", signed("n1", ids, drop=False, proofs=(other,)), "forged_veto"),
        "bad signature": ("n1", dataclasses.replace(
            signed("n1", ids, drop=False, proofs=(good,)), signature=b"x" * 32), "bad_signature"),
        "wrong signer": ("n2", signed("n2", ids, drop=False, proofs=(good,), signer="n1"),
                         "bad_signature"),
        "relayed": ("n1", signed("n2", ids, drop=False, proofs=(good,)), "relayed_vote"),
        "voter not member": ("x9", signed("x9", ids, drop=False, proofs=(good,)),
                             "not_a_member"),
        "bad checkpoint id": ("n1", signed("n1", ids, drop=False, proofs=(good,),
                                           checkpoint=b"\x00" * 32), "bad_checkpoint_id"),
        "drop with proofs": ("n1", signed("n1", ids, drop=True, proofs=(good,)),
                             "bad_drop_vote"),
    }


@pytest.mark.parametrize("case", sorted(forged_cases()))
def test_forged_vote_is_counted_and_changes_nothing(case: str) -> None:
    src, forged, reason = forged_cases()[case]
    c = Cluster(4)
    ids = start(c, [1])
    c.wire.clear()  # nobody else hears of it yet
    m = c.machines["n0"]
    m.on_choice(src, forged, c.proof_of("n0"))
    m.on_echo(src, VoteEcho(vote=forged), c.proof_of("n0"))
    eff = c.collect("n0")
    assert eff == VetoEffects()  # neither echoed nor voted on
    assert m.dropped_counts() == {reason: 2 if reason != "relayed_vote" else 1}
    assert m.blocked(ids[0])
    # The genuine votes still decide (the others learn of the checkpoint from n0's pull,
    # and pull n0's vote a period later).
    for _ in range(2):
        c.tick()
        c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)


def test_duplicates_are_not_verified_again() -> None:
    calls: list[TransactionProof] = []
    verify = verifier(4)

    def counting(p: TransactionProof) -> bool:
        calls.append(p)
        return verify(p)
    m = CheckpointMachine(node_id="n0", nodes=nodes_of(4), crypto=FastCrypto("n0"),
                          checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=counting)
    ids = (tid(1),)
    m.on_start("n1", StartCheckpoint(tx_ids=ids), lambda _t: None)
    veto = signed("n3", ids, drop=False, proofs=(proof(1),))
    digest = digest_of(FastCrypto("n0"), veto)
    for _ in range(2):
        m.on_choice("n3", veto, lambda _t: None)
        for src in ("n1", "n2", "n3"):
            m.on_echo(src, VoteEcho(vote=veto), lambda _t: None)
            m.on_ready(src, VoteReady(checkpoint=veto.checkpoint, voter="n3", digest=digest))
    assert m.drain().kept == (proof(1),)
    assert len(calls) == 2  # on receipt, and once more for the decision


def test_equivocation_is_counted_first_choice_echoed() -> None:
    c = Cluster(4)
    ids = start(c, [1])
    c.wire.clear()
    m = c.machines["n0"]
    v1 = signed("n1", ids, drop=False, proofs=(proof(1),))
    v2 = signed("n1", ids, drop=False, proofs=(proof(1, endorsers=4),))
    for v in (v1, v2, signed("n1", ids, drop=True), v1):  # a plain duplicate is no lie
        m.on_choice("n1", v, c.proof_of("n0"))
    eff = c.collect("n0")
    echo = VoteEchoDigest(checkpoint=v1.checkpoint, voter=v1.voter,
                          digest=digest_of(FastCrypto("n0"), v1))
    assert [s.message for s in eff.sends] == [echo] * 3
    assert eff.kept == eff.dropped == ()
    assert m.dropped_counts() == {"equivocation": 2}


def exact_scenario(order: str, *, echo: bool) -> Cluster:
    """The bug found on a real cluster: n3 (Byzantine) holds a valid proof of T; n0, n1, n2
    vote drop; n3 sends its signed DROP to n1 and n2 and its signed VETO to n0 (and, when
    `echo`, echoes each of them as it sent it)."""
    c = Cluster(4)
    ids = (tid(1),)
    for node in ("n0", "n1", "n2"):
        c.machines[node].on_start("n2", StartCheckpoint(tx_ids=ids), c.proof_of(node))
        c.collect(node)
    drop3 = signed("n3", ids, drop=True)
    veto3 = signed("n3", ids, drop=False, proofs=(proof(1),))
    c.wire += [("n3", Send(to="n0", message=veto3)), ("n3", Send(to="n1", message=drop3)),
               ("n3", Send(to="n2", message=drop3))]
    if echo:
        c.wire += [("n3", Send(to=send.to, message=VoteEcho(vote=send.message)))
                   for _, send in c.wire[-3:] if isinstance(send.message, VetoChoice)]
    c.lose = lambda s, t, m: t == "n3"  # n3 ignores everything
    if order == "veto first":
        c.wire.sort(key=lambda item: not is_veto(item[1].message))
    elif order == "drops first":
        c.wire.sort(key=lambda item: is_veto(item[1].message))
    c.run()
    for _ in range(2):
        c.tick()
        c.run()
    return c


def is_veto(m: Message) -> bool:
    return isinstance(m, VetoChoice | VoteEcho) and not (
        m.drop if isinstance(m, VetoChoice) else m.vote.drop)


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("order", ["veto first", "drops first", "fifo"])
def test_equivocating_voter_cannot_split_honest_nodes(order: str, echo: bool) -> None:
    c = exact_scenario(order, echo=echo)
    decisions = {c.decided(node) for node in ("n0", "n1", "n2")}
    if echo:
        # n3's DROP reached two correct nodes: with n3's own echo that is a quorum of
        # echoes, so its delivered vote is the drop, everywhere; its veto never is.
        assert decisions == {"drop"}
    else:
        # Two echoes of each: n3's vote is never delivered (like a silent voter), so no
        # correct node decides; T stays blocked everywhere.
        assert decisions == {None}
        assert all(c.machines[x].blocked(tid(1)) for x in ("n0", "n1", "n2"))
    assert all(c.machines[x].dropped_counts().get("veto_after_drop") is None
               for x in c.nodes)


def test_a_node_that_sees_a_veto_before_voting_vetoes_too() -> None:
    c = Cluster(4)
    ids = (tid(1),)
    veto3 = signed("n3", ids, drop=False, proofs=(proof(1),))
    c.machines["n1"].on_choice("n3", veto3, c.proof_of("n1"))
    eff = c.collect("n1")
    assert [(v.voter, v.drop, v.proofs) for v in eff.votes] == [("n1", False, (proof(1),))]
    assert eff.kept == ()  # not delivered yet
    c.lose = lambda s, t, m: t == "n3"
    c.run()
    c.tick()
    c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) == "keep"

"""The veto procedure's agreement, end to end in an in-process cluster of leaderless cores:
the equivocating-endorser scenario found on a real cluster (honest replicas diverged for
good before votes travelled by reliable broadcast), and restarts that keep echo choices and
decisions."""

from __future__ import annotations

import pytest
from leaderless_harness import EPOCH, Cluster, endorsement, make_tx, tx_id, version

from phalanx.consensus.core import Ready, Receive, Send, Tick
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    LeaderlessDurableState,
    StartCheckpoint,
    TransactionProof,
    VetoChoice,
    VoteDigestBatch,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.types import Message, NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))
HONEST = (N1, N2, N3)


def signed_vote(voter: NodeId, vote: VetoChoice) -> VetoChoice:
    body = VetoChoice(checkpoint=vote.checkpoint, tx_ids=vote.tx_ids, voter=voter,
                      drop=vote.drop, proofs=vote.proofs)
    return VetoChoice(checkpoint=body.checkpoint, tx_ids=body.tx_ids, voter=voter,
                      drop=body.drop, proofs=body.proofs, signature=FastCrypto(voter).sign(body))


def stuck_checkpoint(**config: object) -> tuple[Cluster, TransactionProof]:
    """n1 and n3 endorse T (so no abort certificate can end it); n2 never hears of it in
    time; n4 (played by the test, Byzantine) endorses it too but tells no one. T expires
    with 2 < Q endorsements known to the correct nodes: they checkpoint it and vote drop,
    while n4 holds a valid proof (Q real endorsements)."""
    c = Cluster(4, delta_old_ms=100, checkpoint_ticks=2, **config)
    c.down.add(N4)  # n4's inbox is ignored; the test sends in its name
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    c.cut |= {(N1, N2), (N3, N2)}
    c.submit(t, to=(N1, N3))
    c.deliver()
    c.cut.clear()
    own = [c.nodes[x].core.durable_state().endorsed for x in (N1, N3)]
    assert all(len(e) == 1 for e in own)
    proof = TransactionProof(tx=t, endorsements=(*own[0], own[1][0], endorsement("n4", t)))
    for _ in range(12):
        c.tick()
        if all(c.nodes[x].durable is not None and c.nodes[x].durable.votes for x in HONEST):
            break
    for x in HONEST:
        (vote,) = c.nodes[x].durable.votes  # type: ignore[union-attr]
        assert vote.drop
        assert vote.tx_ids == (tx_id(t),)
        assert c.nodes[x].core.status().committed == 0
    return c, proof


@pytest.mark.parametrize("echo", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_equivocating_voter_with_a_real_proof_cannot_split_correct_nodes(
        echo: bool, seed: int) -> None:
    """n4 sends its signed DROP to n2 and n3 and its signed VETO (valid proof) to n1, and
    (when `echo`) echoes each as it sent it. Before, n2 and n3 dropped T while n1 kept and
    committed it. Now every correct node ends with the same outcome."""
    c, proof = stuck_checkpoint()
    c.rng.seed(seed)
    ids = (tx_id(proof.tx),)
    base = VetoChoice(checkpoint=checkpoint_id(FastCrypto(N4), ids), tx_ids=ids, voter=N4,
                      drop=True)
    drop = signed_vote(N4, base)
    veto = signed_vote(N4, VetoChoice(checkpoint=base.checkpoint, tx_ids=ids, voter=N4,
                                      drop=False, proofs=(proof,)))
    for to, vote in ((N1, veto), (N2, drop), (N3, drop)):
        c.net.append((N4, Send(to=to, message=vote)))
        if echo:
            c.net.append((N4, Send(to=to, message=VoteEcho(vote=vote))))
    c.tick(rounds=10)
    states = {c.nodes[x].core._store.state_of(ids[0]) for x in HONEST}
    committed = {x for x in HONEST if c.nodes[x].core.status().committed}
    assert not committed  # n1 used to commit T here
    if echo:
        # n4's DROP has a quorum of echoes (n2, n3, n4): delivered everywhere, with the
        # three correct drop votes that is unanimity: T is dropped at every correct node.
        assert states == {TxState.DROPPED}
    else:
        # Neither of n4's votes is ever delivered: like a silent voter, it blocks the drop
        # (n2 may not even know T).
        assert states <= {TxState.PENDING, None}
        assert all(c.nodes[x].core._checkpoints.blocked(ids[0]) for x in HONEST)
    assert all(c.nodes[x].app.data == {} for x in HONEST)


def vote_messages(c: Cluster, node: NodeId, ready: Ready, batch: int) -> list[Message]:
    """The messages of n4's vote broadcast that `ready` sends (SENDs, echoes, readies),
    each echo and ready alone; batched (`batch` = `vote_batch_ticks` = 1), those of the
    next tick's `VoteDigestBatch`es (the core's own flush) instead."""
    msgs = [s.message for s in ready.messages]
    if batch:
        msgs += [s.message for s in c.step(node, Tick(now_ms=c.now)).messages]
    out: list[Message] = []
    for m in msgs:
        if isinstance(m, VoteDigestBatch):
            out += [VoteEchoDigest(checkpoint=m.checkpoint, voter=v, digest=d)
                    for v, d in zip(m.echo_voters, m.echo_digests, strict=True) if v == N4]
            out += [VoteReady(checkpoint=m.checkpoint, voter=v, digest=d)
                    for v, d in zip(m.ready_voters, m.ready_digests, strict=True) if v == N4]
        elif (isinstance(m, VetoChoice | VoteReady | VoteEchoDigest) and m.voter == N4) or (
                isinstance(m, VoteEcho) and m.vote.voter == N4):
            out.append(m)
    return out


def echo_of(vote: VetoChoice) -> VoteEchoDigest:
    return VoteEchoDigest(checkpoint=vote.checkpoint, voter=vote.voter,
                          digest=digest_of(FastCrypto(N4), vote))


@pytest.mark.parametrize("batch", [0, 1])
def test_a_restarted_node_never_echoes_another_value(batch: int) -> None:
    """n2 echoed n4's DROP and crashed; after the restart (from its durable record, through
    the wire codec) n4 sends it the VETO: n2 neither echoes nor readies it. Alone or
    batched (`vote_batch_ticks`)."""
    c, proof = stuck_checkpoint(vote_batch_ticks=batch)
    ids = (tx_id(proof.tx),)
    cid = checkpoint_id(FastCrypto(N4), ids)
    drop = signed_vote(N4, VetoChoice(checkpoint=cid, tx_ids=ids, voter=N4, drop=True))
    veto = signed_vote(N4, VetoChoice(checkpoint=cid, tx_ids=ids, voter=N4, drop=False,
                                      proofs=(proof,)))
    ready = c.step(N2, Receive(src=N4, message=drop))
    assert ready.must_sync
    assert ready.core_state is not None
    assert any(r.voter == N4 and r.echo for r in ready.core_state.relays)
    assert vote_messages(c, N2, ready, batch) == [echo_of(drop)] * 3
    c.net.clear()
    c.restart(N2)
    ready = c.step(N2, Receive(src=N4, message=veto))
    sent = vote_messages(c, N2, ready, batch)
    ready = c.step(N2, Receive(src=N1, message=VoteEcho(vote=veto)))
    sent += vote_messages(c, N2, ready, batch)
    ready = c.step(N2, Receive(src=N3, message=echo_of(veto)))
    sent += vote_messages(c, N2, ready, batch)
    assert echo_of(veto) not in sent
    assert not any(isinstance(m, VoteReady) and m.digest == echo_of(veto).digest for m in sent)
    # Pulled, it answers with nothing of the veto, and with its old echo by digest: the
    # content it lost in the crash is not needed for that.
    ready = c.step(N2, Receive(src=N1, message=StartCheckpoint(tx_ids=ids, delivered=(N1,))))
    answers = vote_messages(c, N2, ready, batch)
    assert echo_of(veto) not in answers
    assert echo_of(drop) in answers


def test_a_decision_is_synced_with_its_drop_and_decided_again_after_a_restart() -> None:
    """n4 votes drop too (sent and echoed to every correct node): T is dropped everywhere,
    the Ready that decides carries the decision in its record and asks for a sync; n2,
    restarted from that record through the wire codec, is decided again at once (the
    decision re-applied: T stays dropped) and never pulls the checkpoint again."""
    c, proof = stuck_checkpoint()
    ids = (tx_id(proof.tx),)
    cid = checkpoint_id(FastCrypto(N4), ids)
    drop = signed_vote(N4, VetoChoice(checkpoint=cid, tx_ids=ids, voter=N4, drop=True))
    for to in HONEST:
        c.net += [(N4, Send(to=to, message=drop)), (N4, Send(to=to, message=VoteEcho(vote=drop)))]
    c.tick(rounds=10)
    decision = CheckpointDecision(tx_ids=ids, drop=True)
    for x in HONEST:
        node = c.nodes[x]
        assert node.core._store.state_of(ids[0]) is TxState.DROPPED
        assert node.durable is not None
        assert node.durable.veto_decisions == (decision,)
        first = next(r for r in node.readys if isinstance(r.core_state, LeaderlessDurableState)
                     and r.core_state.veto_decisions)
        assert first.must_sync
    c.restart(N2)
    assert c.nodes[N2].core._checkpoints.veto_decisions() == (decision,)
    c.net.clear()
    for _ in range(6):
        c.step(N2, Tick(now_ms=c.now))
    assert c.nodes[N2].core._store.state_of(ids[0]) is TxState.DROPPED
    assert not [s for s in c.net if isinstance(s[1].message, StartCheckpoint)]

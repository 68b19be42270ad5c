"""The batched reliable broadcast of veto votes (`VoteDigestBatch`, `vote_batch_ticks`): each
item of a batch counts for its own instance and sender, exactly as the lone echo or ready it
stands for; a bad item is dropped and counted without the good ones; a node sends one batch
per peer, checkpoint and flush; batched and unbatched clusters decide alike; an older
node's full-vote `VoteBatch` still counts."""

from __future__ import annotations

import dataclasses

import pytest

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    FetchVote,
    StartCheckpoint,
    Transaction,
    TxId,
    VetoChoice,
    VoteBatch,
    VoteBody,
    VoteDigestBatch,
    VoteEchoDigest,
    VoteReady,
    transaction_id,
)
from phalanx.consensus.leaderless.reliable_broadcast import MAX_BATCH_ITEMS
from phalanx.consensus.leaderless.veto import CheckpointMachine, checkpoint_id
from phalanx.consensus.types import NodeId

CRYPTO = FastCrypto("n0")
TX = Transaction(client="c", client_id="c", request_no=1, deadline_ms=1_000,
                 requirements=(), command=b"x")
IDS: tuple[TxId, ...] = (transaction_id(TX, CRYPTO.encode),)
CID = checkpoint_id(CRYPTO, IDS)


def nodes_of(n: int) -> tuple[NodeId, ...]:
    return tuple(NodeId(f"n{i}") for i in range(n))


def drop_vote(voter: str, *, signer: str | None = None) -> VetoChoice:
    v = VetoChoice(checkpoint=CID, tx_ids=IDS, voter=NodeId(voter), drop=True)
    return dataclasses.replace(v, signature=FastCrypto(signer or voter).sign(v))


def ready_for(vote: VetoChoice) -> VoteReady:
    return VoteReady(checkpoint=vote.checkpoint, voter=vote.voter,
                     digest=digest_of(CRYPTO, vote))


def batch_of(echoes: tuple[VetoChoice, ...] = (),
             readies: tuple[VetoChoice, ...] = ()) -> VoteDigestBatch:
    """The batch of a node that echoes `echoes` and readies `readies` (by digest)."""
    return VoteDigestBatch(checkpoint=CID, echo_voters=tuple(v.voter for v in echoes),
                           echo_digests=tuple(digest_of(CRYPTO, v) for v in echoes),
                           ready_voters=tuple(v.voter for v in readies),
                           ready_digests=tuple(digest_of(CRYPTO, v) for v in readies))


def machine(node: str = "n0", n: int = 4, batch_ticks: int = 1,
            period: int = 1_000) -> CheckpointMachine:
    """A node's machine; `period` (checkpoint_ticks) long by default: no pulls."""
    return CheckpointMachine(node_id=NodeId(node), nodes=nodes_of(n), crypto=FastCrypto(node),
                             checkpoint_ticks=period, batch=4, verify_proof=lambda _p: False,
                             vote_batch_ticks=batch_ticks)


def no_proof(_t: TxId) -> None:
    return None


def flushed(m: CheckpointMachine) -> list[Send]:
    """What `m` sends on its next tick (its batches), after draining what was pending."""
    m.drain()
    m.tick(no_proof)
    return list(m.drain().sends)


def test_each_item_counts_for_its_own_broadcast() -> None:
    """n = 4, f = 1: READY on Q = 3 echoes or f+1 = 2 readies, DELIVER on 2f+1 = 3 readies.
    Items of different instances share batches; each must move only its own instance."""
    m = machine()
    v1, v2, v3 = drop_vote("n1"), drop_vote("n2"), drop_vote("n3")
    m.on_choice(NodeId("n1"), v1, no_proof)  # n1's SEND: n0 votes (v0) and echoes v1
    (first,) = {s.message for s in flushed(m)}  # one object, the same for every peer
    assert isinstance(first, VoteDigestBatch)
    assert first.echo_voters == ("n0", "n1")
    assert first.echo_digests[1] == digest_of(CRYPTO, v1)  # digests, not votes
    assert first.ready_voters == ()
    # n2 and n3 send v2's and v3's SENDs (the bodies); n2 echoes v2 and v3 and readies v1;
    # n3 echoes v3 and readies v1.
    m.on_choice(NodeId("n2"), v2, no_proof)
    m.on_choice(NodeId("n3"), v3, no_proof)
    flushed(m)  # n0's own echoes of v2 and v3
    m.on_relay(NodeId("n2"), batch_of(echoes=(v2, v3), readies=(v1,)), no_proof)
    m.on_relay(NodeId("n3"), batch_of(echoes=(v3,), readies=(v1,)), no_proof)
    # v1: 2 readies (f+1) -> READY v1; v3: echoes n0, n2, n3 = Q -> READY v3; v2: 2.
    (batch,) = {s.message for s in flushed(m)}
    assert isinstance(batch, VoteDigestBatch)
    assert batch.echo_voters == ()
    assert batch.ready_voters == ("n3", "n1")  # in n3's batch, echoes before readies
    # v2's third echo (n1's) completes Q = 3 for v2 only.
    m.on_relay(NodeId("n1"), batch_of(echoes=(v2,)), no_proof)
    (batch,) = {s.message for s in flushed(m)}
    assert isinstance(batch, VoteDigestBatch)
    assert batch.ready_voters == ("n2",)
    # DROP needs all four votes delivered (3 readies each): v1 is (n0, n2, n3); v2 and v3
    # have 1 (n0's), v0 none.
    assert m.drain().dropped == ()
    v0 = m.votes()[0]
    m.on_relay(NodeId("n1"), batch_of(readies=(v0, v2, v3)), no_proof)
    assert m.drain().dropped == ()  # v0: 1 ready (n0 readies on f+1 = 2); v2, v3: 2
    m.on_relay(NodeId("n2"), batch_of(readies=(v0, v2, v3)), no_proof)
    # v0: 2 readies = f+1, so n0 readies it too: 3; v2, v3: 3. All four delivered.
    assert m.drain().dropped == IDS
    assert m.dropped_counts() == {}


def test_a_bad_item_is_dropped_and_counted_and_the_good_ones_count() -> None:
    m = machine()
    v1, v2 = drop_vote("n1"), drop_vote("n2")
    m.on_choice(NodeId("n1"), v1, no_proof)
    flushed(m)
    good = batch_of(echoes=(v1,), readies=(v2,))
    bad = dataclasses.replace(good, echo_voters=("n9", *good.echo_voters),
                              echo_digests=(b"x", *good.echo_digests),
                              ready_voters=(b"junk", *good.ready_voters),  # type: ignore[arg-type]
                              ready_digests=(b"y", *good.ready_digests))
    m.on_relay(NodeId("n2"), bad, no_proof)
    m.on_relay(NodeId("n3"), good, no_proof)
    (batch,) = {s.message for s in flushed(m)}
    assert isinstance(batch, VoteDigestBatch)
    # v1: echoes n0 (its own), n2, n3 -> 3 = Q; v2: 2 readies = f+1.
    assert batch.ready_voters == ("n1", "n2")
    assert m.dropped_counts() == {"not_a_member": 1, "bad_vote_batch_item": 1}


@pytest.mark.parametrize("how", ["echoes", "readies", "unequal", "not_tuples"])
def test_an_oversized_or_malformed_batch_is_dropped_whole(how: str) -> None:
    m = machine()
    v1 = drop_vote("n1")
    m.on_choice(NodeId("n1"), v1, no_proof)
    flushed(m)
    one = batch_of(echoes=(v1,), readies=(v1,))
    big = MAX_BATCH_ITEMS + 1
    bad = {"echoes": dataclasses.replace(one, echo_voters=one.echo_voters * big,
                                         echo_digests=one.echo_digests * big),
           "readies": dataclasses.replace(one, ready_voters=one.ready_voters * big,
                                          ready_digests=one.ready_digests * big),
           "unequal": dataclasses.replace(one, echo_digests=()),
           "not_tuples": dataclasses.replace(one, echo_voters=["n1"]),  # type: ignore[arg-type]
           }[how]
    m.on_relay(NodeId("n2"), bad, no_proof)
    assert m.dropped_counts() == {"bad_vote_batch": 1}
    assert flushed(m) == []  # nothing of it counted


def test_answers_to_a_pull_go_in_that_peers_batch_only() -> None:
    m = machine()
    v1 = drop_vote("n1")
    m.on_choice(NodeId("n1"), v1, no_proof)
    flushed(m)
    m.on_start(NodeId("n2"), StartCheckpoint(tx_ids=IDS, delivered=()), no_proof)
    sends = flushed(m)
    assert [s.to for s in sends] == ["n2"]
    (batch,) = (s.message for s in sends)
    assert isinstance(batch, VoteDigestBatch)
    assert sorted(batch.echo_voters) == ["n0", "n1"]


def test_unbatched_mode_sends_each_echo_alone() -> None:
    m = machine(batch_ticks=0)
    m.on_choice(NodeId("n1"), drop_vote("n1"), no_proof)
    sent = [s.message for s in m.drain().sends]
    assert sum(isinstance(x, VoteEchoDigest) for x in sent) == 6  # own vote and v1, to 3 peers
    assert not any(isinstance(x, VoteDigestBatch) for x in sent)
    m.tick(no_proof)
    assert not any(isinstance(s.message, VoteDigestBatch) for s in m.drain().sends)


def test_an_older_nodes_full_vote_batch_still_counts() -> None:
    """A `VoteBatch` (wire 311: echoes carrying the votes) from a node not yet upgraded:
    each echo counts as the sender's echo and brings the content."""
    m = machine()
    v1 = drop_vote("n1")
    m.on_start(NodeId("n2"), StartCheckpoint(tx_ids=IDS), no_proof)
    flushed(m)
    for src in ("n2", "n3"):
        m.on_batch(NodeId(src), VoteBatch(echoes=(v1,), readies=(ready_for(v1),)), no_proof)
    m.on_batch(NodeId("n1"), VoteBatch(readies=(ready_for(v1),)), no_proof)
    # v1: 2 echoes (< Q), 3 readies: n0 readies on f+1 and delivers on 2f+1, holding the
    # content from the full echoes (n1's SEND never came).
    (batch,) = {s.message for s in flushed(m)}
    assert isinstance(batch, VoteDigestBatch)
    assert batch.ready_voters == ("n1",)
    assert m.dropped_counts() == {}


def run_cluster(n: int, batch_ticks: int) -> tuple[dict[NodeId, tuple[TxId, ...]], int]:
    """Node n0 starts a checkpoint of IDS; every node votes drop. Ticks and FIFO delivery
    until quiet: (what each node dropped, how many vote-broadcast messages were sent)."""
    ms = {x: machine(x, n, batch_ticks, period=3) for x in nodes_of(n)}
    wire: list[tuple[NodeId, Send]] = []
    dropped: dict[NodeId, tuple[TxId, ...]] = {x: () for x in ms}
    counted = 0

    def collect(x: NodeId) -> None:
        nonlocal counted
        eff = ms[x].drain()
        dropped[x] += eff.dropped
        wire.extend((x, s) for s in eff.sends)
        counted += sum(isinstance(s.message, VetoChoice | VoteEchoDigest | VoteReady
                                  | VoteDigestBatch | FetchVote | VoteBody)
                       for s in eff.sends)

    ms[NodeId("n0")].queue(IDS[0])
    for _ in range(12):
        for x, m in ms.items():
            m.tick(no_proof)
            collect(x)
        while wire:
            src, send = wire.pop(0)
            m, msg = ms[send.to], send.message
            if isinstance(msg, StartCheckpoint):
                m.on_start(src, msg, no_proof)
            elif isinstance(msg, VetoChoice):
                m.on_choice(src, msg, no_proof)
            elif isinstance(msg, VoteReady):
                m.on_ready(src, msg)
            elif isinstance(msg, VoteDigestBatch | VoteEchoDigest | FetchVote | VoteBody):
                m.on_relay(src, msg, no_proof)
            collect(send.to)
    return dropped, counted


def test_batched_and_unbatched_clusters_decide_alike_with_fewer_messages() -> None:
    """n = 10: unbatched, n broadcasts cost each node ~2n echoes and readies per peer;
    batched, a few batches per peer (one per flush that has something)."""
    alone, alone_msgs = run_cluster(10, 0)
    batched, batched_msgs = run_cluster(10, 1)
    assert alone == batched == {x: IDS for x in nodes_of(10)}
    # Unbatched: per vote 9 SENDs, 90 echoes and 90 readies, and a few answers to pulls.
    assert 189 * 10 <= alone_msgs < 189 * 11
    assert batched_msgs < alone_msgs / 4, batched_msgs

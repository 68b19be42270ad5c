"""READYs by echo (`VoteDigestBatch.echoed_readies`): a node's READY of the digest it echoed
goes without the digest, and the receiver counts it as the sender's READY of the sender's
first echo it recorded (or once that echo arrives). Fewer bytes per checkpoint; the same
counts for a correct sender; a Byzantine sender gains nothing it could not do with explicit
readies: agreement and totality hold under any order, duplicates and lying accomplices."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    FetchVote,
    VetoChoice,
    VoteBody,
    VoteDigestBatch,
)
from phalanx.consensus.leaderless.reliable_broadcast import VoteBroadcast
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire

CID = b"\x01" * 32
HASH = FastCrypto(NodeId("n0"))


def nodes_of(n: int) -> tuple[NodeId, ...]:
    return tuple(NodeId(f"n{i}") for i in range(n))


def vote(voter: str, variant: int) -> VetoChoice:
    v = VetoChoice(checkpoint=CID, tx_ids=(bytes([variant + 1]),), voter=NodeId(voter),
                   drop=variant == 0)
    return dataclasses.replace(v, signature=FastCrypto(NodeId(voter)).sign(v))


def ok(_v: VetoChoice) -> str | None:
    return None


def receive(rb: VoteBroadcast, src: NodeId, msg: Message) -> None:
    """What `CheckpointMachine.on_relay` does with each message (its checks passed)."""
    if isinstance(msg, VetoChoice):
        if msg.voter == src:
            rb.on_send(src, msg, ok)
    elif isinstance(msg, VoteDigestBatch):
        k = msg.echoed_readies
        assert len(msg.ready_voters) == len(msg.ready_digests) + k
        rb.on_digest_items(src, msg.checkpoint, msg.echo_voters, msg.echo_digests, echo=True)
        rb.on_echoed_readies(src, msg.checkpoint, msg.ready_voters[:k])
        rb.on_digest_items(src, msg.checkpoint, msg.ready_voters[k:], msg.ready_digests,
                           echo=False)
    elif isinstance(msg, FetchVote):
        rb.on_fetch(src, msg)
    elif isinstance(msg, VoteBody) and rb.expects(msg.vote):
        rb.on_body(msg.vote, ok)


class Net:
    """Batched honest `VoteBroadcast`s (flushing every tick) and a pool of messages."""

    def __init__(self, n: int, honest: tuple[NodeId, ...]) -> None:
        self.nodes = nodes_of(n)
        self.honest = honest
        self.rb = {x: VoteBroadcast(node_id=x, nodes=self.nodes, faults=(n - 1) // 3,
                                    hasher=HASH, batch_ticks=1) for x in honest}
        for rb in self.rb.values():
            for voter in self.nodes:
                rb.open((voter, CID))
        self.pool: list[tuple[NodeId, NodeId, Message]] = []
        self.delivered: dict[NodeId, list[VetoChoice]] = {x: [] for x in honest}

    def collect(self, x: NodeId) -> None:
        sends, delivered, _ = self.rb[x].drain()
        self.pool += [(x, s.to, s.message) for s in sends]
        self.delivered[x] += delivered

    def tick(self) -> None:
        for x, rb in self.rb.items():
            rb.tick()
            self.collect(x)

    def deliver(self, src: NodeId, dst: NodeId, msg: Message) -> None:
        if dst in self.rb:
            receive(self.rb[dst], src, msg)
            self.collect(dst)

    def answer_round(self) -> None:
        for x in self.honest:
            self.rb[x].refetch()
            for y in self.honest:
                if x != y:
                    for voter in self.nodes:
                        self.pool += [(x, s.to, s.message)
                                      for s in self.rb[x].answer((voter, CID), y)]
            self.collect(x)
        self.tick()  # the answers' echoes and readies go in the next flush


def batch(echoes: tuple[tuple[str, bytes], ...] = (), by_echo: tuple[str, ...] = (),
          readies: tuple[tuple[str, bytes], ...] = ()) -> VoteDigestBatch:
    return VoteDigestBatch(
        checkpoint=CID, echo_voters=tuple(NodeId(v) for v, _ in echoes),
        echo_digests=tuple(d for _, d in echoes),
        ready_voters=tuple(NodeId(v) for v in by_echo) + tuple(NodeId(v) for v, _ in readies),
        ready_digests=tuple(d for _, d in readies), echoed_readies=len(by_echo))


def test_a_fault_free_broadcast_sends_every_ready_by_echo_in_fewer_bytes() -> None:
    """n = 7, every node votes: every READY is of the node's own echo, so no ready carries
    a digest; the same batches with explicit digests would weigh ~1.8x as much."""
    net = Net(7, nodes_of(7))
    for x in net.nodes:
        net.rb[x].broadcast(vote(x, 0))
        net.collect(x)
    sent: list[VoteDigestBatch] = []
    for _ in range(10):
        net.tick()
        while net.pool:
            src, dst, msg = net.pool.pop(0)
            if isinstance(msg, VoteDigestBatch) and src == NodeId("n0"):
                sent.append(msg)
            net.deliver(src, dst, msg)
    assert all(len(net.delivered[x]) == 7 for x in net.nodes)
    readies = sum(len(b.ready_voters) for b in sent)
    assert readies == 7 * 6  # n0's READY of each of the 7 votes, to each of its 6 peers
    assert sum(b.echoed_readies for b in sent) == readies
    assert all(b.ready_digests == () for b in sent)
    wire.register_all(LEADERLESS_MESSAGES)
    encode = wire.encode
    explicit = [dataclasses.replace(b, echoed_readies=0, ready_digests=tuple(
        net.rb[NodeId("n0")]._instances[(v, CID)].ready or b"" for v in b.ready_voters))
        for b in sent]
    now, before = (sum(len(encode(b)) for b in bs) for bs in (sent, explicit))
    assert now * 1.5 < before, (now, before)
    assert wire.decode(encode(sent[-1])) == sent[-1]  # the new field round-trips


def test_a_ready_by_echo_before_the_echo_waits_for_it() -> None:
    rb = Net(4, (NodeId("n0"),)).rb[NodeId("n0")]
    v = vote("n1", 0)
    d = digest_of(HASH, v)
    rb.on_send(NodeId("n1"), v, ok)
    for src in ("n2", "n3"):  # READYs by echo before any echo of theirs: they wait
        receive(rb, NodeId(src), batch(by_echo=("n1",)))
    inst = rb._instances[(NodeId("n1"), CID)]
    assert inst.readies == {}
    assert set(inst.ready_on_echo) == {"n2", "n3"}
    receive(rb, NodeId("n2"), batch(echoes=(("n1", d),)))
    assert inst.readies == {"n2": d}
    receive(rb, NodeId("n3"), batch(echoes=(("n1", d),)))
    # Q = 3 echoes (n0's, n2's, n3's): READY; 3 readies = 2f+1 with the body: delivered.
    assert inst.ready == d
    assert rb.delivered((NodeId("n1"), CID)) == v
    assert inst.ready_on_echo == {}


def test_a_byzantine_ready_by_echo_counts_once_for_its_first_echo() -> None:
    """A Byzantine n3 echoes d1, then d2 (not counted), readies by echo (d1: its first echo
    here), then readies d2 explicitly (not counted): one READY, for d1, as if explicit."""
    rb = Net(4, (NodeId("n0"),)).rb[NodeId("n0")]
    d1, d2 = (digest_of(HASH, vote("n1", k)) for k in (0, 1))
    receive(rb, NodeId("n3"), batch(echoes=(("n1", d1),)))
    receive(rb, NodeId("n3"), batch(echoes=(("n1", d2),), by_echo=("n1", "n1"),
                                    readies=(("n1", d2),)))
    inst = rb._instances[(NodeId("n1"), CID)]
    assert inst.echoes == {"n3": d1}
    assert inst.readies == {"n3": d1}
    assert inst.ready_counts == {d1: 1}
    assert rb.dropped_counts() == {"echo_equivocation": 1, "ready_equivocation": 1}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.sampled_from([4, 5, 7]))
def test_agreement_and_totality_with_readies_by_echo(data: st.DataObject, n: int) -> None:
    """An equivocating voter; its accomplices echo different digests to different nodes
    and ready by echo (so each receiver counts their READY for what they echoed to it),
    ready explicitly and send bodies; any order, duplicates, flushes at any time, then the
    pulls: honest nodes deliver at most one value, the same, and all or none."""
    nodes = nodes_of(n)
    f = (n - 1) // 3
    byz = tuple(nodes[n - f:])
    honest = tuple(x for x in nodes if x not in byz)
    net = Net(n, honest)
    origin = byz[0]
    variants = [vote(origin, k) for k in range(3)]
    digests = [digest_of(HASH, v) for v in variants]
    for x in honest:
        k = data.draw(st.integers(-1, 2))
        if k >= 0:
            net.pool.append((origin, x, variants[k]))
    for b in byz:
        for x in honest:
            echoes = data.draw(st.lists(st.integers(0, 2), max_size=2))
            for k in echoes:
                net.pool.append((b, x, batch(echoes=((origin, digests[k]),))))
            if data.draw(st.booleans()):
                net.pool.append((b, x, batch(by_echo=(origin,))))
            if data.draw(st.booleans()):
                net.pool.append((b, x, batch(readies=((origin, digests[data.draw(
                    st.integers(0, 2))]),))))
            if data.draw(st.booleans()):
                net.pool.append((b, x, VoteBody(vote=variants[data.draw(st.integers(0, 2))])))
    rng = data.draw(st.randoms(use_true_random=False))
    steps = 0
    while net.pool and steps < 3000:
        steps += 1
        if rng.random() < 0.2:
            net.tick()
        i = rng.randrange(len(net.pool))
        src, dst, msg = net.pool[i]
        if rng.random() < 0.8:
            net.pool.pop(i)
        net.deliver(src, dst, msg)
    for _ in range(3):
        net.answer_round()
        while net.pool:
            net.deliver(*net.pool.pop(0))
            if not net.pool:
                net.tick()
    values = {x: [digest_of(HASH, v) for v in net.delivered[x]] for x in honest}
    assert all(len(v) <= 1 for v in values.values())
    got = {v[0] for v in values.values() if v}
    assert len(got) <= 1
    if got:
        assert all(values[x] for x in honest)

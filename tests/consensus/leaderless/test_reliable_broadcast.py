"""VoteBroadcast (Bracha's reliable broadcast of votes): validity, agreement and totality
under any delivery order, duplicates, an equivocating voter, lying echoers and readiers,
silent nodes; durable choices across restarts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import (
    FetchVote,
    VetoChoice,
    VoteBody,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
)
from phalanx.consensus.leaderless.reliable_broadcast import VoteBroadcast
from phalanx.consensus.types import LocalProtocolError, Message, NodeId

CID = b"\x01" * 32
HASH = FastCrypto(NodeId("n0"))


def nodes_of(n: int) -> tuple[NodeId, ...]:
    return tuple(NodeId(f"n{i}") for i in range(n))


def vote(voter: str, variant: int) -> VetoChoice:
    """Distinct contents of one instance (variant 0 is a drop)."""
    v = VetoChoice(checkpoint=CID, tx_ids=(bytes([variant + 1]),), voter=NodeId(voter),
                   drop=variant == 0)
    return dataclasses.replace(v, signature=FastCrypto(NodeId(voter)).sign(v))


def ok(_v: VetoChoice) -> str | None:
    return None


class Net:
    """Honest `VoteBroadcast`s and a message pool the test drains in any order."""

    def __init__(self, n: int, honest: tuple[NodeId, ...]) -> None:
        self.nodes = nodes_of(n)
        self.f = (n - 1) // 3
        self.honest = honest
        self.rb = {x: VoteBroadcast(node_id=x, nodes=self.nodes, faults=self.f, hasher=HASH)
                   for x in honest}
        for x in honest:
            for voter in self.nodes:
                self.rb[x].open((voter, CID))
        self.pool: list[tuple[NodeId, NodeId, Message]] = []
        self.delivered: dict[NodeId, list[VetoChoice]] = {x: [] for x in honest}

    def collect(self, x: NodeId) -> None:
        sends, delivered, _ = self.rb[x].drain()
        self.pool += [(x, s.to, s.message) for s in sends]
        self.delivered[x] += delivered

    def deliver(self, src: NodeId, dst: NodeId, msg: Message) -> None:
        if dst not in self.rb:
            return  # Byzantine receivers ignore everything
        rb = self.rb[dst]
        if isinstance(msg, VetoChoice):
            if msg.voter == src:
                rb.on_send(src, msg, ok)
        elif isinstance(msg, VoteEcho):
            rb.on_echo(src, msg, ok)
        elif isinstance(msg, VoteEchoDigest):
            rb.on_echo_digest(src, (msg.voter, msg.checkpoint), msg.digest)
        elif isinstance(msg, VoteReady):
            rb.on_ready(src, msg)
        elif isinstance(msg, FetchVote):
            rb.on_fetch(src, msg)
        elif isinstance(msg, VoteBody) and rb.expects(msg.vote):
            rb.on_body(msg.vote, ok)
        self.collect(dst)

    def answer_round(self) -> None:
        """Loss recovery: every honest node answers every other (the periodic pull) and
        asks again for the bodies it lacks."""
        for x in self.honest:
            self.rb[x].refetch()
            self.collect(x)
        for x in self.honest:
            for y in self.honest:
                if x != y:
                    for voter in self.nodes:
                        self.pool += [(x, s.to, s.message)
                                      for s in self.rb[x].answer((voter, CID), y)]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.sampled_from([4, 5, 7]))
def test_agreement_and_totality_under_byzantine_voter(data: st.DataObject, n: int) -> None:
    nodes = nodes_of(n)
    f = (n - 1) // 3
    byz = tuple(nodes[n - f:])  # the last f nodes; the voter is one of them
    honest = tuple(x for x in nodes if x not in byz)
    net = Net(n, honest)
    origin = byz[0]
    variants = [vote(origin, k) for k in range(3)]
    digests = [digest_of(HASH, v) for v in variants]
    # The equivocating voter sends any variant (or nothing) to each honest node; the other
    # Byzantine nodes echo and ready arbitrary variants to arbitrary nodes.
    for x in honest:
        k = data.draw(st.integers(-1, 2))
        if k >= 0:
            net.pool.append((origin, x, variants[k]))
    for b in byz:
        for x in honest:
            if data.draw(st.booleans()):
                net.pool.append((b, x, VoteEcho(vote=variants[data.draw(st.integers(0, 2))])))
            if data.draw(st.booleans()):
                net.pool.append((b, x, VoteReady(checkpoint=CID, voter=origin,
                                                 digest=digests[data.draw(st.integers(0, 2))])))
            if data.draw(st.booleans()):  # echoes by digest, and unasked or forged bodies
                k = data.draw(st.integers(0, 2))
                net.pool.append((b, x, VoteEchoDigest(checkpoint=CID, voter=origin,
                                                      digest=digests[k])))
                net.pool.append((b, x, VoteBody(vote=variants[data.draw(st.integers(0, 2))])))
    rng = data.draw(st.randoms(use_true_random=False))
    steps = 0
    while net.pool and steps < 2000:
        steps += 1
        i = rng.randrange(len(net.pool))
        src, dst, msg = net.pool[i]
        if rng.random() < 0.8:  # else leave a duplicate behind
            net.pool.pop(i)
        net.deliver(src, dst, msg)
    for _ in range(3):  # the network heals: pulls bring everything
        net.answer_round()
        while net.pool:
            net.deliver(*net.pool.pop(0))
    values = {x: [digest_of(HASH, v) for v in net.delivered[x]] for x in honest}
    assert all(len(v) <= 1 for v in values.values())  # at most one value per instance
    got = {v[0] for v in values.values() if v}
    assert len(got) <= 1  # agreement
    if got:  # totality
        assert all(values[x] for x in honest)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.sampled_from([4, 7]))
def test_correct_voter_is_delivered_despite_f_silent_nodes(data: st.DataObject,
                                                           n: int) -> None:
    nodes = nodes_of(n)
    f = (n - 1) // 3
    honest = nodes[: n - f]  # the last f nodes are silent
    net = Net(n, honest)
    voter = honest[data.draw(st.integers(0, len(honest) - 1))]
    v = vote(voter, 1)
    net.rb[voter].broadcast(v)
    net.collect(voter)
    rng = data.draw(st.randoms(use_true_random=False))
    while net.pool:
        net.deliver(*net.pool.pop(rng.randrange(len(net.pool))))
    for x in honest:
        assert net.delivered[x] == [v]
        assert net.rb[x].delivered((voter, CID)) == v


def test_echo_and_ready_only_once_and_only_from_the_voter() -> None:
    net = Net(4, nodes_of(4))
    rb = net.rb[NodeId("n0")]
    a, b = vote("n3", 1), vote("n3", 2)
    rb.on_send(NodeId("n3"), a, ok)
    rb.on_send(NodeId("n3"), b, ok)  # equivocation: not echoed
    sends, _, dirty = rb.drain()
    assert dirty
    echo = VoteEchoDigest(checkpoint=CID, voter=NodeId("n3"), digest=digest_of(HASH, a))
    assert [s.message for s in sends] == [echo] * 3  # the digest, not the vote
    assert rb.dropped_counts() == {"equivocation": 1}
    for src in ("n1", "n2"):
        rb.on_echo(NodeId(src), VoteEcho(vote=b), ok)
    rb.on_echo(NodeId("n1"), VoteEcho(vote=a), ok)  # n1's second echo: ignored
    sends, _, _ = rb.drain()
    # b has 2 echoes (< Q = 3), a has 1: no READY yet.
    assert sends == []
    rb.on_echo(NodeId("n3"), VoteEcho(vote=b), ok)
    sends, _, _ = rb.drain()
    ready = VoteReady(checkpoint=CID, voter=NodeId("n3"), digest=digest_of(HASH, b))
    assert [s.message for s in sends] == [ready] * 3  # READY follows the echo quorum
    assert rb.dropped_counts()["echo_equivocation"] == 1


def test_invalid_content_is_never_echoed_nor_delivered() -> None:
    net = Net(4, nodes_of(4))
    rb = net.rb[NodeId("n0")]
    bad = vote("n3", 1)
    rb.on_send(NodeId("n3"), bad, lambda _v: "forged_veto")
    d = digest_of(HASH, bad)
    for src in ("n1", "n2", "n3"):
        rb.on_echo(NodeId(src), VoteEcho(vote=bad), lambda _v: "forged_veto")
        rb.on_ready(NodeId(src), VoteReady(checkpoint=CID, voter=NodeId("n3"), digest=d))
    sends, delivered, _ = rb.drain()
    # f+1 readies make it ready (some correct node must have seen Q echoes), but without
    # valid content it is never delivered.
    assert all(isinstance(s.message, VoteReady) for s in sends)
    assert delivered == []
    assert rb.dropped_counts() == {"forged_veto": 4}


def test_restart_never_echoes_or_readies_another_value() -> None:
    nodes = nodes_of(4)
    rb = VoteBroadcast(node_id=nodes[0], nodes=nodes, faults=1, hasher=HASH)
    rb.open((NodeId("n3"), CID))
    a, b = vote("n3", 1), vote("n3", 2)
    rb.on_send(NodeId("n3"), a, ok)
    for src in ("n1", "n2"):
        rb.on_ready(NodeId(src), VoteReady(checkpoint=CID, voter=NodeId("n3"),
                                           digest=digest_of(HASH, a)))
    rb.drain()
    (relay,) = rb.relays([(NodeId("n3"), CID)])
    assert relay.echo == relay.ready == digest_of(HASH, a)
    again = VoteBroadcast(node_id=nodes[0], nodes=nodes, faults=1, hasher=HASH,
                          restored=(relay,))
    again.on_send(NodeId("n3"), b, ok)  # the voter equivocates to the restarted node
    for src in ("n1", "n2"):
        again.on_echo(NodeId(src), VoteEcho(vote=b), ok)
        again.on_ready(NodeId(src), VoteReady(checkpoint=CID, voter=NodeId("n3"),
                                              digest=digest_of(HASH, b)))
    sends, delivered, _ = again.drain()
    # Neither an echo nor a ready of b (and no fetch of a's body yet: it knows no echoer
    # of a but itself).
    assert sends == []
    assert delivered == []
    # Its answers repeat its old choices, by digest: no content needed.
    answers = again.answer((NodeId("n3"), CID), NodeId("n1"))
    da = digest_of(HASH, a)
    assert [s.message for s in answers] == [
        VoteEchoDigest(checkpoint=CID, voter=NodeId("n3"), digest=da),
        VoteReady(checkpoint=CID, voter=NodeId("n3"), digest=da)]


def test_needs_n_at_least_3f_plus_1() -> None:
    with pytest.raises(LocalProtocolError):
        VoteBroadcast(node_id=NodeId("n0"), nodes=nodes_of(3), faults=1, hasher=HASH)
    rb = VoteBroadcast(node_id=NodeId("n0"), nodes=nodes_of(4), faults=1, hasher=HASH)
    with pytest.raises(LocalProtocolError):
        rb.broadcast(vote("n1", 0))
    rb.on_ready(NodeId("n1"), VoteReady(checkpoint=CID, voter=NodeId("n1"), digest=b"x"))
    assert rb.dropped_counts() == {"unknown_instance": 1}


def test_fenced_node_echoes_and_readies_nothing_but_delivers() -> None:
    """The amnesia fence: a node that lost its choices makes none, and still delivers."""
    rb = VoteBroadcast(node_id=NodeId("n0"), nodes=nodes_of(4), faults=1, hasher=HASH)
    rb.fenced = True
    key = (NodeId("n3"), CID)
    rb.open(key)
    v = vote("n3", 1)
    rb.on_send(NodeId("n3"), v, ok)
    for src in ("n1", "n2", "n3"):
        rb.on_echo(NodeId(src), VoteEcho(vote=v), ok)
        rb.on_ready(NodeId(src), VoteReady(checkpoint=CID, voter=NodeId("n3"),
                                           digest=digest_of(HASH, v)))
    sends, delivered, dirty = rb.drain()
    assert sends == []
    assert not dirty
    assert delivered == [v]
    assert rb.relays([key]) == ()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("echo", "ready")), st.integers(0, 6),
                          st.integers(0, 2)), max_size=40))
def test_kept_counts_equal_a_scan_of_the_first_echoes_and_readies(
        inputs: list[tuple[str, int, int]]) -> None:
    """`_Instance.echo_counts`/`ready_counts` (kept as messages are stored, so `_progress`
    is O(1)) always equal a count over every member's first ECHO and READY."""
    from collections import Counter

    nodes = nodes_of(7)
    rb = VoteBroadcast(node_id=nodes[0], nodes=nodes, faults=2, hasher=HASH)
    key = (NodeId("n1"), CID)
    rb.open(key)
    for kind, sender, variant in inputs:
        src = nodes[sender]
        content = vote("n1", variant)
        if kind == "echo":
            rb.on_echo(src, VoteEcho(vote=content), ok)
        else:
            rb.on_ready(src, VoteReady(checkpoint=CID, voter=NodeId("n1"),
                                       digest=digest_of(HASH, content)))
        inst = rb._instances[key]
        assert inst.echo_counts == {d: c for d, c in Counter(inst.echoes.values()).items()}
        assert inst.ready_counts == {d: c for d, c in Counter(inst.readies.values()).items()}


# Echoes by digest: the body fetch ------------------------------------------------------


def echo_d(v: VetoChoice) -> VoteEchoDigest:
    return VoteEchoDigest(checkpoint=CID, voter=v.voter, digest=digest_of(HASH, v))


def ready_d(v: VetoChoice) -> VoteReady:
    return VoteReady(checkpoint=CID, voter=v.voter, digest=digest_of(HASH, v))


def test_byzantine_author_sends_different_bodies_the_others_fetch_the_delivered_one() -> None:
    """n = 4, f = 1: the Byzantine voter n3 sends body a to n0 and n1, body b to n2, and
    echoes a. a gets Q = 3 echoes; n2 readies a without its body, fetches it from f+1
    echoers of a, and delivers a like the others; b is never delivered."""
    nodes = nodes_of(4)
    net = Net(4, nodes[:3])
    a, b = vote("n3", 1), vote("n3", 2)
    byz = NodeId("n3")
    net.pool += [(byz, NodeId("n0"), a), (byz, NodeId("n1"), a), (byz, NodeId("n2"), b)]
    net.pool += [(byz, x, echo_d(a)) for x in nodes[:3]]
    while net.pool:
        net.deliver(*net.pool.pop(0))
    assert net.delivered == {x: [a] for x in nodes[:3]}
    rb2 = net.rb[NodeId("n2")]
    assert rb2.delivered((byz, CID)) == a
    assert rb2.relays([(byz, CID)])[0].echo == digest_of(HASH, b)  # its echo was b's


def lone(n: int = 4) -> tuple[VoteBroadcast, tuple[NodeId, ...]]:
    nodes = nodes_of(n)
    rb = VoteBroadcast(node_id=nodes[0], nodes=nodes, faults=(n - 1) // 3, hasher=HASH)
    rb.open((NodeId("n1"), CID))
    return rb, nodes


def test_a_node_that_missed_the_send_fetches_the_body_from_f_plus_1_echoers() -> None:
    rb, _ = lone()
    v = vote("n1", 1)
    key = (NodeId("n1"), CID)
    for src in ("n3", "n2", "n1"):  # n1 (the voter) echoes its own vote too
        rb.on_echo_digest(NodeId(src), key, digest_of(HASH, v))
    sends, delivered, _ = rb.drain()
    fetch = FetchVote(checkpoint=CID, voter=NodeId("n1"), digest=digest_of(HASH, v))
    # Q = 3 echoes: it readies the digest, and asks the first f+1 = 2 echoers for the body.
    assert [s.message for s in sends if isinstance(s.message, VoteReady)] == [ready_d(v)] * 3
    assert [(s.to, s.message) for s in sends if isinstance(s.message, FetchVote)] == [
        ("n3", fetch), ("n2", fetch)]
    assert delivered == []
    # An echoer that holds the body (it got the SEND) answers, once per period.
    peer = VoteBroadcast(node_id=NodeId("n2"), nodes=nodes_of(4), faults=1, hasher=HASH)
    peer.open(key)
    peer.on_send(NodeId("n1"), v, ok)
    peer.drain()
    peer.on_fetch(NodeId("n0"), fetch)
    peer.on_fetch(NodeId("n0"), fetch)
    (answer,) = peer.drain()[0]
    assert answer == Send(to=NodeId("n0"), message=VoteBody(vote=v))
    assert peer.dropped_counts() == {"vote_fetch_repeat": 1}
    peer.refetch()  # a new period: n0 may ask again (its answer may have been lost)
    peer.on_fetch(NodeId("n0"), fetch)
    assert [s.message for s in peer.drain()[0]] == [VoteBody(vote=v)]
    # The body arrives: held; delivered once 2f+1 = 3 readies are in.
    assert rb.expects(v)
    rb.on_body(v, ok)
    for src in ("n2", "n3"):
        rb.on_ready(NodeId(src), ready_d(v))
    assert rb.drain()[1] == [v]
    assert not rb.expects(v)  # a second answer (the other echoer's) is a late duplicate
    assert rb.dropped_counts() == {"vote_body_unasked": 1}


def test_a_forged_or_unasked_body_is_dropped_and_counted() -> None:
    rb, _ = lone()
    key = (NodeId("n1"), CID)
    v, other = vote("n1", 1), vote("n1", 2)
    assert not rb.expects(v)  # nothing fetched yet: unasked
    for src in ("n1", "n2", "n3"):
        rb.on_echo_digest(NodeId(src), key, digest_of(HASH, v))
    rb.drain()
    assert not rb.expects(other)  # signed by the voter, but not the digest being fetched
    assert rb.expects(v)
    rb.on_body(v, lambda _v: "bad_signature")  # a body that fails validation is not held
    assert not rb.expects(other)
    assert rb.dropped_counts() == {"vote_body_unasked": 1, "vote_body_mismatch": 2,
                                   "bad_signature": 1}
    for src in ("n1", "n2", "n3"):
        rb.on_ready(NodeId(src), ready_d(v))
    assert rb.drain()[1] == []  # never delivered without the valid body
    assert rb.delivered(key) is None


def test_lost_fetches_are_asked_again_round_robin_and_new_echoers_are_asked() -> None:
    rb, _ = lone(7)  # f = 2: ask 3 echoers
    key = (NodeId("n1"), CID)
    v = vote("n1", 1)
    d = digest_of(HASH, v)
    for src in ("n1", "n2"):
        rb.on_echo_digest(NodeId(src), key, d)
    for src in ("n4", "n5", "n6"):
        rb.on_ready(NodeId(src), ready_d(v))  # f+1 readies: it readies d, wants its body
    asked = [s.to for s in rb.drain()[0] if isinstance(s.message, FetchVote)]
    assert asked == ["n1", "n2"]  # the echoers of d it knows
    rb.on_echo_digest(NodeId("n3"), key, d)
    rb.on_echo_digest(NodeId("n4"), key, d)
    asked = [s.to for s in rb.drain()[0] if isinstance(s.message, FetchVote)]
    assert asked == ["n3"]  # up to f+1 = 3 asked
    rb.refetch()  # a period later, nothing came: ask the echoers not asked yet
    asked = [s.to for s in rb.drain()[0] if isinstance(s.message, FetchVote)]
    assert asked == ["n4"]
    rb.refetch()  # every known echoer asked (a correct one may have lost it): start over
    asked = [s.to for s in rb.drain()[0] if isinstance(s.message, FetchVote)]
    assert asked == ["n1", "n2", "n3"]
    assert rb.expects(v)
    rb.on_body(v, ok)
    rb.refetch()
    assert rb.drain()[0] == []  # held: nothing more to ask

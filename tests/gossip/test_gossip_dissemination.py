"""The dissemination layer (`phalanx.gossip.dissemination`): a core's broadcasts reach every
live node exactly once, from their origin, for any crash set and delivery order; point-to-point
and partial sends stay direct; forged, tampered and undecodable rumors are dropped and
counted, never delivered."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import LEADERLESS_MESSAGES, FetchTransactions
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.dissemination import Dissemination, DisseminationConfig
from phalanx.gossip.messages import Call, Grant, Rumor, wave_seed
from phalanx.gossip.sim import node_ids
from phalanx.net import wire
from phalanx.net.codec import DecodeError

wire.register_all(LEADERLESS_MESSAGES)


def _decode(data: bytes) -> Message | None:
    try:
        message = wire.decode(data)
    except DecodeError:
        return None
    return message if isinstance(message, Message) else None


def _layer(node: NodeId, members: tuple[NodeId, ...], *, seed: int = 0,
           config: DisseminationConfig | None = None) -> Dissemination:
    return Dissemination(node, members, crypto=FastCrypto(node),
                         rng=random.Random(f"{seed}/{node}"), encode=wire.encode,
                         decode=_decode, config=config)


def _msg(i: int) -> FetchTransactions:
    return FetchTransactions(tx_ids=(b"tx-%d" % i,))


def _broadcast(src: NodeId, members: tuple[NodeId, ...], message: Message) -> list[Send]:
    return [Send(to=m, message=message) for m in members if m != src]


class _Net:
    """A tiny seeded network of layers: latency 1..`spread` ticks (any delivery order),
    crashed nodes neither receive nor tick."""

    def __init__(self, members: tuple[NodeId, ...], crashed: frozenset[NodeId], seed: int,
                 spread: int) -> None:
        self.layers = {m: _layer(m, members, seed=seed) for m in members}
        self.crashed = crashed
        self.rng = random.Random(seed)
        self.spread = spread
        self.now = 0
        self.heap: list[tuple[int, int, NodeId, NodeId, Message]] = []
        self.seq = 0
        self.got: dict[NodeId, list[tuple[NodeId, Message]]] = {m: [] for m in members}
        self.direct: list[tuple[NodeId, Send]] = []

    def carry(self, node: NodeId, sends: tuple[Send, ...]) -> None:
        for s in sends:
            if not Dissemination.handles(s.message):
                self.direct.append((node, s))
                continue
            self.seq += 1
            when = self.now + self.rng.randint(1, self.spread)
            heapq.heappush(self.heap, (when, self.seq, s.to, node, s.message))

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.now += 1
            while self.heap and self.heap[0][0] <= self.now:
                _, _, dst, src, msg = heapq.heappop(self.heap)
                if dst in self.crashed:
                    continue
                out = self.layers[dst].receive(src, msg)
                self.got[dst] += [(r.src, r.message) for r in out.delivered]
                self.carry(dst, out.sends)
            for m, layer in self.layers.items():
                if m not in self.crashed:
                    self.carry(m, layer.tick().sends)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(min_value=2, max_value=12), seed=st.integers(0, 2**16),
       crash_bits=st.integers(0, 2**12 - 1), spread=st.integers(1, 2),
       per_origin=st.integers(1, 3))
def test_every_broadcast_reaches_every_live_node_once_from_its_origin(
        n: int, seed: int, crash_bits: int, spread: int, per_origin: int) -> None:
    members = node_ids(n)
    crashed = frozenset(m for i, m in enumerate(members) if crash_bits >> i & 1)
    net = _Net(members, crashed, seed, spread)
    expected: list[tuple[NodeId, Message]] = []
    for i, origin in enumerate(m for m in members if m not in crashed):
        for j in range(per_origin):
            message = _msg(100 * i + j)
            out = net.layers[origin].outgoing(_broadcast(origin, members, message))
            assert out.published == 1
            assert not out.sends
            expected.append((origin, message))
    net.run(40 * n + 20)
    for m in members:
        if m in crashed:
            continue
        want = sorted((o, msg.tx_ids) for o, msg in expected if o != m)  # type: ignore[attr-defined]
        got = sorted((o, msg.tx_ids) for o, msg in net.got[m])  # type: ignore[attr-defined]
        assert got == want, f"replay: n={n} seed={seed} crash_bits={crash_bits} at {m}"
    assert not net.direct


def test_point_to_point_and_partial_sends_stay_direct_in_order() -> None:
    members = node_ids(5)
    me = members[0]
    layer = _layer(me, members)
    one = Send(to=members[1], message=_msg(1))
    partial = [Send(to=m, message=_msg(2)) for m in members[1:4]]  # not every peer
    full = _broadcast(me, members, _msg(3))
    out = layer.outgoing([one, *partial, *full, one])
    assert out.published == 1
    assert list(out.sends) == [one, *partial, one]
    status = layer.status()
    assert status["broadcasts"] == 1
    assert status["direct"] == 5


def test_an_equal_broadcast_is_not_republished_within_the_resend_window() -> None:
    members = node_ids(4)
    me = members[0]
    layer = _layer(me, members, config=DisseminationConfig(resend_window=3))
    assert layer.outgoing(_broadcast(me, members, _msg(1))).published == 1
    assert layer.outgoing(_broadcast(me, members, _msg(1))).published == 0
    for _ in range(3):
        layer.tick()
    assert layer.outgoing(_broadcast(me, members, _msg(1))).published == 1
    assert layer.status()["suppressed_resends"] == 1


def _call_with(rumor: Rumor, members: tuple[NodeId, ...]) -> Call:
    seed = wave_seed(rumor.origin, rumor.incarnation, rumor.wave, 0, rumor.seed)
    return Call(call_id=1, grants=(Grant(origin=rumor.origin, incarnation=rumor.incarnation,
                                         wave=rumor.wave, instance=0, seed=seed, lo=0,
                                         hi=0, rumors=(rumor,)),))


def _signed(origin: NodeId, payload: bytes, *, signer: NodeId | None = None) -> Rumor:
    unsigned = Rumor(origin=origin, incarnation=0, seq=0, wave=0, seed=b"s" * 16,
                     payload=payload)
    return replace(unsigned, signature=FastCrypto(signer or origin).sign(unsigned))


def test_forged_tampered_and_undecodable_rumors_are_dropped_and_counted() -> None:
    members = node_ids(4)
    origin, forger, me = members[0], members[1], members[2]
    layer = _layer(me, members)
    payload = wire.encode(_msg(7))
    cases = (
        ("bad_signature", _signed(origin, payload, signer=forger)),  # forged origin
        ("bad_signature", replace(_signed(origin, payload), payload=wire.encode(_msg(8)))),
    )
    for reason, rumor in cases:
        out = layer.receive(forger, _call_with(rumor, members))
        assert not out.delivered
        assert not out.sends  # no ack: the caller keeps the interval
        assert dict(out.counters).get(f"dropped:{reason}") == 1
    junk = _signed(origin, b"\xc1 not a message")  # authentic, but not a message
    out = layer.receive(forger, _call_with(junk, members))
    assert not out.delivered
    assert dict(out.counters).get("dropped:undecodable_payload") == 1
    good = replace(_signed(origin, payload), seq=1)
    good = replace(good, signature=FastCrypto(origin).sign(replace(good, signature=b"")))
    out = layer.receive(forger, _call_with(good, members))
    assert [(r.src, r.message) for r in out.delivered] == [(origin, _msg(7))]
    assert layer.status()["dropped:bad_signature"] == 2

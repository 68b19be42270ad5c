"""The announce service spreading received announcements through a rumor channel, without
sockets: the in-memory world of `test_announce_service` with a fake gossip service (a
`RumorChannel` that hands each published payload to the other members' callbacks).

Checked: with a channel, a node that accepts an announcement from a linked node publishes
it once as a rumor instead of relaying it (n-1 sends), and members that only get the rumor
verify and accept it; without a channel the direct relay is kept; rumors of other uses are
ignored, and a tagged rumor that is garbage or carries a tampered announcement is dropped
and counted, never raised (hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from test_announce_service import World, _tamper

from phalanx.consensus.types import NodeId
from phalanx.gossip.messages import Rumor
from phalanx.net import wire
from phalanx.services.announce_node import RUMOR_TAG, AnnounceService, RumorChannel


class FakeGossip:
    """Every member's channel: a published payload is delivered to the others at once."""

    def __init__(self) -> None:
        self.callbacks: dict[NodeId, Callable[[Rumor], None]] = {}
        self.published: list[tuple[NodeId, bytes]] = []

    def channel(self, me: NodeId) -> RumorChannel:
        bus = self

        class Channel:
            def publish(self, payload: bytes) -> object:
                bus.published.append((me, payload))
                rumor = Rumor(origin=NodeId(me.split("@")[0]), incarnation=1,
                              seq=len(bus.published), wave=0, seed=b"s", payload=payload)
                for node, callback in sorted(bus.callbacks.items()):
                    if node != me:
                        callback(rumor)
                return rumor

            def on_deliver(self, callback: Callable[[Rumor], None]) -> None:
                bus.callbacks[me] = callback

        return Channel()


def _world_with_gossip(cluster: str) -> tuple[World, FakeGossip]:
    w = World()
    bus = FakeGossip()
    for m in w.infos[cluster].members:  # qualified ids, `<node>@<cluster>`
        node = w.nodes[m]
        node._services = {"gossip": bus.channel(node.me)}  # as the host would
    return w, bus


def _node(w: World, name: str) -> AnnounceService:
    return w.nodes[NodeId(name)]


def test_a_received_announcement_is_published_once_as_a_rumor_not_relayed() -> None:
    w, bus = _world_with_gossip("cb")
    digest = w.checkpoint("ca", 8)
    w.run(4)
    live = w.live("cb")
    assert {(s.highest["ca"].index, s.highest["ca"].state_digest) for s in live} == {(8, digest)}
    assert all(s.counters().get("relayed", 0) == 0 for s in live)
    gossiped = sum(s.counters().get("gossiped", 0) for s in live)
    assert gossiped == len(bus.published) >= 1
    assert all(p.startswith(RUMOR_TAG) for _, p in bus.published)
    assert sum(s.counters().get("rumor_received", 0) for s in live) >= 1
    # ca has no channel: its nodes still relay what they receive from cb directly.
    w.checkpoint("cb", 4)
    w.run(4)
    assert sum(s.counters().get("relayed", 0) for s in w.live("ca")) >= 1


_W, _BUS = _world_with_gossip("cb")
_W.checkpoint("ca", 4)
_W.run(4)
_GENUINE = _node(_W, "n1@ca").certified["cb"]


@settings(max_examples=60, deadline=None)
@given(tail=st.binary(max_size=60), what=st.integers(0, 5), data=st.binary(max_size=20))
def test_bad_tagged_rumors_are_dropped_and_counted_and_others_ignored(
        tail: bytes, what: int, data: bytes) -> None:
    receiver = _node(_W, "n2@cb")
    on_rumor = _BUS.callbacks[receiver.me]
    receiver.highest.pop("ca", None)

    def dropped() -> int:
        return sum(v for k, v in receiver.counters().items() if k.startswith("dropped"))

    before = dropped()
    on_rumor(Rumor(origin=NodeId("n1"), incarnation=1, seq=1, wave=0, seed=b"s",
                   payload=b"not an announcement" + tail))
    assert dropped() == before
    on_rumor(Rumor(origin=NodeId("n1"), incarnation=1, seq=2, wave=0, seed=b"s",
                   payload=RUMOR_TAG + b"\xff" + tail))
    assert dropped() == before + 1
    forged = RUMOR_TAG + wire.encode(_tamper(_GENUINE, what, data))
    on_rumor(Rumor(origin=NodeId("n3"), incarnation=1, seq=3, wave=0, seed=b"s",
                   payload=forged))
    assert dropped() == before + 2
    assert "ca" not in receiver.highest
    on_rumor(Rumor(origin=NodeId("n3"), incarnation=1, seq=4, wave=0, seed=b"s",
                   payload=RUMOR_TAG + wire.encode(_GENUINE)))  # the control
    assert receiver.highest["ca"].index == _GENUINE.index

"""The announce service's logic without sockets: two clusters of `AnnounceService`s (a
Byzantine one of 4 and a crash-fault one of 3, real Ed25519 keys) over an in-memory bus that
names nodes the way the transport does (our members plainly, linked ones `<node>@<cluster>`).

Checked: both certificate kinds verify at every node of the other cluster; the view is
monotonic (an older certified checkpoint is dropped as stale); with f announcers dead the
rest still certify and announce; any tampering with an announcement is dropped and counted,
never raised nor accepted (hypothesis); a receiver that skips verification (a deliberate
bug) would have accepted the forged ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.clustersend import CLUSTERSEND_MESSAGES
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify, split_qualified
from phalanx.protocols.spec import FaultModel
from phalanx.services import announce_node
from phalanx.services.announce_node import (
    ANNOUNCE_MESSAGES,
    Announcement,
    AnnounceService,
)
from phalanx.services.linked_keys import cluster_info

wire.register_all(CLUSTERSEND_MESSAGES)
wire.register_all(ANNOUNCE_MESSAGES)


class World:
    def __init__(self) -> None:
        self.infos = {"ca": cluster_info("ca", ("n1", "n2", "n3", "n4"), FaultModel.BYZANTINE),
                      "cb": cluster_info("cb", ("n1", "n2", "n3"), FaultModel.CRASH)}
        keys = {m: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(m.encode()).digest())
                for info in self.infos.values() for m in info.members}
        public = {m: k.public_key() for m, k in keys.items()}
        self.queue: deque[tuple[NodeId, NodeId, Message]] = deque()
        self.checkpoints: dict[NodeId, tuple[int, bytes] | None] = {}
        self.dead: set[NodeId] = set()
        self.nodes: dict[NodeId, AnnounceService] = {}
        for cid, info in self.infos.items():
            other = tuple(i for c, i in self.infos.items() if c != cid)
            for m in info.members:
                self.checkpoints[m] = None
                self.nodes[m] = AnnounceService(
                    me=m, cluster=info, linked=other,
                    crypto=Ed25519Crypto(m, private_key=keys[m], public_keys=public,
                                         mac_keys={}),
                    send=self._sender(m, cid), checkpoint=self._reader(m),
                    wall_clock=lambda: 0.0, tick_seconds=0.01, interval=3, fanout=1)

    def _sender(self, me: NodeId, cluster: str) -> Callable[[NodeId, Message], bool]:
        def send(to: NodeId, message: Message) -> bool:
            name, other = split_qualified(to)
            self.queue.append((me, qualify(name, other or cluster), message))
            return True
        return send

    def _reader(self, me: NodeId) -> Callable[[], tuple[int, bytes] | None]:
        return lambda: self.checkpoints[me]

    def deliver(self, src: NodeId, dst: NodeId, message: Message) -> None:
        if dst in self.dead:
            return
        (_, s_cluster), (_, d_cluster) = split_qualified(src), split_qualified(dst)
        self.nodes[dst].receive(NodeId(split_qualified(src)[0]) if s_cluster == d_cluster
                                else src, message)

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            for m, node in self.nodes.items():
                if m not in self.dead:
                    node.tick()
            while self.queue:
                self.deliver(*self.queue.popleft())

    def checkpoint(self, cluster: str, index: int) -> bytes:
        digest = hashlib.sha256(f"{cluster}@{index}".encode()).digest()
        for m in self.infos[cluster].members:
            if m not in self.dead:
                self.checkpoints[m] = (index, digest)
        return digest

    def live(self, cluster: str) -> list[AnnounceService]:
        return [self.nodes[m] for m in self.infos[cluster].members if m not in self.dead]


def _view(world: World, cluster: str, origin: str) -> set[tuple[int, bytes] | None]:
    return {(s.highest[origin].index, s.highest[origin].state_digest)
            if origin in s.highest else None for s in world.live(cluster)}


def test_both_certificate_kinds_reach_every_node_and_the_view_is_monotonic() -> None:
    w = World()
    da, db = w.checkpoint("ca", 8), w.checkpoint("cb", 5)
    w.run(4)
    assert _view(w, "cb", "ca") == {(8, da)}
    assert _view(w, "ca", "cb") == {(5, db)}
    old = w.nodes[NodeId("n1@ca")].certified["cb"]
    da2 = w.checkpoint("ca", 16)
    w.run(4)
    assert _view(w, "cb", "ca") == {(16, da2)}
    receiver = w.nodes[NodeId("n1@cb")]
    w.deliver(NodeId("n2@ca"), NodeId("n1@cb"), old)
    assert receiver.counters()["dropped:stale"] == 1
    assert receiver.highest["ca"].index == 16


def test_f_dead_announcers_do_not_stop_announcements() -> None:
    w = World()
    w.dead |= {NodeId("n1@ca"), NodeId("n3@cb")}  # f = 1 in each
    da, db = w.checkpoint("ca", 4), w.checkpoint("cb", 4)
    w.run(8)
    assert _view(w, "cb", "ca") == {(4, da)}
    assert _view(w, "ca", "cb") == {(4, db)}


def _tamper(ann: Announcement, what: int, data: bytes) -> Announcement:
    cert = ann.certificate
    sigs = list(cert.signatures)
    match what % 6:
        case 0:
            return dataclasses.replace(ann, state_digest=hashlib.sha256(data).digest())
        case 1:
            return dataclasses.replace(ann, index=ann.index + 1 + len(data))
        case 2:  # one signature's bytes replaced
            s = sigs[len(data) % len(sigs)]
            sigs[len(data) % len(sigs)] = dataclasses.replace(
                s, sig=(data + bytes(64))[:64] if (data + bytes(64))[:64] != s.sig else
                bytes(64))
            return dataclasses.replace(ann, certificate=dataclasses.replace(
                cert, signatures=tuple(sigs)))
        case 3:  # a signature short
            return dataclasses.replace(ann, certificate=dataclasses.replace(
                cert, signatures=tuple(sigs[1:])))
        case 4:  # a signer twice
            return dataclasses.replace(ann, certificate=dataclasses.replace(
                cert, signatures=(sigs[0], *sigs[:-1])))
        case _:  # addressed to another cluster
            return dataclasses.replace(ann, certificate=dataclasses.replace(
                cert, statement=dataclasses.replace(cert.statement, dst_cluster="cz")))


_WORLD = World()
_WORLD.checkpoint("ca", 4)
_WORLD.run(4)
_GENUINE = _WORLD.nodes[NodeId("n2@ca")].certified["cb"]


@settings(max_examples=60, deadline=None)
@given(what=st.integers(0, 5), data=st.binary(max_size=40))
def test_a_tampered_announcement_is_dropped_and_counted(what: int, data: bytes) -> None:
    # A receiver holding nothing from "ca" yet (holding the genuine one, a copy with the
    # same index and digest is a duplicate, answered before any signature is checked).
    receiver = _WORLD.nodes[NodeId("n2@cb")]
    receiver.highest.pop("ca", None)
    before = sum(v for k, v in receiver.counters().items() if k.startswith("dropped"))
    receiver.receive(NodeId("n3@ca"), _tamper(_GENUINE, what, data))
    after = sum(v for k, v in receiver.counters().items() if k.startswith("dropped"))
    assert after == before + 1
    assert "ca" not in receiver.highest
    receiver.receive(NodeId("n3@ca"), _GENUINE)  # the control: the untampered one verifies
    assert receiver.highest["ca"].index == _GENUINE.index


def test_a_receiver_without_verification_would_accept_a_forgery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The deliberate-bug control: the forged announcement the test above drops is taken
    # by a receiver that skips `check_certificate` (so the check is what rejects it).
    w = World()
    w.checkpoint("ca", 4)
    w.run(4)
    forged = _tamper(w.nodes[NodeId("n2@ca")].certified["cb"], 0, b"another state")
    receiver = w.nodes[NodeId("n1@cb")]
    receiver.highest.pop("ca")
    receiver.receive(NodeId("n2@ca"), forged)
    assert "ca" not in receiver.highest
    monkeypatch.setattr(announce_node, "check_certificate", lambda *a, **k: None)
    receiver.receive(NodeId("n2@ca"), forged)
    assert receiver.highest["ca"].state_digest == forged.state_digest

"""The node-services host without sockets: routing by message type (a service's types to it,
everything else to the core, a disabled service's types dropped and counted), flushes after
each step, the metrics snapshot, and the forged-rumor check with its deliberate-bug control
(`no_signature_check` must let the forgery through, or the check proves nothing)."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gossip_service import gossip_configs

from phalanx.consensus.types import Message, NodeId
from phalanx.gossip import GossipConfig, GossipMachine, Ping, PingAck, Rumor, RumorPush
from phalanx.net.crypto import Ed25519Crypto
from phalanx.ops.node_config import NodeConfig
from phalanx.ops.signing_keys import load_crypto
from phalanx.runtime.services import ServiceHost
from phalanx.services.gossip_node import GossipService


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[NodeId, object]] = []
        self.flushes = 0

    def send_nowait(self, dst: NodeId, message: object) -> bool:
        self.sent.append((dst, message))
        return True

    def flush(self) -> None:
        self.flushes += 1


async def test_routing_by_type_and_disabled_services(tmp_path: Path) -> None:
    on, off = gossip_configs(tmp_path, 3)[:2]
    off = dataclasses.replace(off, services={"gossip": {**off.services["gossip"],
                                                        "enabled": False}})
    core: list[object] = []

    async def to_core(src: NodeId, message: object) -> None:
        core.append(message)

    wire = FakeTransport()
    host = ServiceHost(on, transport=wire, rng=random.Random(1))
    route = host.route(to_core)
    await route(NodeId("n2"), Ping(seq=7, target=NodeId("n1")))
    assert core == []
    assert [(dst, type(m)) for dst, m in wire.sent] == [(NodeId("n2"), PingAck)]
    assert wire.flushes == 1
    await route(NodeId("n2"), b"not a service message")
    assert core == [b"not a service message"]
    host.snapshot("gossip")
    assert host.snapshots["gossip"][0]["sent:PingAck"] == 1

    disabled = ServiceHost(off, transport=FakeTransport(), rng=random.Random(1))
    assert disabled.services == {}
    await disabled.route(to_core)(NodeId("n1"), Ping(seq=1, target=NodeId("n2")))
    assert disabled.disabled_messages == 1
    assert core == [b"not a service message"]


def _forged_push() -> RumorPush:
    forger = Ed25519Crypto(NodeId("n1"), private_key=Ed25519PrivateKey.generate(),
                           public_keys={}, mac_keys={})
    unsigned = Rumor(origin=NodeId("n1"), incarnation=5, seq=0, wave=0, seed=b"s",
                     payload=b"forged")
    return RumorPush(rumors=(dataclasses.replace(unsigned, signature=forger.sign(unsigned)),))


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({"no_signature_check"})],
                         ids=["checked", "bug-control"])
def test_a_forged_rumor_is_dropped_unless_the_check_is_switched_off(
        tmp_path: Path, bugs: frozenset[str]) -> None:
    config = gossip_configs(tmp_path, 3)[1]  # n2
    machine = GossipMachine(NodeId("n2"), [NodeId(m) for m in config.members()],
                            crypto=load_crypto(config), rng=random.Random(3),
                            config=GossipConfig(bugs=bugs), incarnation=9)
    service = GossipService(machine, send=lambda dst, m: True, tick_seconds=0.01,
                            wall_clock=lambda: 1.0)
    service.receive(NodeId("n3"), _forged_push())
    delivered = [d.payload for d in service.deliveries()]
    if bugs:  # the control: without the check the forgery is delivered
        assert delivered == [b"forged"]
    else:
        assert delivered == []
        assert service.counters()["dropped:bad_signature"] == 1


@functools.cache
def _n2_config() -> NodeConfig:
    """One cluster's n2 for every example (its PKI costs ~0.2 s to make)."""
    root = Path(tempfile.mkdtemp(prefix="gossip-host-"))
    atexit.register(shutil.rmtree, root, True)
    return gossip_configs(root, 3)[1]


@settings(max_examples=25, deadline=None)
@given(junk=st.lists(st.sampled_from(["ping", "push", "ack"]) | st.binary(max_size=8),
                     max_size=6),
       src=st.sampled_from(["n1", "n3", "stranger"]))
def test_arbitrary_peer_input_never_raises(junk: list[object], src: str) -> None:
    config = _n2_config()
    machine = GossipMachine(NodeId("n2"), [NodeId(m) for m in config.members()],
                            crypto=load_crypto(config), rng=random.Random(3))
    service = GossipService(machine, send=lambda dst, m: True, tick_seconds=0.01,
                            wall_clock=lambda: 1.0)
    messages: dict[str, Message] = {
        "ping": Ping(seq=1, target=NodeId("n9")), "push": _forged_push(),
        "ack": PingAck(seq=99, target=NodeId("n1"))}
    for item in junk:
        message = messages.get(item) if isinstance(item, str) else None
        if message is not None:
            service.receive(NodeId(src), message)
        service.tick()
    assert not any(d.payload == b"forged" for d in service.deliveries())


def test_a_send_larger_than_a_frame_is_counted_not_raised() -> None:
    config = _n2_config()
    machine = GossipMachine(NodeId("n2"), [NodeId(m) for m in config.members()],
                            crypto=load_crypto(config), rng=random.Random(3))

    def too_large(dst: NodeId, message: Message) -> bool:
        raise ValueError("frame of 20000000 bytes exceeds max_frame_size")

    service = GossipService(machine, send=too_large, tick_seconds=0.01,
                            wall_clock=lambda: 1.0)
    service.receive(NodeId("n1"), Ping(seq=1, target=NodeId("n2")))  # answered: a PingAck
    assert service.counters()["send_too_large"] == 1


def test_the_gossip_table_sets_every_machine_knob() -> None:
    """Each `[gossip]` option reaches the machine's config (parallel_calls was missing: a node
    could not keep calls in flight in parallel, which a WAN needs); a bad value is a
    one-line ServiceError, not a traceback."""
    from phalanx.services.builtin import GOSSIP
    from phalanx.services.gossip_node import gossip_config
    from phalanx.services.spec import ServiceError

    options = {o.name: o.default for o in GOSSIP.options}
    config = gossip_config({**options, "parallel_calls": 8, "instances": 2, "balance": True})
    assert (config.parallel_calls, config.instances, config.balance) == (8, 2, True)
    assert gossip_config(options).parallel_calls == 1  # GP's one call at a time by default
    with pytest.raises(ServiceError, match=r"^\[gossip\]: .*parallel_calls"):
        gossip_config({**options, "parallel_calls": 0})

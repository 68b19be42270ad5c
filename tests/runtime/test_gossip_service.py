"""The gossip node service under the trio runtime, in process: 3 real nodes over mTLS.

Publish through the embedding API and through the client port (`ServiceCall`), delivery
everywhere (callback and async iterator), roles, a forged rumor dropped and counted, a
stopped node marked suspect/dead, its restart with a higher persisted incarnation and its
catch-up by anti-entropy, and the config/keys errors an operator sees."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from runtime_helpers import RawClient, cluster_client, make_cluster, wait_for

from phalanx.consensus.types import NodeId
from phalanx.gossip import Rumor, RumorPush
from phalanx.net.client_protocol import ReplyStatus
from phalanx.net.crypto import Ed25519Crypto
from phalanx.ops import pki
from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.node_config import (
    ConfigError,
    KeyFiles,
    NodeConfig,
    load_node_config,
)
from phalanx.ops.signing_keys import generate_key_file
from phalanx.runtime.node import Node, NodeError, open_node
from phalanx.services import get as service_spec
from phalanx.services.gossip_api import (
    GossipPublish,
    GossipPublished,
    GossipStatus,
    GossipStatusCall,
)
from phalanx.services.gossip_node import INCARNATION_FILE, GossipService
from phalanx.services.messages import ServiceCall, ServiceReply

TICK_MS = 10


def gossip_configs(root: Path, n: int = 3, *, metrics: bool = False,
                   **options: object) -> list[NodeConfig]:
    """`make_cluster`'s Raft configs plus signing keys and a ``[gossip]`` table."""
    configs = make_cluster(root, n, metrics=metrics)
    keys = {c.id: generate_key_file(root / f"{c.id}.signing.key") for c in configs}
    table = {**service_spec("gossip").defaults(), "tick_ms": TICK_MS, **options}
    out = []
    for c in configs:
        peers = tuple(dataclasses.replace(p, signing_public_key=keys[p.id].signing_public_key,
                                          mac_public_key=keys[p.id].mac_public_key)
                      for p in c.peers)
        out.append(dataclasses.replace(
            c, peers=peers, keys=KeyFiles(signing_key=root / f"{c.id}.signing.key"),
            services={"gossip": table}))
    return out


class Nodes:
    def __init__(self, configs: list[NodeConfig], nursery: trio.Nursery) -> None:
        self.configs = {c.id: c for c in configs}
        self.nursery = nursery
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.stopped: dict[str, trio.Event] = {}

    async def start(self, node_id: str) -> Node:
        stopped = self.stopped[node_id] = trio.Event()

        async def run(task_status: trio.TaskStatus[Node]) -> None:
            try:
                with trio.CancelScope() as scope:
                    self.scopes[node_id] = scope
                    async with open_node(self.configs[node_id]) as node:
                        task_status.started(node)
                        await trio.sleep_forever()
            finally:
                stopped.set()

        self.nodes[node_id] = node = await self.nursery.start(run)
        return node

    async def stop(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]
        await self.stopped[node_id].wait()

    def gossip(self, node_id: str) -> GossipService:
        return cast(GossipService, self.nodes[node_id].services["gossip"])


@contextlib.asynccontextmanager
async def running(configs: list[NodeConfig]) -> AsyncIterator[Nodes]:
    async with trio.open_nursery() as nursery:
        nodes = Nodes(configs, nursery)
        for config in configs:
            await nodes.start(config.id)
        try:
            yield nodes
        finally:
            nursery.cancel_scope.cancel()


def _get(port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def delivered_at(service: GossipService, payload: bytes) -> bool:
    return any(d.payload == payload for d in service.deliveries())


async def service_call(client: RawClient, nonce: int, request: object) -> ServiceReply:
    await client.send(ServiceCall(nonce=nonce, service="gossip", request=request))  # type: ignore[arg-type]
    reply = await client.receive()
    assert isinstance(reply, ServiceReply)
    assert reply.nonce == nonce
    return reply


async def test_publish_reaches_every_node_through_the_api_and_the_client_port(
        tmp_path: Path) -> None:
    async with running(gossip_configs(tmp_path)) as c:
        seen: list[Rumor] = []
        c.gossip("n2").on_deliver(seen.append)
        stream = c.gossip("n3").subscribe()
        rumor = c.gossip("n1").publish(b"hello")
        await wait_for(lambda: all(delivered_at(c.gossip(n), b"hello") for n in c.nodes),
                       within=10, what="every node delivered 'hello'")
        assert [r.rumor_id for r in seen] == [rumor.rumor_id]
        with trio.fail_after(5):
            assert (await stream.receive()).payload == b"hello"
        # Through the client port: publish needs read-write (the admin tester has it).
        client = await RawClient.connect(c.nodes["n2"].client_address,
                                         cluster_client(c.configs["n2"]))
        reply = await service_call(client, 1, GossipPublish(payload=b"via the port"))
        assert reply.status == ReplyStatus.OK
        assert isinstance(reply.result, GossipPublished)
        assert reply.result.origin == "n2"
        await wait_for(lambda: all(delivered_at(c.gossip(n), b"via the port")
                                   for n in c.nodes), within=10, what="port rumor everywhere")
        reply = await service_call(client, 2, GossipStatusCall(max_rumors=10))
        status = reply.result
        assert isinstance(status, GossipStatus)
        assert status.node == "n2"
        assert [d.payload for d in status.deliveries] == [b"hello", b"via the port"]
        assert {m.node: m.status for m in status.members} == {"n1": "ALIVE", "n3": "ALIVE"}
        assert dict(status.counters)["delivered"] == 1
        reply = await service_call(client, 3, GossipPublish(payload=b"x" * 70_000))
        assert reply.status == ReplyStatus.ERROR
        assert "max_payload" in reply.message
        await client.aclose()
        # A read-only client may ask for the status, not publish.
        root = tmp_path
        ca = pki.load_ca(root / "ca")
        reader = pki.write_credentials(pki.issue_client_cert(ca, "reader", role="read-only"),
                                       root / "clients")
        client = await RawClient.connect(c.nodes["n1"].client_address, reader)
        reply = await service_call(client, 1, GossipPublish(payload=b"nope"))
        assert reply.status == ReplyStatus.FORBIDDEN
        assert "read-write" in reply.message
        assert (await service_call(client, 2, GossipStatusCall())).status == ReplyStatus.OK
        await client.send(ServiceCall(nonce=3, service="certificates",
                                      request=GossipStatusCall()))
        reply = cast(ServiceReply, await client.receive())
        assert reply.status == ReplyStatus.ERROR
        assert "runs no 'certificates'" in reply.message
        await client.aclose()


async def test_a_forged_rumor_is_dropped_and_counted_on_the_metrics_page(
        tmp_path: Path) -> None:
    async with running(gossip_configs(tmp_path, metrics=True)) as c:
        # n3 pushes a rumor claiming n1 as its origin, signed with another key.
        forger = Ed25519Crypto(NodeId("n1"), private_key=Ed25519PrivateKey.generate(),
                               public_keys={}, mac_keys={})
        unsigned = Rumor(origin=NodeId("n1"), incarnation=1, seq=0, wave=0, seed=b"s",
                         payload=b"forged")
        forged = dataclasses.replace(unsigned, signature=forger.sign(unsigned))
        host_route = c.nodes["n2"].transport._deliver  # the route the reading tasks use
        assert host_route is not None
        await host_route(NodeId("n3"), RumorPush(rumors=(forged,)))
        counters = c.gossip("n2").counters()
        assert counters.get("dropped:bad_signature") == 1
        assert not delivered_at(c.gossip("n2"), b"forged")
        wanted = ('phalanx_service_events_total{event="dropped:bad_signature",node="n2",'
                  'service="gossip"} 1.0')
        port = c.nodes["n2"].metrics_port
        page = ""
        with trio.fail_after(10):  # the page's copy is refreshed every second
            while wanted not in page:
                page = await trio.to_thread.run_sync(_get, port)
                await trio.sleep(0.2)
        assert 'phalanx_service_state{name="incarnation",node="n2",service="gossip"}' in page


async def test_a_stopped_node_is_suspected_and_a_restart_rejoins_and_catches_up(
        tmp_path: Path) -> None:
    async with running(gossip_configs(tmp_path)) as c:
        first = c.gossip("n3").incarnation
        await c.stop("n3")

        def n3_is(status: tuple[str, ...]) -> bool:
            return all(c.gossip(n).membership()[NodeId("n3")][0] in status for n in ("n1", "n2"))

        await wait_for(lambda: n3_is(("SUSPECT", "DEAD")), within=10, what="n3 suspected")
        c.gossip("n1").publish(b"while n3 was down")
        await wait_for(lambda: delivered_at(c.gossip("n2"), b"while n3 was down"),
                       within=10, what="n2 delivered")
        await c.start("n3")
        restarted = c.gossip("n3").incarnation
        assert restarted > first
        stored = int((c.configs["n3"].data_dir / "services" / INCARNATION_FILE).read_text())
        assert stored == restarted
        await wait_for(lambda: delivered_at(c.gossip("n3"), b"while n3 was down"),
                       within=10, what="n3 caught up by anti-entropy")
        await wait_for(lambda: n3_is(("ALIVE",)) and all(
            c.gossip(n).membership()[NodeId("n3")][1] >= restarted for n in ("n1", "n2")),
            within=10, what="n3 alive again at its new incarnation")


def test_config_round_trip_and_errors(tmp_path: Path) -> None:
    config = gossip_configs(tmp_path, 3, tick_ms=30)[0]
    path = tmp_path / "nodes" / "n1.toml"
    path.write_text(dumps_toml(node_config_dict(config, relative_to=path.parent)))
    loaded = load_node_config(path)
    assert loaded.services["gossip"]["tick_ms"] == 30
    assert loaded.keys is not None
    text = path.read_text()
    assert text.count("tick_ms = 30") == 1  # [gossip]'s ([timing] has 10)
    path.write_text(text.replace("tick_ms = 30", "tick_ms = 30\ntickms = 5"))
    with pytest.raises(ConfigError, match=r"unknown key 'tickms' in \[gossip\].*tick_ms"):
        load_node_config(path)
    path.write_text(text.replace("tick_ms = 30", "tick_ms = 0"))
    with pytest.raises(ConfigError, match=r"gossip.tick_ms: must be >= 1"):
        load_node_config(path)
    path.write_text(text.replace("enabled = true", "enabled = 1"))
    with pytest.raises(ConfigError, match=r"gossip.enabled: expected bool"):
        load_node_config(path)


async def test_gossip_without_signing_keys_is_a_clear_error(tmp_path: Path) -> None:
    config = dataclasses.replace(gossip_configs(tmp_path, 3)[0], keys=None)
    with pytest.raises(NodeError, match=r"\[gossip\] needs every node's signing key"):
        async with open_node(config, rng=random.Random(1)):
            pass

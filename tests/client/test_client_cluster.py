"""phalanx.Client against a real in-process 3-node Raft cluster (`phalanx.runtime.node.open_node`)
over loopback TLS: the KV helpers end to end, pipelined writes, and a leader crash."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from phalanx.client.async_client import Client, open_client
from phalanx.net.transport import Backoff
from phalanx.ops import pki
from phalanx.ops.node_config import Address, NodeConfig, PeerConfig, TimingConfig, TlsFiles
from phalanx.ops.ports import free_ports
from phalanx.runtime.identity import prepare_data_dir
from phalanx.runtime.node import Node, open_node

HOST = "127.0.0.1"
GUARD = 30  # seconds: a hang guard only


def configs(root: Path, ids: tuple[str, ...]) -> tuple[list[NodeConfig], pki.CredentialPaths]:
    ca = pki.create_ca()
    ports = free_ports(2 * len(ids))
    peer = {i: Address(host=HOST, port=ports[k]) for k, i in enumerate(ids)}
    client = {i: Address(host=HOST, port=ports[len(ids) + k]) for k, i in enumerate(ids)}
    out = []
    for node_id in ids:
        paths = pki.write_credentials(pki.issue_node_cert(ca, node_id), root / "nodes" / node_id)
        prepare_data_dir(root / "data" / node_id, node=node_id,
                         ca_certificate=paths.ca_certificate)
        out.append(NodeConfig(
            id=node_id, protocol="raft", data_dir=root / "data" / node_id,
            peer_listen=peer[node_id], client_listen=client[node_id], metrics_listen=None,
            tls=TlsFiles(ca=paths.ca_certificate, cert=paths.certificate, key=paths.private_key),
            peers=tuple(PeerConfig(id=o, peer_addr=peer[o], client_addr=client[o])
                        for o in ids if o != node_id),
            timing=TimingConfig(tick_ms=10, election_ticks=10, heartbeat_ticks=1),
        ))
    creds = pki.write_credentials(pki.issue_client_cert(ca, "tester"), root / "clients")
    return out, creds


class Cluster:
    def __init__(self, nursery: trio.Nursery, configs: list[NodeConfig]) -> None:
        self.nursery = nursery
        self.configs = {c.id: c for c in configs}
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    async def start(self, node_id: str) -> None:
        async def run(task_status: trio.TaskStatus[Node]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[node_id] = scope
                async with open_node(self.configs[node_id]) as node:
                    task_status.started(node)
                    await trio.sleep_forever()

        self.nodes[node_id] = await self.nursery.start(run)

    def stop(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]


@asynccontextmanager
async def cluster(root: Path) -> AsyncIterator[tuple[Cluster, Client]]:
    node_configs, creds = configs(root, ("n1", "n2", "n3"))
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, node_configs)
            for config in node_configs:
                await c.start(config.id)
            addresses = [(n.id, n.client_listen.host, n.client_listen.port) for n in node_configs]
            context = pki.client_context(creds.ca_certificate, certificate=creds.certificate,
                                         private_key=creds.private_key, check_hostname=False)
            async with open_client(addresses, ssl_context=context, timeout=10.0,
                                   client_id=pki.new_client_id(creds.certificate),
                                   attempt_timeout=1.0,
                                   backoff=Backoff(base=0.01, cap=0.2)) as client:
                yield c, client
            nursery.cancel_scope.cancel()


async def test_kv_end_to_end_on_a_real_cluster(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (c, client):
        await client.put("user/1", b"ada")
        await client.put("user/2", b"bob")
        assert await client.get("user/1") == b"ada"
        assert await client.cas("user/1", b"nope", b"x") is False
        assert await client.cas("user/1", b"ada", b"alan") is True
        assert await client.delete("user/2") is True
        assert await client.delete("user/2") is False
        assert await client.scan("user/") == [("user/1", b"alan")]
        leader = client.leader
        assert c.nodes[leader].core_status().role == "leader"
        status = await client.status(leader)
        assert status.role == "leader"
        # Pipelined concurrent writes over the one connection; each applied exactly once.
        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(client.put, f"p/{i:02}", str(i).encode())
        items = await client.scan("p/", limit=100)
        assert [k for k, _ in items] == [f"p/{i:02}" for i in range(64)]
        stats = client.statistics()
        assert stats.connections_opened <= 3
        # A stale read goes to the node the client talks to (the leader), which applied it.
        assert await client.get("user/1", stale=True) == b"alan"


async def test_client_follows_a_leader_change(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (c, client):
        await client.put("k", b"1")
        old = client.leader
        c.stop(old)
        # The client learns of the failure, rotates, follows redirects to the new leader.
        assert await client.cas("k", b"1", b"2") is True
        assert client.leader != old
        assert await client.get("k") == b"2"
        await c.start(old)
        await client.put("k", b"3")
        assert await client.get("k") == b"3"

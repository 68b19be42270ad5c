"""The leaderless core on a real in-process 4-node cluster (`cluster init --protocol
leaderless` configs, TLS sockets, Ed25519 node and client keys): KV through `phalanx.Client`
(signed transactions, f+1 matching outcomes), STALE reads, an equivocating endorser
(`open_node(byzantine="equivocate")`, the spec's `ByzantineSupport`), and a node restart that
replays its WAL and catches up without a storage failure."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from phalanx.client.async_client import open_client
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig, NodeConfig, load_node_config
from phalanx.runtime.node import Node, open_node

GUARD = 60  # seconds: a hang guard only


class Cluster:
    def __init__(self, nursery: trio.Nursery, cluster: ClusterConfig) -> None:
        self.nursery = nursery
        self.configs: dict[str, NodeConfig] = {
            n.id: load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes}
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    async def start(self, node_id: str) -> None:
        async def run(task_status: trio.TaskStatus[Node]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[node_id] = scope
                liar = "equivocate" if node_id == "n4" else None
                async with open_node(self.configs[node_id], rng=random.Random(1),
                                     byzantine=liar) as node:
                    task_status.started(node)
                    await trio.sleep_forever()

        self.nodes[node_id] = await self.nursery.start(run)

    def stop(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]

    def values(self, node_id: str, keys: list[str]) -> list[bytes | None]:
        machine = self.nodes[node_id].replica.machine
        return [machine.get(k) for k in keys]  # type: ignore[attr-defined]


@asynccontextmanager
async def running(cluster: ClusterConfig) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        c = Cluster(nursery, cluster)
        for n in cluster.nodes:
            await c.start(n.id)
        try:
            yield c
        finally:
            nursery.cancel_scope.cancel()


def test_kv_stale_reads_and_a_restart_that_replays_the_wal(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", protocol="leaderless", nodes=4,
                           base_port=find_free_base_port(4))
    keys = ["k", "n", "s"]

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with running(cluster) as c, open_client(cluster, timeout=10) as client:
                await client.put("k", b"v1")
                for _ in range(3):
                    await client.add("n", 1)
                await client.sadd("s", b"a")
                assert await client.get("k") == b"v1"
                assert await client.get("k", stale=True) == b"v1"  # the bare STALE query
                c.stop("n3")
                await client.put("k", b"v2")
                await client.add("n", 1)
                await c.start("n3")
                # The restarted replica replayed its WAL before the core was built.
                assert c.values("n3", ["k"]) == [b"v1"]
                await client.sadd("s", b"b")
                assert await client.smembers("s") == [b"a", b"b"]
                # Every node converges, the restarted n3 too (it may learn the last sadd
                # after the client's f+1 answers: from the peers' committed digests).
                for _ in range(200):
                    states = {n: c.values(n, keys) for n in c.nodes}
                    if (len({tuple(v) for v in states.values()}) == 1
                            and states["n1"][:2] == [b"v2", b"4"]):
                        break
                    await trio.sleep(0.05)
                assert len({tuple(v) for v in states.values()}) == 1, states
                assert states["n1"][:2] == [b"v2", b"4"], states
                assert c.nodes["n3"].driver.stats.storage_failures == 0
                lies = c.nodes["n4"].driver.core.lies  # type: ignore[attr-defined]
                assert lies.get("equivocate", 0) > 0

    trio.run(main)


def test_a_client_key_the_nodes_do_not_hold_is_refused_at_once(tmp_path: Path) -> None:
    """A transaction signed with a key missing from the nodes' keyring gets f+1 matching
    errors naming the signature (`Rejection.invalid`), not retries until a timeout."""
    from phalanx.client.errors import RequestRejected
    from phalanx.ops.signing_keys import TransactionSigner

    cluster = init_cluster(tmp_path / "c", protocol="leaderless", nodes=4,
                           base_port=find_free_base_port(4))
    stranger = TransactionSigner("client", bytes(range(32)))  # the keyring's name, wrong key

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with running(cluster) as c, open_client(cluster, timeout=10,
                                                          signer=stranger) as client:
                started = trio.current_time()
                with pytest.raises(RequestRejected, match="signature does not verify"):
                    await client.put("k", b"v", requirements={"k": b""})
                assert trio.current_time() - started < 5  # not the 10 s call timeout
                assert all(c.values(n, ["k"]) == [None] for n in c.nodes)

    trio.run(main)

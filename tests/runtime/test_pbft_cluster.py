"""PBFT on a real in-process 4-node cluster (`cluster init --protocol pbft` configs, real TLS
sockets, Ed25519 keys from the key files): KV through `phalanx.Client` (f+1 matching
replies), a Byzantine replica (equivocating primary, lying replier), a primary crash
followed by a view change, and a restart from the durable core state."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from phalanx.client.async_client import Client, open_client
from phalanx.consensus.pbft import PbftStatus
from phalanx.consensus.pbft.messages import Prepare
from phalanx.consensus.types import NodeId
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig, NodeConfig, load_node_config
from phalanx.ops.signing_keys import load_crypto
from phalanx.protocols import ProtocolError
from phalanx.protocols import get as get_protocol
from phalanx.runtime.node import Node, NodeError, open_node
from phalanx.runtime.persistence import DurableState

HOST = "127.0.0.1"
GUARD = 60  # seconds: a hang guard only


def make_pbft_cluster(root: Path) -> ClusterConfig:
    return init_cluster(root / "c", protocol="pbft", nodes=4, base_port=find_free_base_port(4))


class Cluster:
    def __init__(self, nursery: trio.Nursery, cluster: ClusterConfig,
                 byzantine: dict[str, str] | None = None) -> None:
        self.nursery = nursery
        self.cluster = cluster
        self.configs: dict[str, NodeConfig] = {
            n.id: load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes}
        self.byzantine = byzantine or {}
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.closed: dict[str, trio.Event] = {}

    async def start(self, node_id: str) -> None:
        previous = self.closed.get(node_id)
        if previous is not None:  # a stopped incarnation releases its data directory first
            await previous.wait()
        closed = self.closed[node_id] = trio.Event()

        async def run(task_status: trio.TaskStatus[Node]) -> None:
            try:
                with trio.CancelScope() as scope:
                    self.scopes[node_id] = scope
                    # Seeded: under "byz-0" the equivocating primary sends the other batch
                    # to two of its three peers (an unlucky OS seed may pick none of them).
                    async with open_node(self.configs[node_id], rng=random.Random("byz-0"),
                                         byzantine=self.byzantine.get(node_id)) as node:
                        task_status.started(node)
                        await trio.sleep_forever()
            finally:
                closed.set()

        self.nodes[node_id] = await self.nursery.start(run)

    def stop(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]

    def view(self, node_id: str) -> int:
        status = self.nodes[node_id].core_status()
        assert isinstance(status, PbftStatus)
        return status.view


@asynccontextmanager
async def running(cluster: ClusterConfig,
                  byzantine: dict[str, str] | None = None) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        c = Cluster(nursery, cluster, byzantine)
        for n in cluster.nodes:
            await c.start(n.id)
        try:
            yield c
        finally:
            nursery.cancel_scope.cancel()


def test_cluster_init_writes_pbft_keys_that_load(tmp_path: Path) -> None:
    cluster = make_pbft_cluster(tmp_path)
    cryptos = {n.id: load_crypto(load_node_config(cluster.node_config_path(n.id)))
               for n in cluster.nodes}
    vote = Prepare(view=0, seq=1, digest=b"d" * 32, replica=NodeId("n1"))
    other = Prepare(view=0, seq=2, digest=b"d" * 32, replica=NodeId("n1"))
    signature = cryptos["n1"].sign(vote)
    assert all(c.verify(NodeId("n1"), vote, signature) for c in cryptos.values())
    assert not cryptos["n2"].verify(NodeId("n1"), other, signature)
    assert not cryptos["n2"].verify(NodeId("n3"), vote, signature)
    # Pairwise MAC keys agree at both ends and differ between pairs.
    tag = cryptos["n1"].mac(NodeId("n2"), vote)
    assert cryptos["n2"].verify_mac(NodeId("n1"), vote, tag)
    assert not cryptos["n3"].verify_mac(NodeId("n1"), vote, tag)
    key_file = cluster.directory / "nodes" / "n1.signing.key"
    assert key_file.stat().st_mode & 0o077 == 0


def test_byzantine_mode_is_refused_on_raft(tmp_path: Path) -> None:
    raft = init_cluster(tmp_path / "r", protocol="raft", nodes=3, base_port=find_free_base_port(4))
    config = load_node_config(raft.node_config_path("n1"))
    durable = DurableState(hard_state=None, snapshot=None, snapshot_data=None, entries=())
    with pytest.raises(ProtocolError, match="crashes only"):
        get_protocol("raft").node.load().build_core(
            config, durable=durable, rng=random.Random(1), byzantine="equivocate",
            pipeline_depth=2)

    async def main() -> None:
        with pytest.raises(NodeError, match=r"raft has no Byzantine modes .*pbft"):
            async with open_node(config, byzantine="equivocate"):
                pass

    trio.run(main)


async def _kv_round(client: Client, prefix: str, count: int) -> None:
    for i in range(count):
        await client.put(f"{prefix}{i}", f"v{i}".encode())
    for i in range(count):
        assert await client.get(f"{prefix}{i}") == f"v{i}".encode()


def test_four_nodes_serve_kv_and_survive_a_restart(tmp_path: Path) -> None:
    cluster = make_pbft_cluster(tmp_path)

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with running(cluster) as c, open_client(cluster, timeout=20) as client:
                await _kv_round(client, "k", 10)
                assert await client.cas("k0", b"v0", b"new")
                assert not await client.cas("k0", b"v0", b"newer")
                assert await client.get("k0") == b"new"
                # A backup restarts from its durable core state and catches up.
                c.stop("n3")
                await client.put("while-down", b"1")
                await c.start("n3")
                await _kv_round(client, "after", 5)
                applied = {n: node.driver.applied_index for n, node in c.nodes.items()}
                assert min(applied.values()) > 0
                # Requests went to the primary alone (the backups answered them unasked).
                assert client.statistics().primary_only > 0

    trio.run(main)


@pytest.mark.parametrize("mode", ["equivocate", "corrupt_reply", "silent"])
def test_byzantine_primary_or_replier_cannot_break_results(tmp_path: Path, mode: str) -> None:
    # "silent": a primary that ignores every request. Clients send to the primary alone
    # once they know it; the retransmission to every replica starts the backups'
    # view-change timers, and the next primary orders the request.
    cluster = make_pbft_cluster(tmp_path)

    async def main() -> None:
        with trio.fail_after(GUARD):
            # n1 is the primary of view 0: equivocation hits the normal case at once.
            async with running(cluster, {"n1": mode}) as c, \
                    open_client(cluster, timeout=30) as client:
                await _kv_round(client, "b", 8)
                assert await client.cas("b1", b"v1", b"x")
                assert await client.get("b1") == b"x"
                if mode == "equivocate":
                    mutations = c.nodes["n1"].driver.core.mutations  # type: ignore[attr-defined]
                    assert mutations.get("equivocate", 0) > 0
                if mode == "silent":
                    assert all(c.view(n) >= 1 for n in ("n2", "n3", "n4"))

    trio.run(main)


def test_primary_crash_view_change_then_progress(tmp_path: Path) -> None:
    cluster = make_pbft_cluster(tmp_path)

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with running(cluster) as c, open_client(cluster, timeout=30) as client:
                await _kv_round(client, "p", 3)
                assert c.view("n2") == 0
                c.stop("n1")  # the primary of view 0
                start = time.monotonic()
                await client.put("after-crash", b"1")
                elapsed = time.monotonic() - start
                assert all(c.view(n) >= 1 for n in c.nodes)
                assert await client.get("after-crash") == b"1"
                assert await client.get("p2") == b"v2"
                print(f"view change: primary stop -> first commit in {elapsed:.3f} s")

    trio.run(main)

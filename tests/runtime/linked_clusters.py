"""Two linked clusters of in-process nodes for the inter-cluster services' runtime tests
(`test_clustersend_runtime.py`, `test_announce_runtime.py`): made with `cluster init` on
non-overlapping ports, linked with `phalanx.ops.link`, every node run under one nursery."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from phalanx.ops.link import link_clusters
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig, NodeConfig, load_node_config
from phalanx.runtime.node import Node, open_node


class LinkedNodes:
    """The running nodes, by (cluster name, node id)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.nodes: dict[tuple[str, str], Node] = {}
        self.scopes: dict[tuple[str, str], trio.CancelScope] = {}

    async def start(self, name: str, config: NodeConfig) -> None:
        async def run(task_status: trio.TaskStatus[Node]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[(name, config.id)] = scope
                async with open_node(config, rng=random.Random(f"{name}-{config.id}")) as node:
                    task_status.started(node)
                    await trio.sleep_forever()

        self.nodes[(name, config.id)] = await self.nursery.start(run)

    def kill(self, name: str, node: str) -> None:
        self.scopes[(name, node)].cancel()
        del self.nodes[(name, node)]

    def service(self, name: str, node: str, service: str) -> Any:
        return self.nodes[(name, node)].services[service]


N = TypeVar("N", bound=LinkedNodes)


def node_configs(cluster: ClusterConfig) -> list[NodeConfig]:
    return [load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes]


@contextlib.asynccontextmanager
async def running(kind: type[N], *clusters: tuple[str, ClusterConfig],
                  configs: Callable[[ClusterConfig], list[NodeConfig]] = node_configs,
                  ) -> AsyncIterator[N]:
    """Every node of `clusters` (name, config) running, as a `kind` (a `LinkedNodes`)."""
    async with trio.open_nursery() as nursery:
        c = kind(nursery)
        for name, cluster in clusters:
            for config in configs(cluster):
                await c.start(name, config)
        try:
            yield c
        finally:
            nursery.cancel_scope.cancel()


def two_linked_clusters(root: Path, a: tuple[str, int], b: tuple[str, int],
                        **init: Any) -> tuple[ClusterConfig, ClusterConfig, str, str]:
    """Clusters `root/a` and `root/b` of (protocol, nodes), made with `init` (e.g.
    ``services=("clustersend",)``) and linked; returns them and their cluster ids."""
    base_a = find_free_base_port(a[1])
    base_b = base_a
    while abs(base_b - base_a) < 300:  # the two layouts (base..base+203) must not overlap
        base_b = find_free_base_port(b[1])
    made = [init_cluster(root / name, protocol=protocol, nodes=n, base_port=base, **init)
            for name, (protocol, n), base in (("a", a, base_a), ("b", b, base_b))]
    la, lb = link_clusters(made[0].directory, made[1].directory)
    return made[0], made[1], la.cluster_id, lb.cluster_id


__all__ = ["LinkedNodes", "node_configs", "running", "two_linked_clusters"]

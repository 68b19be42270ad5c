"""A real local cluster wired through fault-injection proxies, for the Jepsen harness.

Owns:
    `open_real_cluster(directory, ...)`: `phalanx.cluster.init_cluster` in `directory`, a
    `ProxyNetwork` with one proxy per directed peer link, every node config rewritten so
    that node ``a`` dials peer ``b`` at the proxy of link ``a → b`` (``peers[].peer_addr``;
    ``b`` still listens on its own ``node.peer_listen``), then the node processes. Yields a
    `RealCluster`: the config, the processes, the proxies, an admin client and helpers to
    find the leader and wait for recovery. On exit: paused nodes are continued, every node
    is stopped (SIGTERM, then SIGKILL after a grace period) and the proxies close.

Rules:
    * Nodes are separate processes (``python -m phalanx node run``) started with
      ``PHALANX_TEST_HOOKS=1`` in their environment (test-only hooks; off by default), and
      with ``volatile_writes`` also ``PHALANX_VOLATILE_WRITES=1``: their storage keeps
      un-fsynced appends in memory (`phalanx.storage.volatile`), so a SIGKILL loses them.
      ``PHALANX_TEST_CONTROL_DIR`` is the cluster's ``run/`` folder, where the nemesis writes
      each node's clock-rate control file (`phalanx.test_hooks`).
    * Must not import the runtime or consensus cores: it talks to nodes only through the
      client and signals.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from phalanx.client import Client, ClientError, open_client
from phalanx.cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.config import (
    Address,
    ClusterConfig,
    TimingConfig,
    dumps_toml,
    load_node_config,
    node_config_dict,
)
from phalanx.consensus.quorum import max_byzantine_faults
from phalanx.jepsen.harness.proxy import ProxyNetwork

HOOKS_ENV = "PHALANX_TEST_HOOKS"
VOLATILE_ENV = "PHALANX_VOLATILE_WRITES"
CONTROL_DIR_ENV = "PHALANX_TEST_CONTROL_DIR"
STATUS_TIMEOUT = 0.5
HARNESS_TIMING = TimingConfig(tick_ms=10, election_ticks=30, heartbeat_ticks=2)
"""Election timeout 300..600 ms: five Python nodes and the harness share a couple of cores."""


class ClusterUnavailable(Exception):
    """The cluster did not reach the awaited state (a leader, recovery) in time."""


@dataclass(slots=True)
class RealCluster:
    """A running cluster under test; see `open_real_cluster`."""

    config: ClusterConfig
    procs: NodeProcesses
    network: ProxyNetwork
    admin: Client
    paused: set[str] = field(default_factory=set)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.config.nodes)

    def data_dir(self, node: str) -> Path:
        return self.config.directory / "data" / node

    async def statuses(self, nodes: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The `StatusReply` of every node that answers within `STATUS_TIMEOUT`."""
        out: dict[str, Any] = {}

        async def ask(node: str) -> None:
            with contextlib.suppress(ClientError), trio.move_on_after(STATUS_TIMEOUT):
                out[node] = await self.admin.status(node)

        async with trio.open_nursery() as nursery:
            for n in nodes if nodes is not None else self.nodes:
                nursery.start_soon(ask, n)
        return out

    async def leader(self) -> str | None:
        """The node that reports itself leader (Raft) or active primary (PBFT) in the highest
        term or view, if any answers."""
        best: tuple[int, str] | None = None
        for s in (await self.statuses()).values():
            if s.role in LEADER_ROLES and (best is None or s.term > best[0]):
                best = (s.term, s.node)
        return None if best is None else best[1]

    async def wait_for_leader(self, within: float) -> str:
        with trio.move_on_after(within):
            while True:
                if (found := await self.leader()) is not None:
                    return found
                await trio.sleep(0.05)
        raise ClusterUnavailable(f"no leader within {within:g} s")

    async def wait_recovered(self, within: float, *, min_commit: int = 1) -> None:
        """Until a leader exists, every node answers, the leader's commit index is at least
        `min_commit` (a leader that never committed anything has not recovered anything) and
        enough nodes have applied it: all of them for Raft; n - f for PBFT, which tolerates f
        replicas lagging (a lagging PBFT replica catches up at the next stable checkpoint, and
        without traffic there may be none)."""
        n = len(self.nodes)
        needed = n - max_byzantine_faults(n) if self.config.protocol == "pbft" else n
        with trio.move_on_after(within):
            while True:
                st = await self.statuses()
                leaders = [s for s in st.values() if s.role in LEADER_ROLES]
                if len(st) == n and leaders:
                    target = max(s.commit_index for s in leaders)
                    caught_up = sum(1 for s in st.values() if s.applied_index >= target)
                    if target >= min_commit and caught_up >= needed:
                        return
                await trio.sleep(0.1)
        raise ClusterUnavailable(f"cluster did not recover within {within:g} s")


LEADER_ROLES = ("leader", "primary")
"""Status roles of the node that orders requests: Raft's leader, PBFT's active primary."""


def _route_through_proxies(config: ClusterConfig, network: ProxyNetwork) -> None:
    for me in config.nodes:
        path = config.node_config_path(me.id)
        cfg = load_node_config(path)
        peers = tuple(
            replace(p, peer_addr=Address(host=h, port=port))
            for p in cfg.peers
            for h, port in [network.address(me.id, p.id)]
        )
        doc = node_config_dict(replace(cfg, peers=peers), relative_to=path.parent)
        path.write_text(dumps_toml(doc))


@contextlib.asynccontextmanager
async def open_real_cluster(
    directory: Path,
    *,
    nodes: int,
    protocol: str = "raft",
    rng: random.Random,
    timing: TimingConfig = HARNESS_TIMING,
    checkpoint_every: int = 500,
    client_timeout: float = 2.0,
    volatile_writes: bool = False,
) -> AsyncIterator[RealCluster]:
    """Create, start and finally stop a proxied cluster in `directory` (see module docstring)."""
    config = init_cluster(directory, protocol=protocol, nodes=nodes,
                          base_port=find_free_base_port(nodes), fsync="group", timing=timing,
                          checkpoint_every=checkpoint_every)
    targets = {n.id: (n.peer_addr.host, n.peer_addr.port) for n in config.nodes}
    network = ProxyNetwork(targets, rng=random.Random(rng.getrandbits(64)))
    env = dict(os.environ)
    env[HOOKS_ENV] = "1"
    env.pop(VOLATILE_ENV, None)
    env[CONTROL_DIR_ENV] = str(config.directory / "run")
    if volatile_writes:
        env[VOLATILE_ENV] = "1"
    procs = NodeProcesses(config, env=env)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.serve)
        _route_through_proxies(config, network)
        try:
            procs.start()
            async with open_client(config, timeout=client_timeout,
                                   attempt_timeout=STATUS_TIMEOUT) as admin:
                yield RealCluster(config=config, procs=procs, network=network, admin=admin)
        finally:
            for node in config.nodes:
                with contextlib.suppress(Exception):
                    if procs.running(node.id):
                        procs.signal(node.id, signal.SIGCONT)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: procs.stop(grace=5.0))
            nursery.cancel_scope.cancel()

"""A real local cluster wired through fault-injection proxies, for the Jepsen harness.

Owns:
    `open_real_cluster(directory, ...)`: `phalanx.ops.local_cluster.init_cluster` in `directory`, a
    `ProxyNetwork` with one proxy per directed peer link, every node config rewritten so
    that node ``a`` dials peer ``b`` at the proxy of link ``a → b`` (``peers[].peer_addr``;
    ``b`` still listens on its own ``node.peer_listen``), then the node processes. Yields a
    `RealCluster`: the config, the processes, the proxies, an admin client and helpers to
    find the leader and wait for recovery. On exit: paused nodes are continued, every node
    is stopped (SIGTERM, then SIGKILL after a grace period) and the proxies close.

Byzantine replicas (PBFT, `phalanx.jepsen.harness.byzantine_plan.ByzantinePlan`):
    * a node with a mode runs ``phalanx node run CONFIG --byzantine MODE`` (every start,
      restarts included);
    * a twinned node ``t`` runs two processes with one identity, certificate and signing
      key: twin A is ``t`` itself, twin B (instance ``t-b``) has its own config, data, log
      and listen ports under ``twins/``. The transport keeps one inbound connection per
      certificate identity and a newer one closes the older (`phalanx.net.transport`), so
      two twins dialling one peer would evict each other forever; instead the proxies
      split the cluster (`twin_routes`): each honest replica of side A reaches twin A,
      each of side B twin B, and a twin's links to the other side are refused for the
      whole run, so every replica only ever sees one twin. Clients split too
      (`RealCluster.client_config`). Kills, pauses and restarts of ``t`` act on both
      processes (`ClusterProcesses`).
    * `RealCluster.wait_recovered` waits for honest replicas only.

Rules:
    * Nodes are separate processes (``python -m phalanx node run``) started with
      ``PHALANX_TEST_HOOKS=1`` in their environment (test-only hooks; off by default), and
      with ``volatile_writes`` also ``PHALANX_VOLATILE_WRITES=1``: their storage keeps
      un-fsynced appends in memory (`phalanx.storage.volatile`), so a SIGKILL loses them.
      ``PHALANX_TEST_CONTROL_DIR`` is the cluster's ``run/`` folder, where the nemesis writes
      each node's clock-rate control file (`phalanx.runtime.fault_hooks`).
    * Must not import the runtime or consensus cores: it talks to nodes only through the
      client and signals.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from phalanx.appspec import DEFAULT_APP
from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.jepsen.harness.byzantine_plan import ByzantinePlan
from phalanx.jepsen.harness.proxy import Link, ProxyNetwork
from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.local_cluster import (
    CLIENT_PORT_OFFSET,
    ClusterError,
    NodeProcesses,
    find_free_base_port,
    init_cluster,
    node_command,
)
from phalanx.ops.node_config import (
    Address,
    ClusterConfig,
    TimingConfig,
    load_node_config,
)
from phalanx.protocols import DEFAULT_PROTOCOL, CallStrategy, FaultModel
from phalanx.protocols import get as get_protocol

TWIN_B_SUFFIX = "-b"
"""Twin B of node ``n3`` is the process instance ``n3-b`` (twin A keeps the node's name)."""
TWINS_DIR = "twins"
"""Twin B processes live in ``<cluster>/twins/`` (``nodes/``, ``data/``, ``logs/``, ``run/``)."""
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
    procs: ClusterProcesses
    network: ProxyNetwork
    admin: Client
    byzantine: ByzantinePlan = field(default_factory=ByzantinePlan)
    twin_config: ClusterConfig | None = None
    """The client view in which every twinned node is its twin B (None: no twins)."""
    paused: set[str] = field(default_factory=set)
    outside: set[str] = field(default_factory=set)
    """Nodes outside the membership now: spares not added yet, removed nodes (the
    ``membership`` nemesis, `phalanx.jepsen.harness.membership_real`). Recovery waits for
    the others only."""
    retired: set[str] = field(default_factory=set)
    """Removed nodes: stopped for good (never restarted by the nemesis or the heal)."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.config.nodes)

    def data_dir(self, node: str) -> Path:
        return self.config.directory / "data" / node

    @property
    def honest(self) -> tuple[str, ...]:
        """The members that do not lie (nodes `outside` the membership left out)."""
        return self.byzantine.honest(tuple(n for n in self.nodes if n not in self.outside))

    def client_config(self, slot: int) -> ClusterConfig:
        """The config client `slot` uses: with twins, odd slots reach twin B of every
        twinned node (its requests then enter twin B's side: clients split too)."""
        if self.twin_config is not None and slot % 2:
            return self.twin_config
        return self.config

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

    async def node_status(self) -> dict[str, dict[str, object]]:
        """Every process's status now (twin B of ``n3`` as ``n3-b``), for the results:
        role, view/term, commit and applied index, newest checkpoint, dropped messages.
        A process that does not answer is missing."""
        out: dict[str, dict[str, object]] = {}

        def doc(s: Any) -> dict[str, object]:
            return {"role": s.role, "term": s.term, "commit_index": s.commit_index,
                    "applied_index": s.applied_index, "last_checkpoint": s.last_checkpoint,
                    "dropped_messages": s.dropped_messages}

        for node, s in sorted((await self.statuses()).items()):
            out[node] = doc(s)
        if self.twin_config is not None:
            async with open_client(self.twin_config, timeout=STATUS_TIMEOUT,
                                   attempt_timeout=STATUS_TIMEOUT) as twins:
                for node in self.byzantine.twins:
                    with contextlib.suppress(ClientError), trio.move_on_after(STATUS_TIMEOUT):
                        out[node + TWIN_B_SUFFIX] = doc(await twins.status(node))
        return out

    async def leader(self) -> str | None:
        """The node that reports the protocol's `leader_role` (Raft's leader, PBFT's active
        primary) in the highest term or view, if any answers."""
        leader_role = get_protocol(self.config.protocol).leader_role
        best: tuple[int, str] | None = None
        for s in (await self.statuses()).values():
            if s.role == leader_role and (best is None or s.term > best[0]):
                best = (s.term, s.node)
        return None if best is None else best[1]

    async def wait_for_leader(self, within: float) -> str:
        with trio.move_on_after(within):
            while True:
                if (found := await self.leader()) is not None:
                    return found
                await trio.sleep(0.05)
        raise ClusterUnavailable(f"no leader within {within:g} s{self._dead_nodes()}")

    def _dead_nodes(self) -> str:
        """``; n2 exited: <its last log line>`` for every node process that is not running."""
        notes = []
        for node in self.nodes:
            if not self.procs.running(node) and node not in self.retired:
                log = self.config.directory / "logs" / f"{node}.log"
                text = log.read_text(errors="replace") if log.is_file() else ""
                # The last line that says something (a traceback ends in box drawing).
                lines = [ln.strip(" |+-") for ln in text.splitlines()]
                said = [ln for ln in lines if ln]
                notes.append(f"; {node} exited: {said[-1] if said else 'no log'}")
        return "".join(notes)

    async def wait_recovered(self, within: float, *, min_commit: int = 1) -> None:
        """Until a leader exists, every honest node answers, the commit index is at least
        `min_commit` (a leader that never committed anything has not recovered anything) and
        enough honest nodes have applied it.

        Raft: every node, up to the leader's commit index. PBFT: the target is the highest
        commit index an honest replica reports (a Byzantine replica's status is not trusted)
        and n - f - K honest replicas must have applied it, K the Byzantine ones: f replicas
        may lag (one catches up at the next stable checkpoint, and without traffic there may
        be none), and of the 2f+1 replicas of a commit quorum up to K may be liars, so
        n - f - K >= f + 1 honest ones are guaranteed to hold each decision.

        Signed transactions (`CallStrategy.ENDORSEMENT`, the leaderless core): indexes are
        each node's own (its release order), so a node is caught up when it applied all it
        released (applied = commit) and the same n - f - K honest nodes must be; whether they
        hold the same state is what the final (linearizable) reads and the checkers see."""
        n = len(self.nodes) - len(self.outside)
        honest = self.honest
        spec = get_protocol(self.config.protocol)
        byzantine_model = spec.fault_model is FaultModel.BYZANTINE
        local_indexes = spec.call_strategy is CallStrategy.ENDORSEMENT
        # Byzantine: n - f - K honest replicas (see above); crash: every node.
        needed = max(1, n - spec.max_faults(n) - len(self.byzantine.nodes)
                     if byzantine_model else n)
        with trio.move_on_after(within):
            while True:
                st = await self.statuses()
                leaders = [s for s in st.values() if s.role == spec.leader_role]
                good = [st[h] for h in honest if h in st]
                if len(good) == len(honest) and leaders and local_indexes:
                    caught_up = sum(1 for s in good if s.applied_index >= s.commit_index)
                    if max(s.commit_index for s in good) >= min_commit and caught_up >= needed:
                        return
                elif len(good) == len(honest) and leaders:
                    if byzantine_model:
                        target = max(s.commit_index for s in good)
                    else:
                        target = max(s.commit_index for s in leaders)
                    caught_up = sum(1 for s in good if s.applied_index >= target)
                    if target >= min_commit and caught_up >= needed:
                        return
                await trio.sleep(0.1)
        raise ClusterUnavailable(
            f"cluster did not recover within {within:g} s{self._dead_nodes()}")


class ClusterProcesses:
    """Every node process of a cluster: each node's own, plus twin B of twinned nodes.

    A signal, kill or start of a twinned node acts on both of its processes (the nemesis
    names nodes, not processes)."""

    def __init__(self, main: NodeProcesses, twins: NodeProcesses | None = None,
                 twinned: Sequence[str] = ()) -> None:
        self.main = main
        self.twins = twins
        self.twinned = tuple(sorted(twinned)) if twins is not None else ()

    def _twin(self, node: str) -> NodeProcesses | None:
        return self.twins if node in self.twinned else None

    def start(self, nodes: Sequence[str] | None = None) -> None:
        todo = list(nodes) if nodes is not None else list(self.main.node_ids)
        self.main.start(todo)
        if self.twins is not None:
            self.twins.start([n for n in todo if n in self.twinned])

    def running(self, node: str) -> bool:
        twin = self._twin(node)
        return self.main.running(node) or (twin is not None and twin.running(node))

    def kill(self, node: str) -> None:
        for procs in (self.main, self._twin(node)):
            if procs is not None and procs.running(node):
                procs.kill(node)

    def signal(self, node: str, signum: int) -> None:
        """`signum` to every running process of `node`; `ClusterError` if none runs."""
        sent = False
        for procs in (self.main, self._twin(node)):
            if procs is not None and procs.running(node):
                procs.signal(node, signum)
                sent = True
        if not sent:
            raise ClusterError(f"node {node} is not running")

    def stop(self, *, grace: float) -> None:
        self.main.stop(grace=grace)
        if self.twins is not None:
            self.twins.stop(grace=grace)


def _route_through_proxies(config: ClusterConfig, network: ProxyNetwork,
                           twins: ClusterConfig | None) -> None:
    """Point every node config (and every twin B config) at its links' proxies."""
    configs = [(me.id, me.id, config.node_config_path(me.id)) for me in config.nodes]
    if twins is not None:
        configs += [(me.id + TWIN_B_SUFFIX, me.id, twins.node_config_path(me.id))
                    for me in twins.nodes if me.id + TWIN_B_SUFFIX in network.identities]
    for instance, node, path in configs:
        cfg = load_node_config(path)
        if cfg.id != node:
            raise ClusterError(f"{path} is node {cfg.id}, expected {node}")
        peers = tuple(
            replace(p, peer_addr=Address(host=h, port=port))
            for p in cfg.peers
            for h, port in [network.address(instance, p.id)]
        )
        doc = node_config_dict(replace(cfg, peers=peers), relative_to=path.parent)
        path.write_text(dumps_toml(doc))


def twin_routes(plan: ByzantinePlan, nodes: Sequence[str]) -> dict[Link, str | None]:
    """Where each link of a twinned cluster leads (`ProxyNetwork`'s `routes`).

    Side A is twin A of every twinned node plus `plan.side_a`; side B is every twin B plus
    the other nodes (honest or running a mode), as in `phalanx.jepsen.sim.pbft`. A link to
    a twinned node reaches the twin on the source's side; a twin's links to the other
    side's non-twinned nodes are refused (None) for the whole run."""
    twinned = set(plan.twins)
    side_a = set(plan.side_a)
    instances = [*sorted(nodes), *(t + TWIN_B_SUFFIX for t in plan.twins)]

    def side(instance: str) -> str:
        if instance.endswith(TWIN_B_SUFFIX):
            return "B"
        return "A" if instance in twinned or instance in side_a else "B"

    routes: dict[Link, str | None] = {}
    for a in instances:
        for b in sorted(nodes):
            if b in twinned:
                routes[(a, b)] = b if side(a) == "A" else b + TWIN_B_SUFFIX
            elif (a in twinned or a.endswith(TWIN_B_SUFFIX)) and side(a) != side(b):
                routes[(a, b)] = None
            else:
                routes[(a, b)] = b
    return routes


def _write_twin_configs(config: ClusterConfig, plan: ByzantinePlan,
                        base_port: int) -> ClusterConfig | None:
    """Twin B's node config of every twinned node under ``twins/``: the node's own config
    (identity, certificate, signing key, peers) with its own data folder and listen ports
    (``base_port + n + j`` for peers, plus the client offset). Returns the client view in
    which each twinned node's client address is its twin B's, or None without twins."""
    if not plan.twins:
        return None
    root = config.directory / TWINS_DIR
    n = len(config.nodes)
    addresses: dict[str, Address] = {}
    for j, node in enumerate(plan.twins):
        src = config.node_config_path(node)
        cfg = load_node_config(src)
        host = cfg.peer_listen.host
        client = Address(host=host, port=base_port + CLIENT_PORT_OFFSET + n + j)
        addresses[node] = client
        twin = replace(cfg, data_dir=root / "data" / node,
                       peer_listen=Address(host=host, port=base_port + n + j),
                       client_listen=client, metrics_listen=None)
        path = root / "nodes" / f"{node}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        twin.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps_toml(node_config_dict(twin, relative_to=path.parent)))
    nodes = tuple(replace(p, client_addr=addresses[p.id]) if p.id in addresses else p
                  for p in config.nodes)
    return replace(config, nodes=nodes, directory=root)


@dataclass(frozen=True, slots=True)
class PreparedCluster:
    """A cluster initialised on disk (`prepare_cluster`), not started yet."""

    config: ClusterConfig
    base_port: int


def prepare_cluster(directory: Path, *, nodes: int, protocol: str = DEFAULT_PROTOCOL,
                    timing: TimingConfig = HARNESS_TIMING, checkpoint_every: int = 500,
                    app: str = DEFAULT_APP, services: Sequence[str] = (),
                    extra_ports: int = 0, avoid: int | None = None,
                    protocol_options: Mapping[str, str] | None = None) -> PreparedCluster:
    """`init_cluster` in `directory` on free ports (`extra_ports` more for twins; at least
    300 ports away from `avoid`, another cluster's base port); `protocol_options` go into
    the ``[protocol]`` table (`cluster init --option`)."""
    base_port = find_free_base_port(nodes + extra_ports)
    while avoid is not None and abs(base_port - avoid) < 300:
        base_port = find_free_base_port(nodes + extra_ports)
    config = init_cluster(directory, protocol=protocol, nodes=nodes,
                          base_port=base_port, fsync="group", timing=timing,
                          checkpoint_every=checkpoint_every, app=app, services=services,
                          protocol_options=protocol_options)
    return PreparedCluster(config=config, base_port=base_port)


@contextlib.asynccontextmanager
async def open_real_cluster(
    directory: Path,
    *,
    nodes: int,
    protocol: str = DEFAULT_PROTOCOL,
    rng: random.Random,
    timing: TimingConfig = HARNESS_TIMING,
    checkpoint_every: int = 500,
    client_timeout: float = 2.0,
    volatile_writes: bool = False,
    byzantine: ByzantinePlan | None = None,
    app: str = DEFAULT_APP,
    prepared: PreparedCluster | None = None,
    protocol_options: Mapping[str, str] | None = None,
    spares: int = 0,
) -> AsyncIterator[RealCluster]:
    """Create, start and finally stop a proxied cluster in `directory` (see module docstring).

    `spares`: that many more nodes laid out by `phalanx.ops.add_node.add_node` before any
    starts (every config names them, through the proxies) and started with the others,
    outside the membership (`RealCluster.outside`) until the ``membership`` nemesis adds
    them.

    `byzantine`: nodes that run ``--byzantine MODE`` and nodes that are twinned (module
    docstring). `prepared`: a cluster `prepare_cluster` already initialised in `directory`
    (e.g. with services, linked to another one before either starts); `nodes`, `protocol`,
    `timing`, `checkpoint_every`, `app` and `protocol_options` are then ignored."""
    plan = byzantine if byzantine is not None else ByzantinePlan()
    if prepared is None:
        prepared = prepare_cluster(directory, nodes=nodes, protocol=protocol, timing=timing,
                                   checkpoint_every=checkpoint_every, app=app,
                                   extra_ports=len(plan.twins) + spares,
                                   protocol_options=protocol_options)
    config, base_port = prepared.config, prepared.base_port
    if spares:
        from phalanx.ops.add_node import add_node
        from phalanx.ops.local_cluster import open_cluster

        for _ in range(spares):
            add_node(config.directory)
        config = open_cluster(config.directory)
    twin_config = _write_twin_configs(config, plan, base_port)
    targets = {n.id: (n.peer_addr.host, n.peer_addr.port) for n in config.nodes}
    identities = {n: n for n in targets}
    if twin_config is not None:
        for t in plan.twins:
            cfg = load_node_config(twin_config.node_config_path(t))
            targets[t + TWIN_B_SUFFIX] = (cfg.peer_listen.host, cfg.peer_listen.port)
            identities[t + TWIN_B_SUFFIX] = t
    network = ProxyNetwork(
        targets, rng=random.Random(rng.getrandbits(64)), identities=identities,
        routes=twin_routes(plan, tuple(n.id for n in config.nodes)) if plan.twins else None)
    env = dict(os.environ)
    env[HOOKS_ENV] = "1"
    env.pop(VOLATILE_ENV, None)
    env[CONTROL_DIR_ENV] = str(config.directory / "run")
    if volatile_writes:
        env[VOLATILE_ENV] = "1"

    def command(config_path: Path) -> list[str]:
        mode = plan.mode_of(config_path.stem)
        return [*node_command(config_path), *(("--byzantine", mode) if mode else ())]

    procs = ClusterProcesses(
        NodeProcesses(config, env=env, command=command),
        NodeProcesses(twin_config, env=env) if twin_config is not None else None,
        plan.twins)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.serve)
        _route_through_proxies(config, network, twin_config)
        try:
            procs.start()
            async with open_client(config, timeout=client_timeout,
                                   attempt_timeout=STATUS_TIMEOUT) as admin:
                yield RealCluster(config=config, procs=procs, network=network, admin=admin,
                                  byzantine=plan, twin_config=twin_config,
                                  outside={n.id for n in config.nodes[-spares:]}
                                  if spares else set())
        finally:
            for node in config.nodes:
                with contextlib.suppress(Exception):
                    if procs.running(node.id):
                        procs.signal(node.id, signal.SIGCONT)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: procs.stop(grace=5.0))
            nursery.cancel_scope.cancel()

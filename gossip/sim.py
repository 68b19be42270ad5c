"""A deterministic simulator for gossip alone: n `GossipMachine`s, virtual ticks, seeded faults.

Owns: `SimConfig`, `GossipSim` (its own small event loop) and `adversarial_crashes` (the
crash set that hurts plain GP most). The consensus simulator (`phalanx.jepsen.sim`) is not
involved: this one only needs messages, ticks and crashes, and runs 1,000 nodes in seconds.

Model: one-way latency uniform in [latency_min, latency_max] ticks (random delivery order
when they differ), each message lost with probability `loss`; a crashed node neither
receives nor sends nor ticks; a restarted node is a new machine with a higher
incarnation; "silent" nodes are Byzantine forwarders that accept calls and acknowledge
them but never make a call nor answer a digest (their subtrees depend on anti-entropy and
on other instances). Time t: first every message due at t is delivered (heap order
(time, seq)), then every live node ticks, in sorted id order.

Determinism: one `random.Random(seed)` for the network, one per node derived from the seed
and the node id; no set iteration decides anything. Same config, same run.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.machine import GossipConfig, GossipMachine, GossipReady, Publish
from phalanx.gossip.messages import Call, CallAck, MemberStatus, PingAck, Rumor, RumorId


def node_ids(n: int) -> tuple[NodeId, ...]:
    width = len(str(n - 1))
    return tuple(NodeId(f"n{i:0{width}d}") for i in range(n))


def adversarial_crashes(members: tuple[NodeId, ...], origin: NodeId, k: int) -> list[NodeId]:
    """The first `k` nodes plain GP (identity labels) would call from `origin`: the
    midpoints of its interval tree, breadth first. Crashing them makes plain GP's origin
    fail call after call; with the seeded permutation they are just k random nodes."""
    others = sorted(m for m in members if m != origin)
    order: list[NodeId] = []
    queue = [(0, len(others))]
    while queue and len(order) < k:
        nxt = []
        for a, b in queue:
            if b <= a:
                continue
            m = (a + b) // 2
            order.append(others[m])
            nxt += [(a, m), (m + 1, b)]
        queue = nxt
    return order[:k]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    n: int
    seed: int = 0
    gossip: GossipConfig = field(default_factory=GossipConfig)
    latency_min: int = 1
    latency_max: int = 1
    loss: float = 0.0
    crashed: frozenset[NodeId] = frozenset()  # down from the start
    silent: frozenset[NodeId] = frozenset()  # Byzantine: ack calls, forward nothing


@dataclass(slots=True)
class Stats:
    sends: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    contacts: dict[tuple[NodeId, int, int, int], int] = field(default_factory=dict)
    informed: dict[RumorId, dict[NodeId, int]] = field(default_factory=dict)
    published: dict[RumorId, int] = field(default_factory=dict)
    changes: list[tuple[int, NodeId, NodeId, MemberStatus]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)


class GossipSim:
    """Run with `publish`, `crash`, `restart`, `run(ticks)`, `run_until(pred, limit)`."""

    def __init__(self, config: SimConfig,
                 make_crypto: Callable[[NodeId], FastCrypto] | None = None) -> None:
        self.config = config
        self.members = node_ids(config.n)
        self.now = 0
        self._rng = random.Random(config.seed)
        self._make_crypto = make_crypto or (lambda node: FastCrypto(node))
        self._heap: list[tuple[int, int, NodeId, NodeId, Message]] = []
        self._seq = 0
        self._incarnations = dict.fromkeys(self.members, 0)
        self.stats = Stats()
        self.nodes: dict[NodeId, GossipMachine] = {m: self._machine(m) for m in self.members}
        self.alive: dict[NodeId, None] = {m: None for m in self.members
                                          if m not in config.crashed}
        self.logs: dict[NodeId, list[tuple[int, Rumor]]] = {m: [] for m in self.members}
        """Per node, the rumors its current machine published or delivered, in order, with
        the tick (what the runtime's delivery log holds; emptied by a restart)."""
        self.started: dict[NodeId, int] = dict.fromkeys(self.members, 0)
        """Per node, the tick its current machine started."""

    def _machine(self, node: NodeId) -> GossipMachine:
        inc = self._incarnations[node]
        rng = random.Random(f"{self.config.seed}/{node}/{inc}")
        return GossipMachine(node, self.members, crypto=self._make_crypto(node), rng=rng,
                             config=self.config.gossip, incarnation=inc)

    # -- control -----------------------------------------------------------------------------

    def publish(self, node: NodeId, payload: bytes) -> RumorId:
        if node not in self.alive:
            raise ValueError(f"{node} is crashed")
        ready = self.nodes[node].step(Publish(payload=payload))
        rid = ready.published[0].rumor_id
        self.logs[node].append((self.now, ready.published[0]))
        self.stats.published[rid] = self.now
        self.stats.informed.setdefault(rid, {})[node] = self.now
        self._handle(node, ready)
        return rid

    def crash(self, node: NodeId) -> None:
        self.alive.pop(node, None)

    def restart(self, node: NodeId) -> None:
        """A new machine with a higher incarnation (nothing survives a crash)."""
        self._incarnations[node] += 1
        self.nodes[node] = self._machine(node)
        self.alive[node] = None
        self.logs[node] = []
        self.started[node] = self.now

    # -- the loop ----------------------------------------------------------------------------

    def _handle(self, node: NodeId, ready: GossipReady) -> None:
        stats = self.stats
        for name, by in ready.counters:
            stats.counters[name] = stats.counters.get(name, 0) + by
        for rumor in ready.delivered:
            stats.informed.setdefault(rumor.rumor_id, {}).setdefault(node, self.now)
            self.logs[node].append((self.now, rumor))
        for change in ready.membership:
            stats.changes.append((self.now, node, change.node, change.status))
        silent = node in self.config.silent
        cfg = self.config
        for send in ready.sends:
            msg = send.message
            if silent and not isinstance(msg, CallAck | PingAck):
                continue
            kind = type(msg).__name__
            stats.sends[kind] = stats.sends.get(kind, 0) + 1
            if isinstance(msg, Call):  # one contact per wave it serves (grants may share one)
                for key in dict.fromkeys((g.origin, g.incarnation, g.wave, g.instance)
                                         for g in msg.grants):
                    stats.contacts[key] = stats.contacts.get(key, 0) + 1
            if cfg.loss and self._rng.random() < cfg.loss:
                stats.lost += 1
                continue
            delay = cfg.latency_min if cfg.latency_max == cfg.latency_min else \
                self._rng.randint(cfg.latency_min, cfg.latency_max)
            self._seq += 1
            heapq.heappush(self._heap, (self.now + delay, self._seq, send.to, node, msg))

    def step_tick(self) -> None:
        """Advance virtual time by one tick: deliveries due now, then every live node ticks."""
        self.now += 1
        heap = self._heap
        while heap and heap[0][0] <= self.now:
            _, _, dst, src, msg = heapq.heappop(heap)
            if dst in self.alive:
                self._handle(dst, self.nodes[dst].step(Receive(src=src, message=msg)))
        tick = Tick()
        for node in list(self.alive):
            self._handle(node, self.nodes[node].step(tick))

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step_tick()

    def run_until(self, done: Callable[[GossipSim], bool], limit: int) -> bool:
        """Tick until `done(self)` or `limit` ticks passed; whether `done` held."""
        for _ in range(limit):
            if done(self):
                return True
            self.step_tick()
        return done(self)

    # -- observations ------------------------------------------------------------------------

    def informed(self, rid: RumorId) -> set[NodeId]:
        return set(self.stats.informed.get(rid, {}))

    def covered(self, rids: Iterable[RumorId]) -> bool:
        """Every live node holds every rumor of `rids`."""
        return all(self.alive.keys() <= self.stats.informed.get(r, {}).keys() for r in rids)

    def coverage_time(self, rid: RumorId) -> int | None:
        """Ticks from publication until the last live node got `rid` (None: not all did)."""
        got = self.stats.informed.get(rid, {})
        if not self.alive.keys() <= got.keys():
            return None
        return max(got[m] for m in self.alive) - self.stats.published[rid]

    def quiescent(self) -> bool:
        """No message in flight and no node owning work (GP finished everywhere)."""
        return not self._heap and not any(self.nodes[m].busy() for m in self.alive)

    def wave_contacts(self) -> dict[tuple[NodeId, int, int, int], int]:
        return dict(self.stats.contacts)

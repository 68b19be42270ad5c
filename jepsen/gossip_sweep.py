"""Seeded gossip runs in the simulator, recorded as gossip histories and checked.

Owns `GossipSweepConfig`, `run_gossip_sim(seed, config)` (one run of `phalanx.gossip.sim`:
publishes from random live nodes while nodes crash, restart and messages are lost, then a
settle phase and every live node's delivery log; returned as a `History` in the
vocabulary of `phalanx.jepsen.gossip_checker`, exactly what the real-cluster harness
records) and `check_gossip_run(seed, config)` (that history through `check_gossip`).

Deliberate bugs (`BUGS`, the controls the checker must catch):
    * ``no-anti-entropy``: push-pull anti-entropy off: a lost call, or a node down during a
      wave, leaves nodes without the rumor for good.
    * ``never-forward``: two nodes acknowledge calls but never make one nor answer a digest
      (the simulator's ``silent`` forwarders), with anti-entropy off: their subtrees stay
      uninformed.

Clock: one tick is one millisecond of the checker's clock (``unix_ms``, ``started_ms``) and
`TICK_NS` of history time. Deterministic: one seed, one history. Pure: no I/O, no trio.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Final

from phalanx.consensus.types import NodeId
from phalanx.gossip.machine import GossipConfig
from phalanx.gossip.sim import GossipSim, SimConfig, node_ids
from phalanx.jepsen.checker import CheckerResult
from phalanx.jepsen.gossip_checker import (
    DELIVERIES,
    PUBLISH,
    FinalRead,
    check_gossip,
    publish_ok_value,
)
from phalanx.jepsen.history import OK, History, HistoryRecorder

NO_ANTI_ENTROPY: Final = "no-anti-entropy"
NEVER_FORWARD: Final = "never-forward"
BUGS: Final = (NEVER_FORWARD, NO_ANTI_ENTROPY)
TICK_NS: Final = 1_000_000
CAPACITY: Final = 1_000_000
"""The simulated delivery logs never drop entries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipSweepConfig:
    """One run's shape. Probabilities are per tick."""

    n: int = 10
    fault_ticks: int = 300
    settle_ticks: int = 300
    publish_p: float = 0.3
    crash_p: float = 0.03
    down_ticks: tuple[int, int] = (20, 120)
    min_alive: int = 3
    loss: float = 0.05
    latency_max: int = 3
    gossip: GossipConfig = field(default_factory=lambda: GossipConfig(rumor_ttl=400))
    bug: str = ""

    def __post_init__(self) -> None:
        if self.bug and self.bug not in BUGS:
            raise ValueError(f"unknown gossip bug {self.bug!r} (known: {', '.join(BUGS)})")
        if not 1 <= self.min_alive <= self.n:
            raise ValueError("min_alive must be in 1..n")

    def replay(self, seed: int) -> str:
        """How to replay one run (for a failing seed's message)."""
        return ('python -c "from phalanx.jepsen.gossip_sweep import *; '
                'from phalanx.gossip import GossipConfig, SwimConfig; '
                f'print(check_gossip_run({seed}, {self!r}).details)"')


def _sim(seed: int, cfg: GossipSweepConfig) -> GossipSim:
    gossip = cfg.gossip
    silent: frozenset[NodeId] = frozenset()
    if cfg.bug in BUGS:
        gossip = replace(gossip, anti_entropy_interval=0)
    if cfg.bug == NEVER_FORWARD:
        silent = frozenset(random.Random(f"silent/{seed}").sample(node_ids(cfg.n), 2))
    return GossipSim(SimConfig(n=cfg.n, seed=seed, gossip=gossip, loss=cfg.loss,
                               latency_max=cfg.latency_max, silent=silent))


def run_gossip_sim(seed: int, cfg: GossipSweepConfig) -> History:
    """One seeded run, recorded in the gossip checker's vocabulary (module docstring)."""
    sim = _sim(seed, cfg)
    rng = random.Random(f"gossip-sweep/{seed}")
    rec = HistoryRecorder()
    restart_at: dict[NodeId, int] = {}
    published = 0
    for _ in range(cfg.fault_ticks):
        now = sim.now
        for node, at in sorted(restart_at.items()):
            if at <= now:
                del restart_at[node]
                sim.restart(node)
                rec.nemesis(f="restart", value=node, time=now * TICK_NS)
        alive = sorted(sim.alive)
        if rng.random() < cfg.publish_p and alive:
            node = rng.choice(alive)
            payload = f"r{published}"
            published += 1
            rec.invoke(process=0, f=PUBLISH, key=node, value=payload, time=now * TICK_NS)
            rid = sim.publish(node, payload.encode())
            rec.complete(process=0, type=OK, time=now * TICK_NS,
                         value=publish_ok_value(rid.origin, rid.incarnation, rid.seq, now))
        if rng.random() < cfg.crash_p and len(alive) > cfg.min_alive:
            victim = rng.choice(alive)
            sim.crash(victim)
            rec.nemesis(f="kill", value=victim, time=now * TICK_NS)
            restart_at[victim] = now + rng.randint(*cfg.down_ticks)
        sim.step_tick()
    # Heal: nodes due back restart now; the last one killed stays down ("dead at the end").
    for node in sorted(restart_at)[1:]:
        sim.restart(node)
        rec.nemesis(f="restart", value=node, time=sim.now * TICK_NS)
    sim.run(cfg.settle_ticks)
    for i, node in enumerate(sim.members):
        process = 1 + i
        rec.invoke(process=process, f=DELIVERIES, key=node, time=sim.now * TICK_NS)
        if node not in sim.alive:
            rec.complete(process=process, type="fail", time=sim.now * TICK_NS, value=None,
                         error="down")
            continue
        rumors = tuple((r.origin, r.incarnation, r.seq, r.payload.decode(), tick)
                       for tick, r in sim.logs[node])
        final = FinalRead(incarnation=sim.nodes[node].incarnation,
                          started_ms=sim.started[node], capacity=CAPACITY, rumors=rumors)
        rec.complete(process=process, type=OK, time=sim.now * TICK_NS,
                     value=final.to_value())
    return rec.history()


def check_gossip_run(seed: int, cfg: GossipSweepConfig) -> CheckerResult:
    """`run_gossip_sim` checked by `check_gossip` (rumor_ttl in ticks = ms here)."""
    return check_gossip(run_gossip_sim(seed, cfg), rumor_ttl_ms=cfg.gossip.rumor_ttl)


__all__ = ["BUGS", "NEVER_FORWARD", "NO_ANTI_ENTROPY", "GossipSweepConfig", "check_gossip_run",
           "run_gossip_sim"]

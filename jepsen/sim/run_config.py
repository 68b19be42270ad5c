"""What one seeded simulation is and what it returns: `RunConfig`, the seed's swarm choices
(`swarm_choices`) and `RunResult` (with its failure report). `phalanx.jepsen.sim.run` carries
a run out and re-exports these.

Rules: pure data and pure functions of the config (the swarm draws come from
`random.Random` seeded by the protocol and the seed only); no simulator state.
"""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field

from phalanx.jepsen import nemesis
from phalanx.jepsen.history import Op
from phalanx.jepsen.sim.protocols import Knobs
from phalanx.jepsen.sim.scenarios import check_scenario
from phalanx.jepsen.sim.wan import WanConfig
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol

DIRECT, GOSSIP = "direct", "gossip"
DISSEMINATIONS = (DIRECT, GOSSIP)
"""`RunConfig.dissemination`'s values (`phalanx.jepsen.sim.dissemination`)."""

MS = 1_000_000
DEFAULT_LIVENESS_NS = 2_000 * MS


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    seed: int
    protocol: str = DEFAULT_PROTOCOL
    app: str = ""
    """Your own state machine, ``FILE.py:FACTORY`` or ``MODULE:FACTORY`` (its clients:
    `phalanx.jepsen.sim.app_clients`); "": the KV store and its register clients."""
    nodes: int = 3
    faults: tuple[str, ...] = nemesis.SIM_FAULT_KINDS
    swarm: bool = True
    bugs: frozenset[str] = frozenset()
    byzantine: int = 0
    """Byzantine replicas with seeded behaviours (PBFT; `phalanx.jepsen.sim.pbft`)."""
    twins: int = 0
    """Twinned replicas (PBFT); more than f of Byzantine + twins is the must-fail control."""
    time_ns: int = 2_000 * MS
    liveness_ns: int = DEFAULT_LIVENESS_NS
    clients: int = 3
    keys: int = 3
    tick_ns: int = 10 * MS
    check_every_ns: int = 250 * MS
    use_codec: bool = True
    keep_trace: bool = False
    lin_step_limit: int = 20_000
    max_events: int = 400_000
    max_bytes_sent: int = 12_000_000
    sized_budgets: bool = False
    """Scale `max_events` and `max_bytes_sent` to the cluster and the run's length
    (`budgets`); off, they are used as given."""
    settings: Knobs = ()
    """Knobs fixed on every seed (`phalanx sim --set NAME=VALUE`), over the swarm's draw."""
    schedule: nemesis.Schedule | None = None
    """An explicit fault schedule instead of the seed's generated one (scripted scenario
    tests; the replay command then names the test, not the CLI)."""
    scenario: str = ""
    """A named nemesis scenario (`phalanx.jepsen.sim.scenarios`, e.g. ``long-halves``)
    whose seeded events are added to the seed's generated schedule (`faults` none: the
    scenario alone); not with an explicit `schedule`."""
    dissemination: str = DIRECT
    """How cores' broadcasts travel: "direct" (one message per peer: the full mesh) or
    "gossip" (rumors through each node's gossip layer; `phalanx.jepsen.sim.dissemination`)."""
    gossip_tick_ns: int = 2 * MS
    """The gossip layers' tick (with "gossip"): a wave carries the broadcasts of one tick."""
    wan: WanConfig | None = None
    """A wide-area network (`phalanx.jepsen.sim.wan`): nodes and clients in regions, a
    round-trip table, bandwidth and loss; the node tick and the clients' timeouts are then
    sized to its longest round trip (`tick`, `client_timeouts_ns`). None: the default
    sub-millisecond network."""

    def __post_init__(self) -> None:
        if self.dissemination not in DISSEMINATIONS:
            raise ValueError(f"dissemination must be one of {', '.join(DISSEMINATIONS)}, "
                             f"got {self.dissemination!r}")
        check_scenario(self.scenario, self.time_ns)
        if self.scenario and self.schedule is not None:
            raise ValueError("a scenario adds to the generated schedule: not with an "
                             "explicit schedule")

    @property
    def tick(self) -> int:
        """The node tick of this run: `tick_ns`, or with a WAN at least a quarter of its
        longest round trip (`WanConfig.tick_ns`)."""
        return self.tick_ns if self.wan is None else self.wan.tick_ns(self.tick_ns)

    def client_timeouts_ns(self, attempt_ns: int, op_ns: int) -> tuple[int, int]:
        """The register clients' (attempt, operation) timeouts: the given defaults, or with
        a WAN at least 4 and 40 longest round trips (a BFT request costs ~3 of them)."""
        if self.wan is None:
            return attempt_ns, op_ns
        rtt = self.wan.max_rtt_ns
        return max(attempt_ns, 4 * rtt), max(op_ns, 40 * rtt)

    def budgets(self) -> tuple[int, int]:
        """(events, bytes sent) a run may use before it is a runaway: `max_events` and
        `max_bytes_sent`; with `sized_budgets`, those are the budgets of up to 5 nodes and
        4 virtual seconds, scaled above them by (nodes / 5)^2 (a broadcast costs ~n^2
        messages) and by the run's length."""
        if not self.sized_budgets:
            return self.max_events, self.max_bytes_sent
        scale = max(1.0, (self.nodes / 5) ** 2) * max(
            1.0, (self.time_ns + self.liveness_ns) / (4_000 * MS))
        if scale == 1.0:
            return self.max_events, self.max_bytes_sent
        return int(self.max_events * scale), int(self.max_bytes_sent * scale)

    def replay_command(self) -> str:
        if self.schedule is not None:
            return (f"a scripted run (seed {self.seed}, explicit schedule): rerun "
                    "the test that built it")
        faults = ",".join(self.faults) if self.faults else "none"
        if self.faults == nemesis.SIM_FAULT_KINDS:
            faults = "all"
        bugs = "".join(f" --bug {b}" for b in sorted(self.bugs))
        if self.byzantine or self.twins:
            bugs += f" --byzantine {self.byzantine}" + (f" --twins {self.twins}" * bool(self.twins))
        swarm = "" if self.swarm else " --no-swarm"
        liveness = ""
        if self.liveness_ns != DEFAULT_LIVENESS_NS:
            liveness = f" --liveness {self.liveness_ns / 1e9:g}"
        default = RunConfig(seed=self.seed)  # the CLI's defaults: only differences are shown
        shape = "".join(f" --{flag} {value}" for flag, value, base in (
            ("clients", self.clients, default.clients), ("keys", self.keys, default.keys),
            ("max-events", self.max_events, default.max_events)) if value != base)
        shape += "" if self.use_codec else " --no-codec"
        shape += " --sized-budgets" if self.sized_budgets else ""
        if self.wan is not None:
            w, base_wan = self.wan, WanConfig(regions=self.wan.regions)
            shape += f" --regions {w.regions}" + "".join(
                f" --{flag} {value:g}" for flag, value, base in (
                    ("wan-jitter-pct", w.jitter_pct, base_wan.jitter_pct),
                    ("link-mbps", w.link_mbps, base_wan.link_mbps),
                    ("uplink-mbps", w.uplink_mbps, base_wan.uplink_mbps),
                    ("wan-loss", w.loss, base_wan.loss)) if value != base)
            if w.cpu is not None:  # (the CLI's model has the default costs)
                shape += " --cpu-model"
        shape += "".join(f" --set {name}={value}" for name, value in self.settings)
        shape += f" --scenario {self.scenario}" if self.scenario else ""
        if self.dissemination != default.dissemination:
            shape += f" --dissemination {self.dissemination}"
            if self.gossip_tick_ns != default.gossip_tick_ns:
                shape += f" --gossip-tick-ms {self.gossip_tick_ns / MS:g}"
        if self.app:
            shape += f" --app {shlex.quote(self.app)}"
        return (
            f"phalanx sim --protocol {self.protocol} --seed-start {self.seed} --seeds 1 "
            f"--nodes {self.nodes} --faults {faults} --time {self.time_ns / 1e9:g}"
            f"{liveness}{shape}{swarm}{bugs} --trace trace-{self.seed}.txt"
        )


def swarm_choices(cfg: RunConfig) -> tuple[tuple[str, ...], Knobs]:
    """The fault kinds and protocol knobs of this seed: a pure function of the config.

    Without `swarm`, the configured faults and no knobs (protocol defaults). With it, each
    configured fault kind is kept with probability 1/2 (at least one is kept), and every knob
    is drawn from its sane range; `heartbeat_ticks` stays below `election_ticks`.
    """
    if not cfg.swarm:
        return cfg.faults, tuple(sorted(cfg.settings))
    rng = random.Random(f"swarm:{cfg.protocol}:{cfg.seed}")
    faults = cfg.faults
    if len(faults) > 1:
        kept = tuple(k for k in faults if rng.random() < 0.5)
        faults = kept or (rng.choice(faults),)
    knobs: dict[str, int | bool] = {
        name: rng.choice(values) for name, values in get_protocol(cfg.protocol).sim_knobs
    }
    if "election_ticks" in knobs:
        knobs["heartbeat_ticks"] = rng.randint(1, min(3, int(knobs["election_ticks"]) - 1))
    drawn: dict[str, int | bool | str] = {**knobs, **dict(cfg.settings)}
    return faults, tuple(sorted(drawn.items()))


@dataclass(slots=True, kw_only=True)
class RunResult:
    config: RunConfig
    violations: list[str]
    trace_hash: str
    trace_tail: list[str]
    trace_lines: list[str] | None
    history: tuple[Op, ...]
    linearizable: object
    ops_ok: int
    ops_info: int
    deliveries: int
    events: int
    wall_s: float
    schedule: nemesis.Schedule = ()
    stats: dict[str, int] = field(default_factory=dict)
    faults_used: tuple[str, ...] = ()
    knobs: Knobs = ()
    commit_latencies_ns: tuple[int, ...] = ()
    """The protocol workload's committed transactions, invocation to the client's
    decision (virtual ns), in issue order (empty without a workload)."""
    commit_times_ns: tuple[tuple[int, int], ...] = ()
    """The same transactions' (issue, decision) virtual times."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        lines = [
            f"seed {self.config.seed}: FAILED",
            f"  replay: {self.config.replay_command()}",
            f"  faults this seed: {', '.join(self.faults_used) or 'none'}",
            "  knobs this seed: "
            + (", ".join(f"{k}={v}" for k, v in self.knobs) or "protocol defaults"),
        ]
        lines += [f"  violation: {v}" for v in self.violations]
        lines.append(f"  last {len(self.trace_tail)} trace lines:")
        lines += [f"    {line}" for line in self.trace_tail]
        return "\n".join(lines)

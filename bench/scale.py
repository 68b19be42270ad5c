"""Scale by simulation: Raft, PBFT and the leaderless core side by side over a WAN (issue 19).

Runs the deterministic simulator (`phalanx.jepsen.sim.run`, FastCrypto, the wire codec on)
with nodes and clients spread round-robin over 5 regions of a published inter-region
round-trip table (`phalanx.jepsen.sim.wan`, docs/SCALE.md), and prints per cell: commit
latency p50/p99 (simulated ms, from a client's invocation to its decision: a Raft
client's answer, a PBFT client's f+1 matching replies, a leaderless client's f+1 matching
commit notices), messages and bytes per committed operation (everything the run sent:
protocol messages, re-sends, checkpoints, view changes, gossip), the checker's verdict and
the run's CPU seconds.

Experiments (`--only` picks some; each is a list of cells):
- ``base``: Raft, PBFT, leaderless at every `--sizes` n, no faults, no conflicts;
- ``conflicts``: leaderless at 0, 10 and 50% of operations on one hot register;
- ``gossip``: leaderless and PBFT with broadcasts through gossip (`--dissemination gossip`);
- ``crashed``: f nodes (Raft: (n-1)/2; PBFT, leaderless: (n-1)/3) crashed from the start
  to the heal (never the ones that lead at boot: n1 is PBFT's view-0 primary);
- ``byzantine``: f Byzantine replicas with seeded behaviours (PBFT, leaderless); PBFT's at
  seeded places, without the targeted attacks (docs/SCALE.md: the worst case, f-1 Byzantine
  primaries in a row, is measured apart).
- ``load`` (only when named in `--only`): PBFT and the leaderless core at `--loads` closed-loop
  clients per region, throughput, latency and, with `--cpu-model`, the busiest node's CPU
  share and queueing (`bench/_scale_load.py`; docs/SCALE.md "Under load").

Workload: Raft and PBFT run the simulator's register clients (closed loop: reads, writes,
compare-and-sets; latency counts writes and CAS only); the leaderless core its signing
clients with commuting adds and set adds (plus versioned puts on the hot register in
``conflicts``), deadlines 4-6 s (PnyxDB's default is 5 s), submitted to f+1 nodes. Register
latencies count the operations invoked before the heal (the faults of ``crashed`` last
until then) and, for Raft, after its first election (`warmup_ns`).

Usage: `python bench/scale.py [--sizes 4,10,20,60,180] [--only base,conflicts]
[--conflicts 10,50] [--by-kind] [--quick] [--no-plot] [--no-docs] [--plot-from REPORT...]`.
`--quick` is the smoke run (n = 4 and 10, small workloads); `--conflicts 50` runs the 50%
conflicts cell alone; `--by-kind` prints each cell's bytes by message kind. Figures depend
only on the arguments (the simulator is deterministic); CPU seconds are the shared machine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.cli import parse_settings
from phalanx.jepsen.sim.cpu import CpuCosts
from phalanx.jepsen.sim.protocols import Knobs
from phalanx.jepsen.sim.run import RunConfig, RunResult, run
from phalanx.jepsen.sim.wan import WanConfig
from phalanx.protocols import CallStrategy, FaultModel
from phalanx.protocols import get as protocol_spec
from phalanx.protocols import names as protocol_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scale_load as load  # a sibling bench module (also when imported by tests)

MS = 1_000_000
DOCS = Path(__file__).resolve().parent.parent / "docs"
SIZES = (4, 10, 20, 60, 180)
EXPERIMENTS = ("base", "conflicts", "gossip", "crashed", "byzantine")
"""The default experiments; ``load`` runs only when `--only` names it."""


@dataclass(frozen=True, slots=True)
class Cell:
    experiment: str
    protocol: str
    n: int
    conflict_pct: int = 0
    dissemination: str = "direct"
    crashed: int = 0
    byzantine: int = 0

    @property
    def label(self) -> str:
        parts = [self.protocol]
        if self.experiment == "conflicts":
            parts.append(f"conflicts {self.conflict_pct}%")
        if self.dissemination != "direct":
            parts.append(self.dissemination)
        if self.crashed:
            parts.append(f"{self.crashed} crashed")
        if self.byzantine:
            parts.append(f"{self.byzantine} byzantine")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Row:
    experiment: str
    label: str
    n: int
    ops: int
    p50_ms: float
    p99_ms: float
    msgs_per_op: float
    kb_per_op: float
    cpu_s: float
    ok: bool
    note: str = ""


def faults_of(protocol: str, n: int) -> int:
    return protocol_spec(protocol).max_faults(n)


def endorsing(protocol: str) -> bool:
    """A leaderless (conditional-endorsement) protocol: its own workload, conflict rates and
    commit latencies (the registry's `CallStrategy.ENDORSEMENT`), not a register history."""
    return protocol_spec(protocol).call_strategy is CallStrategy.ENDORSEMENT


def byzantine(protocol: str) -> bool:
    return protocol_spec(protocol).fault_model is FaultModel.BYZANTINE


def _all() -> tuple[str, ...]:
    """The registered protocols, in the tables' order: crash-fault ones first."""
    return tuple(sorted(protocol_names(), key=lambda p: (byzantine(p), endorsing(p), p)))


CONFLICT_PCTS = (10, 50)
"""The ``conflicts`` experiment's conflict rates (`--conflicts` picks some)."""


def cells(experiments: list[str], sizes: list[int],
          conflict_pcts: tuple[int, ...] = CONFLICT_PCTS) -> list[Cell]:
    builders: dict[str, Callable[[int], list[Cell]]] = {
        "base": lambda n: [Cell("base", p, n) for p in _all()],
        "conflicts": lambda n: [Cell("conflicts", p, n, conflict_pct=c)
                                for p in _all() if endorsing(p) for c in conflict_pcts],
        # the simulator's dissemination layer carries the Byzantine cores' broadcasts
        "gossip": lambda n: [Cell("gossip", p, n, dissemination="gossip")
                             for p in _all() if byzantine(p)],
        "crashed": lambda n: [Cell("crashed", p, n, crashed=faults_of(p, n))
                              for p in _all() if faults_of(p, n)],
        "byzantine": lambda n: [Cell("byzantine", p, n, byzantine=faults_of(p, n))
                                for p in _all() if byzantine(p) and faults_of(p, n)],
    }
    return [cell for n in sizes for exp in experiments for cell in builders[exp](n)]


def shape(cell: Cell, quick: bool) -> tuple[int, int, int, int]:
    """(clients, leaderless transactions per client, virtual seconds before the heal,
    virtual seconds after it), smaller where a broadcast costs ~n^2 messages. The register
    clients go on issuing through the first half of the time after the heal; the
    leaderless ones stop at the heal once their transactions are issued."""
    n = cell.n
    if quick:
        return 3, 2, 4, 8
    if n >= 180:
        return (32, 2, 4, 4) if not endorsing(cell.protocol) else (8, 2, 4, 10)
    if n >= 60:
        return (16, 3, 5, 4) if not endorsing(cell.protocol) else (10, 3, 5, 10)
    return 10, 5, 6, 8


Shape = tuple[int, int, int, int]


def config_for(cell: Cell, seed: int, quick: bool, override: Shape | None = None,
               extra: Mapping[str, Knobs] | None = None) -> RunConfig:
    clients, per_client, seconds, after = override or shape(cell, quick)
    settings: tuple[tuple[str, int | bool | str], ...] = ()
    if endorsing(cell.protocol):
        f = faults_of(cell.protocol, cell.n)
        settings = (("conflict_pct", cell.conflict_pct), ("short_pct", 0),
                    ("ops_per_client", per_client), ("submit_to", f + 1), ("mixed_pct", 0),
                    ("registers", 1), ("srem_pct", 0), ("hot_jitter_ms", 0),
                    ("deadline_min_ms", 4_000), ("deadline_max_ms", 6_000),
                    ("delta_old_ms", 1_000), ("think_ns", 200 * MS))
    elif cell.byzantine:
        # Liars at seeded places, never a targeted attack: ``collude`` would put all f at the
        # primaries of views 0..f-1 (f-1 view changes in a row, each a full and doubling
        # view-change timeout: minutes at n = 180), a placement the crashed cells avoid too.
        settings = (("targeted_attacks", 0),)
    schedule: nemesis.Schedule | None = None
    if cell.crashed:
        # The last `crashed` nodes of the setup's order (spread over the regions, never n1).
        names = [f"n{i}" for i in range(1, cell.n + 1)]
        if endorsing(cell.protocol):
            names = sorted(names)
        down = tuple(sorted(names[-cell.crashed:]))
        schedule = (
            nemesis.FaultEvent(at_ns=1 * MS, action="start", fault=nemesis.KILL, episode=0,
                               nodes=down),
            nemesis.FaultEvent(at_ns=seconds * 1_000 * MS - 1, action="stop",
                               fault=nemesis.KILL, episode=0, nodes=down),
        )
    return RunConfig(
        seed=seed, protocol=cell.protocol, nodes=cell.n, faults=(), swarm=False,
        byzantine=cell.byzantine, clients=clients, keys=3,
        time_ns=seconds * 1_000 * MS, liveness_ns=after * 1_000 * MS, sized_budgets=True,
        settings=tuple(sorted({**dict(settings), **dict((extra or {}).get(cell.protocol, ()))}
                              .items())),
        schedule=schedule, dissemination=cell.dissemination,
        gossip_tick_ns=10 * MS, wan=WanConfig(regions=5, cpu=CPU[0]))


CPU: list[CpuCosts | None] = [None]
"""The WAN's CPU model of every cell (`--cpu-model`: `CpuCosts()`; default none)."""


def warmup_ns(protocol: str) -> int:
    """A crash-fault (Raft) cluster's first election takes up to two election timeouts (10
    ticks of 80 ms each over this WAN): operations invoked before are left out of its
    latencies (PBFT's view-0 primary and the leaderless core need no election)."""
    spec = protocol_spec(protocol)
    return 2_000 * MS if spec.fault_model is FaultModel.CRASH else 0


def latencies(result: RunResult, after_ns: int, before_ns: int) -> list[int]:
    """Commit latencies: the leaderless workload's own (every committed transaction), else
    those of the register history's writes and CAS invoked in [after_ns, before_ns)
    (invoke to ok)."""
    if endorsing(result.config.protocol) or result.commit_latencies_ns:
        return list(result.commit_latencies_ns)
    invoked: dict[object, tuple[int, str]] = {}
    out: list[int] = []
    for op in result.history:
        if op.process == "nemesis":
            continue
        if op.type == "invoke":
            invoked[op.process] = (op.time, op.f)
        elif op.type == "ok" and op.process in invoked:
            at, f = invoked.pop(op.process)
            if f in ("write", "cas") and after_ns <= at < before_ns:
                out.append(op.time - at)
        else:
            invoked.pop(op.process, None)
    return out


def percentile(values: list[int], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure(cell: Cell, seed: int, quick: bool, override: Shape | None = None,
            extra: Mapping[str, Knobs] | None = None) -> tuple[Row, RunResult]:
    cfg = config_for(cell, seed, quick, override, extra)
    cpu0 = time.process_time()
    result = run(cfg)
    cpu = time.process_time() - cpu0
    lat = latencies(result, warmup_ns(cell.protocol), cfg.time_ns)
    ops = len(lat) if endorsing(cell.protocol) else result.ops_ok
    st = result.stats
    note = "" if result.ok else "; ".join(v[:90] for v in result.violations[:2])
    return Row(experiment=cell.experiment, label=cell.label, n=cell.n, ops=ops,
               p50_ms=percentile(lat, 0.5) / MS, p99_ms=percentile(lat, 0.99) / MS,
               msgs_per_op=st["messages_sent"] / ops if ops else math.nan,
               kb_per_op=st["bytes_sent"] / 1000 / ops if ops else math.nan,
               cpu_s=cpu, ok=result.ok, note=note), result


def by_kind(stats: Mapping[str, int], top: int = 5) -> str:
    """The `top` message kinds by bytes sent (the run's ``bytes:KIND`` stats), with shares."""
    kinds = sorted(((k.removeprefix("bytes:"), v) for k, v in stats.items()
                    if k.startswith("bytes:")), key=lambda kv: (-kv[1], kv[0]))
    total = max(1, stats.get("bytes_sent", 0))
    return ", ".join(f"{k} {v / 1e6:,.1f} MB ({100 * v / total:.0f}%)" for k, v in kinds[:top])


HEADER = ("| experiment | cell | n | ops | p50 ms | p99 ms | msgs/op | KB/op | CPU s | check |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def table_line(r: Row) -> str:
    check = "ok" if r.ok else f"FAIL: {r.note}"
    return (f"| {r.experiment} | {r.label} | {r.n} | {r.ops} | {r.p50_ms:.0f} | {r.p99_ms:.0f} "
            f"| {r.msgs_per_op:,.0f} | {r.kb_per_op:,.1f} | {r.cpu_s:.1f} | {check} |")


_LINE = re.compile(r"^\| (\w+) \| ([^|]+) \| (\d+) \| (\d+) \| (\S+) \| (\S+) \| (\S+) \| (\S+) "
                   r"\| (\S+) \| (ok|FAIL[^|]*) \|$")


def rows_from(paths: list[str]) -> list[Row]:
    """The table lines of earlier reports of this script (`--plot-from`)."""
    rows: list[Row] = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            m = _LINE.match(line.strip())
            if m is None:
                continue

            def num(text: str) -> float:
                return float(text.replace(",", ""))

            rows.append(Row(experiment=m[1], label=m[2].strip(), n=int(m[3]), ops=int(m[4]),
                            p50_ms=num(m[5]), p99_ms=num(m[6]), msgs_per_op=num(m[7]),
                            kb_per_op=num(m[8]), cpu_s=num(m[9]), ok=m[10] == "ok",
                            note=m[10].removeprefix("FAIL: ")))
    return rows


def plot(rows: list[Row], out: Path) -> bool:
    plt = load.pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("commit latency p50 (simulated ms)", lambda r: r.p50_ms),
              ("commit latency p99 (simulated ms)", lambda r: r.p99_ms),
              ("messages per committed op", lambda r: r.msgs_per_op))
    labels = sorted({r.label for r in rows})
    for ax, (title, value) in zip(axes, panels, strict=True):
        for label in labels:
            pts = sorted((r.n, value(r)) for r in rows
                         if r.label == label and r.ops and not math.isnan(value(r)))
            if pts:
                style = "o-" if "," not in label else "s--"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("n (5 regions)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        sizes = sorted({r.n for r in rows})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xticks([], minor=True)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="cluster sizes (default %(default)s)")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help=f"experiments, a comma list of {', '.join(EXPERIMENTS)} "
                        "(default: all)")
    parser.add_argument("--protocols", default="raft,pbft,leaderless",
                        help="keep only cells of these protocols (default %(default)s)")
    parser.add_argument("--conflicts", default=",".join(map(str, CONFLICT_PCTS)),
                        metavar="PCTS", help="the conflicts experiment's conflict rates in "
                        "percent (default %(default)s; e.g. 50 for the 50%% cell alone)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="the smoke run: n = 4 and 10 unless --sizes, small workloads")
    parser.add_argument("--shape", metavar="C,K,T,L",
                        help="every cell: C clients, K leaderless transactions each, T "
                        "virtual seconds before the heal and L after (default: by n)")
    parser.add_argument("--set", action="append", default=[], metavar="PROTOCOL:NAME=VALUE",
                        dest="settings",
                        help="fix a simulator knob of one protocol's cells (repeatable), e.g. "
                        "pbft:batch_size=32 (the names `phalanx sim --set` takes)")
    parser.add_argument("--cpu-model", action="store_true",
                        help="the WAN's CPU model: nodes handle messages one at a time at "
                        "measured costs (phalanx.jepsen.sim.cpu; default off)")
    parser.add_argument("--loads", default=",".join(map(str, load.LOADS)),
                        help="the load experiment's closed-loop clients per region "
                        "(default %(default)s)")
    parser.add_argument("--load-window", metavar="T,W,L",
                        help="the load experiment: T virtual seconds of clients, figures "
                        "counted from W to T, L more seconds for the liveness check (default "
                        "3,1,2; 2,1,2 at n >= 180)")
    parser.add_argument("--by-kind", action="store_true",
                        help="print each cell's bytes by message kind (the five largest)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--plot-from", nargs="+", metavar="REPORT",
                        help="run nothing: plot the tables of saved reports")
    parser.add_argument("--plot", type=Path, default=DOCS / "scale.png",
                        help="where the plot goes (default docs/scale.png)")
    parser.add_argument("--load-plot", type=Path, default=DOCS / "scale_load.png",
                        help="where the load plot goes (default docs/scale_load.png)")
    args = parser.parse_args(argv)
    if args.plot_from:
        saved = rows_from(args.plot_from)
        if saved:
            print(HEADER)
        for r in saved:
            print(table_line(r))
        if any(r.experiment == "base" for r in saved):
            plot([r for r in saved if r.experiment == "base"], args.plot)
        saved_load = load.load_rows_from(args.plot_from)
        if saved_load:
            print_load(saved_load)
            load.plot_load(saved_load, args.load_plot)
        return 0
    experiments = [e for e in args.only.split(",") if e]
    unknown = [e for e in experiments if e not in (*EXPERIMENTS, "load")]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick and args.sizes == parser.get_default("sizes"):
        sizes = [4, 10]
    protocols = set(args.protocols.split(","))
    override: Shape | None = None
    if args.shape:
        c, k, t, live = (int(x) for x in args.shape.split(","))
        override = (c, k, t, live)
    extra: dict[str, dict[str, int | bool | str]] = {}
    for item in args.settings:
        proto, sep, knob = item.partition(":")
        if not sep or proto not in protocols:
            parser.error(f"--set {item}: expected PROTOCOL:NAME=VALUE with a protocol of "
                         f"--protocols, e.g. pbft:batch_size=32")
        try:
            extra.setdefault(proto, {}).update(parse_settings([knob]))
        except ValueError as exc:
            parser.error(str(exc))
    knobs = {proto: tuple(sorted(v.items())) for proto, v in extra.items()}
    pcts = tuple(int(x) for x in args.conflicts.split(",") if x)
    if not all(0 <= pct <= 100 for pct in pcts):
        parser.error(f"--conflicts {args.conflicts}: expected percentages 0-100")
    todo = [c for c in cells([e for e in experiments if e != "load"], sizes, pcts)
            if c.protocol in protocols]
    levels = [int(x) for x in args.loads.split(",") if x]
    window: tuple[float | None, float | None, float | None] = (None, None, None)
    if args.load_window:
        t_s, w_s, l_s = (float(x) for x in args.load_window.split(","))
        if not 0 <= w_s < t_s:
            parser.error(f"--load-window {args.load_window}: expected 0 <= W < T")
        window = (t_s, w_s, l_s)
    load_cells = [(Cell("load", p, n), level) for n in sizes for level in levels
                  for p in _all()
                  if "load" in experiments and p in protocols and byzantine(p)]
    CPU[0] = CpuCosts() if args.cpu_model else None
    print(f"scale: {len(todo) + len(load_cells)} cells, seed {args.seed}, "
          f"WAN {WanConfig(regions=5, cpu=CPU[0]).describe()}"
          f"{' (quick)' if args.quick else ''}", flush=True)
    rows: list[Row] = []
    load_rows = [measure_load(cell, level * load.REGIONS, args.seed, window, knobs)
                 for cell, level in load_cells]
    if load_rows:
        print_load(load_rows)
        if not args.no_plot:
            load.plot_load(load_rows, args.load_plot)
    for cell in todo:
        row, result = measure(cell, args.seed, args.quick, override, knobs)
        rows.append(row)
        per = row.cpu_s / result.deliveries * 1e6 if result.deliveries else math.nan
        print(f"  n={cell.n} {cell.label}: {row.ops} ops, p50 {row.p50_ms:.0f} ms, "
              f"cpu {row.cpu_s:.1f} s, {result.deliveries:,} deliveries ({per:.0f} us each)"
              + ("" if CPU[0] is None else f", CPU model: busiest node "
                 f"{result.stats['cpu_busiest_ms']} ms, longest queue "
                 f"{result.stats['cpu_max_queue']}")
              + ("" if row.ok else " FAILED " + row.note), flush=True)
        if args.by_kind:
            print("    bytes by kind: " + by_kind(result.stats), flush=True)
    if rows:
        print()
        print(HEADER)
        for r in rows:
            print(table_line(r))
    if not args.no_plot and any(r.experiment == "base" for r in rows):
        plot([r for r in rows if r.experiment == "base"], args.plot)
    return 0 if all(r.ok for r in rows) and all(r.ok for r in load_rows) else 1


def measure_load(cell: Cell, clients: int, seed: int,
                 window: tuple[float | None, float | None, float | None],
                 knobs: Mapping[str, Knobs]) -> load.LoadRow:
    """One load cell (`bench/_scale_load.py`): `clients` closed-loop clients."""
    seconds, warmup, after = load.load_shape(cell.n, *window)
    own = load.LEADERLESS_LOAD_SETTINGS if endorsing(cell.protocol) else load.PBFT_LOAD_SETTINGS
    extra = {cell.protocol: tuple(sorted({**dict(own), **dict(knobs.get(cell.protocol, ()))}
                                         .items()))}
    cfg = config_for(cell, seed, False, (clients, 1, 1, 1), extra)
    cfg = dataclasses.replace(cfg, time_ns=int(seconds * 1e3) * MS,
                              liveness_ns=int(after * 1e3) * MS)
    cpu0 = time.process_time()
    result = run(cfg)
    cpu = time.process_time() - cpu0
    row = load.load_row(result, protocol=cell.protocol, n=cell.n, clients=clients,
                        endorsing=endorsing(cell.protocol), seconds=seconds, warmup=warmup,
                        after=after, cpu_s=cpu, percentile=percentile)
    st = result.stats
    print(f"  load n={cell.n} {cell.protocol}, {clients} clients: {row.ops_per_s:.0f} ops/s, "
          f"p50 {row.p50_ms:.0f} ms, p99 {row.p99_ms:.0f} ms, cpu {cpu:.1f} s, "
          f"{result.deliveries:,} deliveries"
          + ("" if "cpu_busiest_ms" not in st else
             f", busiest {row.busiest} {row.busiest_pct:.0f}% CPU, mean wait "
             f"{row.wait_ms:.2f} ms, longest queue {row.max_queue}, all queues "
             f"{st['cpu_wait_ms']} ms over {st['cpu_handled']:,} messages")
          + ("" if row.ok else " FAILED " + row.note), flush=True)
    return row


def print_load(rows: list[load.LoadRow]) -> None:
    print()
    print(load.LOAD_HEADER)
    for r in rows:
        print(load.load_line(r))
    for line in load.ratios(rows):
        print(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())

"""Leaderless core: broadcasts over the full mesh (`direct`) vs through gossip (issue 16, 5a).

Runs the leaderless core in the deterministic simulator (`phalanx.jepsen.sim.run`, no
faults, FastCrypto, the wire codec on) at n = 20, 60, 180 with each dissemination, the same
seed and workload, and prints per committed transaction: messages, bytes (encoded, every
message of the run: transactions, endorsements, re-sends, digests, fetches, gossip calls and
acks), the largest number of messages one node sent (the hot spot), and the commit latency
p50/p99 in simulated time (issue to the client's f+1 matching answers). Writes
docs/leaderless_gossip.png when matplotlib is installed (`--no-plot` to skip).

Workload (the simulator's leaderless clients, `WorkloadConfig`): `--clients` closed-loop
clients, `--ops` transactions each, no hot-key conflicts and no short deadlines (so nearly
every transaction commits and "per commit" is per transaction: commuting adds and set adds
with base-version requirements, no versioned puts and no removals), each transaction sent to
f+1 nodes (as the real client does first; `--submit-to all` sends to every node), which
each broadcast it; every node broadcasts its endorsement.

Usage: `python bench/leaderless_gossip.py [--sizes 20,60,180] [--clients 8] [--ops 4]
[--gossip-ticks 2,10] [--seed 1] [--no-plot]` (`make bench-leaderless-gossip`). Figures
depend only on the arguments (the simulator is deterministic); CPU time is printed too.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from phalanx.jepsen.sim.run import RunConfig, run

MS = 1_000_000
DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass(frozen=True, slots=True)
class Row:
    n: int
    mode: str
    commits: int
    issued: int
    messages: int
    bytes: int
    max_node: int
    p50_ms: float
    p99_ms: float
    cpu_s: float
    ok: bool
    gossip: dict[str, int]

    def per(self, value: int) -> float:
        return value / self.commits if self.commits else math.nan


def percentile(values: list[int], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def workload_at(n: int, args: argparse.Namespace) -> tuple[int, int]:
    """(clients, transactions each) at size n: `--small` from its size on."""
    if args.small:
        at, _, shape = args.small.partition(":")
        clients, _, ops = shape.partition("x")
        if n >= int(at):
            return int(clients), int(ops)
    return args.clients, args.ops


def measure(n: int, mode: str, tick_ms: float, args: argparse.Namespace) -> Row:
    f = (n - 1) // 3
    clients, ops = workload_at(n, args)
    submit_to = 0 if args.submit_to == "all" else f + 1
    knobs = (("conflict_pct", 0), ("short_pct", 0), ("ops_per_client", ops),
             ("submit_to", submit_to), ("mixed_pct", 0), ("registers", 1), ("srem_pct", 0))
    cfg = RunConfig(
        seed=args.seed, protocol="leaderless", nodes=n, faults=(), swarm=False,
        clients=clients, time_ns=int(args.time * 1e9), liveness_ns=int(args.liveness * 1e9),
        max_events=1 << 40, max_bytes_sent=1 << 50, dissemination=mode,
        gossip_tick_ns=int(tick_ms * MS), settings=knobs)
    cpu0 = time.process_time()
    result = run(cfg)
    cpu = time.process_time() - cpu0
    lat = list(result.commit_latencies_ns)
    st = result.stats
    if not result.ok:
        print(f"   (n={n} {mode}: checker FAILED: {result.violations[:2]})")
    label = mode if mode == "direct" else f"gossip/{tick_ms:g}ms"
    return Row(n=n, mode=label, commits=len(lat), issued=clients * ops,
               messages=st["messages_sent"], bytes=st["bytes_sent"], max_node=st["max_node_sent"],
               p50_ms=percentile(lat, 0.5) / MS, p99_ms=percentile(lat, 0.99) / MS, cpu_s=cpu,
               ok=result.ok,
               gossip={k.removeprefix("gossip:"): v for k, v in st.items()
                       if k.startswith("gossip:")})


def report(rows: list[Row]) -> None:
    print(f"\n{'n':>4} {'mode':>12} {'commits':>9} {'msgs/commit':>12} {'KB/commit':>10} "
          f"{'max node msgs/commit':>21} {'p50 ms':>7} {'p99 ms':>7} {'cpu s':>6} {'check':>6}")
    for r in rows:
        print(f"{r.n:>4} {r.mode:>12} {r.commits:>4}/{r.issued:<4} {r.per(r.messages):>12.0f} "
              f"{r.per(r.bytes) / 1000:>10.1f} {r.per(r.max_node):>21.1f} {r.p50_ms:>7.1f} "
              f"{r.p99_ms:>7.1f} {r.cpu_s:>6.1f} {'ok' if r.ok else 'FAIL':>6}")
    print("\ngossip / direct (per commit):")
    by = {(r.n, r.mode): r for r in rows}
    for n, mode in [(r.n, r.mode) for r in rows if r.mode != "direct"]:
        d, g = by.get((n, "direct")), by[(n, mode)]
        if d is None or not d.commits or not g.commits:
            continue
        print(f"  n={n:>3} {mode}: messages x{g.per(g.messages) / d.per(d.messages):.2f}, "
              f"bytes x{g.per(g.bytes) / d.per(d.bytes):.2f}, "
              f"max node x{g.per(g.max_node) / d.per(d.max_node):.2f}, "
              f"p50 x{g.p50_ms / d.p50_ms:.1f}")
        gs = g.gossip
        print(f"         gossip: {gs.get('broadcasts', 0)} broadcasts in "
              f"{gs.get('waves_started', 0)} waves "
              f"({gs.get('broadcasts', 0) / max(1, gs.get('waves_started', 0)):.1f} per wave), "
              f"{gs.get('calls', 0)} calls, {gs.get('call_timeouts', 0)} call timeouts, "
              f"{gs.get('direct', 0)} point-to-point sends")
        drops = {k: v for k, v in sorted(gs.items()) if k.startswith("dropped:")}
        if drops:
            print(f"         gossip drops: {drops}")


def plot(rows: list[Row]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib is not installed: no plot written)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (("messages per commit", lambda r: r.per(r.messages)),
              ("max messages sent by one node per commit", lambda r: r.per(r.max_node)),
              ("commit latency p50 (ms, simulated)", lambda r: r.p50_ms))
    for ax, (title, value) in zip(axes, panels, strict=True):
        for mode, marker in [("direct", "o-")] + [(m, "s-") for m in sorted(
                {r.mode for r in rows} - {"direct"})]:
            pts = [(r.n, value(r)) for r in rows if r.mode == mode and r.commits]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, label=mode)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("n")
        ax.set_xscale("log")
        ax.set_yscale("log")
        sizes = sorted({r.n for r in rows})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xticks([], minor=True)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = DOCS / "leaderless_gossip.png"
    fig.savefig(out, dpi=90)
    print(f"\nwrote {out}")


_ROW = re.compile(r"^\s*(\d+)\s+(direct|gossip/\S+)\s+(\d+)/(\d+)\s+([\d.]+)\s+([\d.]+)"
                  r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(ok|FAIL)\s*$")


def rows_from(paths: list[str]) -> list[Row]:
    """The table rows of earlier runs' printed reports (`--plot-from`), to plot sizes
    measured in separate runs together."""
    rows: list[Row] = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            m = _ROW.match(line)
            if m is None:
                continue
            n, mode, commits, issued = int(m[1]), m[2], int(m[3]), int(m[4])
            per = [float(m[i]) for i in (5, 6, 7)]
            rows.append(Row(n=n, mode=mode, commits=commits, issued=issued,
                            messages=round(per[0] * commits), bytes=round(per[1] * 1000 * commits),
                            max_node=round(per[2] * commits), p50_ms=float(m[8]),
                            p99_ms=float(m[9]), cpu_s=float(m[10]), ok=m[11] == "ok", gossip={}))
    return sorted(rows, key=lambda r: (r.n, r.mode != "direct", r.mode))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20,60,180", help="cluster sizes (default %(default)s)")
    parser.add_argument("--clients", type=int, default=8, help="clients (default %(default)s)")
    parser.add_argument("--ops", type=int, default=4,
                        help="transactions per client (default %(default)s)")
    parser.add_argument("--small", default="180:2x2", metavar="N:CxK",
                        help="from size N on, C clients x K transactions (the full mesh at "
                        "n = 180 costs ~n^2 messages a broadcast; default %(default)s, "
                        "'' for none)")
    parser.add_argument("--submit-to", choices=("f+1", "all"), default="f+1",
                        help="nodes a client sends each transaction to (default %(default)s)")
    parser.add_argument("--gossip-ticks", default="2,10",
                        help="gossip layer ticks to run, ms (one wave per node per tick: "
                        "longer batches more broadcasts per wave; default %(default)s)")
    parser.add_argument("--time", type=float, default=1.0,
                        help="virtual seconds before the (empty) heal (default %(default)s)")
    parser.add_argument("--liveness", type=float, default=2.0,
                        help="virtual seconds after it (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--plot-from", nargs="+", metavar="REPORT",
                        help="run nothing: plot the tables of saved reports of this script")
    args = parser.parse_args()
    if args.plot_from:
        plot(rows_from(args.plot_from))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    ticks = [float(t) for t in args.gossip_ticks.split(",") if t]
    print(f"leaderless, no faults, seed {args.seed}: {args.clients} clients x {args.ops} "
          f"transactions (--small {args.small or '-'}), sent to {args.submit_to} nodes; "
          "network latency 0.1 ms + Exp(0.9 ms)")
    rows: list[Row] = []
    for n in sizes:
        for mode, tick in [("direct", 0.0)] + [("gossip", t) for t in ticks]:
            row = measure(n, mode, tick or 2.0, args)
            rows.append(row)
            print(f"  n={n} {mode}: {row.commits} commits, cpu {row.cpu_s:.1f} s", flush=True)
    report(rows)
    if not args.no_plot:
        plot(rows)


if __name__ == "__main__":
    main()

"""Cluster-sending figures (issue 18, item 4), from the deterministic multi-cluster simulator.

Prints, per mode (PCS, permutation, bijective baseline) and inter-cluster message loss
(0, 10, 30%): steps (attempts until the first member of the sending cluster holds the proof)
and inter-cluster messages per send, against the theory of protocols.md §2.5:
p = (nf1/n1)(nf2/n2) for a pair of non-faulty ends, q = 1 - loss per message, a step succeeds
with p*q^2, so E[steps] = 1/(p q^2); with crashed faulty members (who send nothing),
E[messages] = (1 + q b)/(b q^2) where b = nf2/n2 (the notes' rougher bound: 2/p). Then PCS
for other cluster sizes (Byzantine n=7, f=2; crash n=3, f=1; mixed). Each world has f members
crashed in each cluster, drawn from the world's seed (fixed before the pairs' seeds, as the
static adversary of the model); intra-cluster messages are not lost and not counted.

Writes docs/cluster_sending.png (steps per send vs loss, measured and theory) unless
--no-plots. Usage: `python bench/cluster_sending.py [--quick] [--sends N] [--no-plots]`
(default 3,400 sends per (mode, loss) cell: >= 10,000 per loss level and per mode, ~2-3 min
of CPU on an idle core; --quick: 300 per cell).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from phalanx.clustersend.machine import ClusterSendConfig
from phalanx.clustersend.messages import CertKind
from phalanx.clustersend.pairs import Mode
from phalanx.clustersend.sim import ClusterSpec, World, WorldConfig, check

DOCS = Path(__file__).resolve().parent.parent / "docs"
SENDS_PER_WORLD = 100
INTER, INTRA = 10, 1
LOSSES = (0.0, 0.1, 0.3)


@dataclass(frozen=True)
class Cell:
    mode: Mode
    loss: float
    n1: int
    f1: int
    n2: int
    f2: int
    kind1: CertKind = CertKind.BYZANTINE
    kind2: CertKind = CertKind.BYZANTINE


@dataclass
class Result:
    sends: int
    steps: list[int]
    msgs: list[int]
    violations: int
    seconds: float


def run_cell(cell: Cell, sends: int, seed0: int) -> Result:
    steps: list[int] = []
    msgs: list[int] = []
    violations = 0
    t0 = time.process_time()
    worlds = max(1, -(-sends // SENDS_PER_WORLD))
    for w in range(worlds):
        seed = seed0 + w
        rng = random.Random(f"faults/{seed}")
        specs = (
            ClusterSpec(name="A", n=cell.n1, f=cell.f1, kind=cell.kind1,
                        crashed=tuple(rng.sample(range(cell.n1), cell.f1))),
            ClusterSpec(name="B", n=cell.n2, f=cell.f2, kind=cell.kind2,
                        crashed=tuple(rng.sample(range(cell.n2), cell.f2))),
        )
        count = min(SENDS_PER_WORLD, sends - w * SENDS_PER_WORLD)
        config = WorldConfig(
            clusters=specs, links=(("A", "B"),), sends=count, send_every=1, seed=seed,
            inter_latency=(INTER, INTER), intra_latency=(INTRA, INTRA), loss=cell.loss,
            machine=ClusterSendConfig(mode=cell.mode,
                                      attempt_timeout=2 * INTER + 6 * INTRA + 2),
            limit=200_000)
        world = World(config)
        world.run()
        violations += len(check(world))
        for st in world.stats.values():
            steps.append(st.steps if st.steps is not None else 10**6)
            msgs.append(st.inter_messages)
    return Result(len(steps), steps, msgs, violations, time.process_time() - t0)


def theory(cell: Cell) -> tuple[float, float, float]:
    """(p, E[steps], E[messages]) for PCS with crashed faulty members."""
    a = (cell.n1 - cell.f1) / cell.n1
    b = (cell.n2 - cell.f2) / cell.n2
    q = 1 - cell.loss
    return a * b, 1 / (a * b * q * q), (1 + q * b) / (b * q * q)


def pct(xs: list[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


HEADER = (f"{'clusters':>13} {'mode':>12} {'loss':>5} {'sends':>6} {'steps':>6} {'1/pq2':>6} "
          f"{'p99':>4} "
          f"{'max':>4} {'bound':>5} {'msgs':>6} {'theory':>6} {'2/p':>5} {'viol':>4} "
          f"{'cpu s':>6}")


def row(cell: Cell, r: Result) -> str:
    p, e_steps, e_msgs = theory(cell)
    bound = {Mode.PCS: "-", Mode.PERMUTATION: str(cell.f1 + cell.f2 + 1),
             Mode.BIJECTIVE: "1"}[cell.mode] if cell.loss == 0 else "-"
    msgs_theory = f"{e_msgs:6.2f}" if cell.mode == Mode.PCS else f"{'':>6}"
    kinds = {CertKind.BYZANTINE: "B", CertKind.CRASH: "C"}
    sizes = f"{kinds[cell.kind1]}{cell.n1}/{cell.f1}-{kinds[cell.kind2]}{cell.n2}/{cell.f2}"
    return (f"{sizes:>13} {cell.mode.value:>12} {cell.loss:>5.0%} {r.sends:>6} "
            f"{statistics.fmean(r.steps):>6.2f} {e_steps:>6.2f} {pct(r.steps, 0.99):>4} "
            f"{max(r.steps):>4} {bound:>5} {statistics.fmean(r.msgs):>6.2f} {msgs_theory} "
            f"{2 / p:>5.2f} {r.violations:>4} {r.seconds:>6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 sends per cell")
    parser.add_argument("--sends", type=int, default=None, help="sends per (mode, loss) cell")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    sends = args.sends or (300 if args.quick else 3_400)

    print(f"== Two Byzantine clusters n=4, f=1, one crashed member each: p = 9/16; "
          f"{sends} sends per row; inter-cluster latency {INTER}, intra {INTRA} ticks")
    print(HEADER)
    results: dict[tuple[Mode, float], tuple[Cell, Result]] = {}
    seed0 = 1
    for mode in Mode:
        for loss in LOSSES:
            cell = Cell(mode, loss, 4, 1, 4, 1)
            r = run_cell(cell, sends, seed0)
            seed0 += 10_000
            results[(mode, loss)] = (cell, r)
            print(row(cell, r), flush=True)
    total = sum(r.sends for _, r in results.values())
    print(f"({total} sends in all; steps = attempts until the first sender-cluster member "
          f"holds the proof; msgs = CsSend + CsConfirm between the clusters, all members)")

    print("\n== Other sizes, no loss (B: Byzantine n=3f+1, C: crash n=2f+1; n/f)")
    print(HEADER)
    small = max(300, sends // 3)
    for cell in (Cell(Mode.PCS, 0.0, 7, 2, 7, 2), Cell(Mode.PCS, 0.0, 3, 1, 3, 1,
                                                        CertKind.CRASH, CertKind.CRASH),
                 Cell(Mode.PCS, 0.0, 3, 1, 7, 2, CertKind.CRASH, CertKind.BYZANTINE),
                 Cell(Mode.PERMUTATION, 0.0, 7, 2, 7, 2), Cell(Mode.BIJECTIVE, 0.0, 7, 2, 7, 2)):
        print(row(cell, run_cell(cell, small, seed0)), flush=True)
        seed0 += 10_000

    if not args.no_plots:
        plot(results)


def plot(results: dict[tuple[Mode, float], tuple[Cell, Result]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib is not installed: no plot written)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [100 * loss for loss in LOSSES]
    for mode in Mode:
        ax1.plot(xs, [statistics.fmean(results[(mode, x)][1].steps) for x in LOSSES],
                 marker="o", label=mode.value)
        ax2.plot(xs, [statistics.fmean(results[(mode, x)][1].msgs) for x in LOSSES],
                 marker="o", label=mode.value)
    cells = [results[(Mode.PCS, x)][0] for x in LOSSES]
    ax1.plot(xs, [theory(c)[1] for c in cells], "k--", label="PCS theory 1/(p q²)")
    ax2.plot(xs, [theory(c)[2] for c in cells], "k--", label="PCS theory")
    ax1.set(xlabel="inter-cluster loss (%)", ylabel="steps per send", title="Steps (n=4, f=1)")
    ax2.set(xlabel="inter-cluster loss (%)", ylabel="inter-cluster messages per send",
            title="Messages (n=4, f=1)")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "cluster_sending.png", dpi=110)
    print(f"\nwrote {DOCS / 'cluster_sending.png'}")


if __name__ == "__main__":
    main()

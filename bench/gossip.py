"""Gossip figures (issue 16, item 6), from the deterministic gossip simulator.

Prints: contacts per rumor (n-1 in every run), rounds against n up to 1,000 with a fitted
c*log2(n), coverage of live nodes with 0/10/50/90% of nodes crashed (adversarial and random;
plain GP, GP on the seeded permutation, and the `balance` option), time to full coverage
under 5% message loss with anti-entropy, and membership: time to detect a crash and false
suspicions under loss. Writes docs/gossip_rounds.png and docs/gossip_crashes.png when
matplotlib is installed (`--no-plots` to skip).

Units: one tick is one one-way message latency, so a call's round trip (a GP "round") is 2
ticks; a call to a crashed node costs its timeout, 3 ticks. Usage:
`python bench/gossip.py [--quick] [--seeds N] [--no-plots]` (~100 s of CPU; --quick ~4 s).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Iterable
from pathlib import Path

from phalanx.consensus.types import NodeId
from phalanx.gossip.machine import GossipConfig
from phalanx.gossip.messages import MemberStatus
from phalanx.gossip.sim import GossipSim, SimConfig, adversarial_crashes, node_ids

TICKS_PER_ROUND = 2
DOCS = Path(__file__).resolve().parent.parent / "docs"


def gp_config(**kw: object) -> GossipConfig:
    base: dict[str, object] = dict(membership=False, anti_entropy_interval=0, call_timeout=3)
    base.update(kw)
    return GossipConfig(**base)  # type: ignore[arg-type]


def crash_set(members: tuple[NodeId, ...], fraction: float, how: str,
              seed: int) -> frozenset[NodeId]:
    k = round(fraction * len(members))
    if how == "adversarial":
        return frozenset(adversarial_crashes(members, members[0], k))
    return frozenset(random.Random(seed).sample(members[1:], k))


def spread(n: int, crashed: frozenset[NodeId], seed: int,
           config: GossipConfig) -> tuple[list[int], int | None, float]:
    """One rumor from n0 by GP alone: (contacts per wave, ticks to cover every live node,
    fraction of live nodes covered). The payload varies with the seed, and with it the
    signature and so the wave's permutation."""
    sim = GossipSim(SimConfig(n=n, seed=seed, crashed=crashed, gossip=config))
    sim.run(1)
    rid = sim.publish(sim.members[0], b"rumor %d" % seed)
    sim.run_until(lambda s: s.quiescent(), 40 * n + 100)
    got = len(sim.informed(rid) & set(sim.alive))
    return list(sim.wave_contacts().values()), sim.coverage_time(rid), got / len(sim.alive)


def fit_log2(points: Iterable[tuple[int, float]]) -> float:
    """Least-squares c in rounds = c * log2(n)."""
    pts = list(points)
    return sum(r * math.log2(n) for n, r in pts) / sum(math.log2(n) ** 2 for n, _ in pts)


def fit_affine_log2(points: Iterable[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (a, c) in rounds = a + c * log2(n)."""
    pts = [(math.log2(n), r) for n, r in points]
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    c = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my - c * mx, c


def rounds_vs_n(sizes: list[int], seeds: int) -> dict[str, list[tuple[int, float]]]:
    print("\n== Rounds to inform every live node vs n (one rumor; mean over seeds)")
    print(f"{'n':>6} {'0% crashed':>11} {'10% random':>11} {'10% bal.':>9} {'contacts':>9}")
    series: dict[str, list[tuple[int, float]]] = {"0%": [], "10%": [], "10% balance": []}
    for n in sizes:
        members = node_ids(n)
        row: list[float] = []
        contacts: set[int] = set()
        for label, frac, balance in (("0%", 0.0, False), ("10%", 0.1, False),
                                     ("10% balance", 0.1, True)):
            total = 0.0
            for seed in range(seeds):
                c, ticks, _ = spread(n, crash_set(members, frac, "random", seed), seed,
                                     gp_config(balance=balance))
                contacts.update(c)
                assert ticks is not None
                total += ticks / TICKS_PER_ROUND
            series[label].append((n, total / seeds))
            row.append(total / seeds)
        ok = "n-1" if contacts == {n - 1} else f"{sorted(contacts)} != n-1!"
        print(f"{n:>6} {row[0]:>11.1f} {row[1]:>11.1f} {row[2]:>9.1f} {ok:>9}")
    for label, pts in series.items():
        c = fit_log2(pts)
        worst = max(abs(r - c * math.log2(n)) / r for n, r in pts)
        a, c2 = fit_affine_log2(pts)
        print(f"fit {label:>12}: rounds ~ {c:.2f} * log2 n   (worst relative residual "
              f"{worst:.0%}); with an intercept: {a:+.1f} + {c2:.2f} * log2 n")
    return series


def coverage_under_crashes(n: int, seeds: int) -> dict[str, list[tuple[float, float]]]:
    print(f"\n== Coverage of live nodes with crashed nodes, n = {n} (mean over {seeds} seeds;"
          " rounds = time to cover every live node)")
    print(f"{'crashed':>8} {'choice':>12} {'variant':>10} {'coverage':>9} {'contacts':>9} "
          f"{'rounds':>8}")
    series: dict[str, list[tuple[float, float]]] = {}
    members = node_ids(n)
    variants = (("plain GP", dict(permute=False)), ("GP+perm", {}),
                ("balanced", dict(balance=True)))
    for frac in (0.0, 0.1, 0.5, 0.9):
        for how in ("adversarial", "random"):
            for name, kw in variants:
                cover = rounds = 0.0
                contacts: set[int] = set()
                for seed in range(seeds):
                    c, ticks, frac_cov = spread(n, crash_set(members, frac, how, seed), seed,
                                                gp_config(**kw))
                    contacts.update(c)
                    cover += frac_cov
                    rounds += (ticks if ticks is not None else math.nan) / TICKS_PER_ROUND
                ok = "n-1" if contacts == {n - 1} else f"{sorted(contacts)}!"
                print(f"{frac:>8.0%} {how:>12} {name:>10} {cover / seeds:>9.1%} {ok:>9} "
                      f"{rounds / seeds:>8.1f}")
                series.setdefault(f"{name}, {how}", []).append((frac, rounds / seeds))
    return series


def loss_with_anti_entropy(sizes: list[int], seeds: int) -> None:
    print("\n== 5% message loss: GP alone vs GP + push-pull anti-entropy every 10 ticks "
          "(one rumor)")
    print(f"{'n':>6} {'membership':>10} {'GP alone covers':>15} {'full coverage after':>20} "
          f"{'msgs/node':>9}")
    for n, membership in sizes_with_membership(sizes):
        alone = 0.0
        ticks_all: list[int] = []
        msgs = 0
        for seed in range(seeds):
            sim = GossipSim(SimConfig(n=n, seed=seed, loss=0.05, gossip=gp_config()))
            sim.run(1)
            rid = sim.publish(sim.members[0], b"r %d" % seed)
            sim.run_until(lambda s: s.quiescent(), 40 * n)
            alone += len(sim.informed(rid)) / n
            sim = GossipSim(SimConfig(n=n, seed=seed, loss=0.05, gossip=GossipConfig(
                call_timeout=3, anti_entropy_interval=10, membership=membership)))
            sim.run(1)
            rid = sim.publish(sim.members[0], b"r %d" % seed)
            sim.run_until(lambda s, r=rid: s.covered([r]), 2000)  # type: ignore[misc]
            t = sim.coverage_time(rid)
            ticks_all.append(t if t is not None else -1)
            msgs += sum(sim.stats.sends.values())
        mean = sum(ticks_all) / len(ticks_all)
        print(f"{n:>6} {'on' if membership else 'off':>10} {alone / seeds:>15.1%} "
              f"{mean:>9.1f} ticks ({mean / TICKS_PER_ROUND:.0f} rds) "
              f"{msgs / seeds / n:>7.1f}")


def sizes_with_membership(sizes: list[int]) -> list[tuple[int, bool]]:
    return [(n, False) for n in sizes] + [(n, True) for n in sizes if n <= 200]


def membership(sizes: list[int], seeds: int, horizon: int) -> None:
    print(f"\n== SWIM/Lifeguard: one node crashed at tick 40; {horizon} ticks; probe every "
          f"{GossipConfig().swim.probe_interval} ticks (mean over {seeds} seeds)")
    print(f"{'n':>5} {'loss':>5} {'1st suspect':>11} {'dead at all':>11} "
          f"{'live nodes suspected':>20} {'false deaths':>12} {'msgs/node/tick':>14}")
    for n in sizes:
        for loss in (0.0, 0.05, 0.10):
            first = everywhere = 0.0
            suspected = deaths = 0
            msgs = 0
            done = 0
            for seed in range(seeds):
                sim = GossipSim(SimConfig(n=n, seed=seed, loss=loss,
                                          gossip=GossipConfig(call_timeout=3)))
                sim.run(40)
                victim = sim.members[random.Random(seed).randrange(1, n)]
                sim.crash(victim)

                def dead_all(s: GossipSim, v: NodeId = victim) -> bool:
                    return all(s.nodes[m].membership_view()[v][0] == "DEAD" for m in s.alive)

                if sim.run_until(dead_all, horizon - 40):
                    everywhere += sim.now - 40
                    done += 1
                sim.run(max(0, horizon - sim.now))
                first += min((t for t, _, x, st in sim.stats.changes
                              if x == victim and st == MemberStatus.SUSPECT), default=0) - 40
                suspected += len({x for _, _, x, st in sim.stats.changes
                                  if x != victim and st == MemberStatus.SUSPECT})
                deaths += sum(1 for _, _, x, st in sim.stats.changes
                              if x != victim and st == MemberStatus.DEAD)
                msgs += sum(sim.stats.sends.values())
            dead_txt = f"{everywhere / done:.0f}" if done else "never"
            print(f"{n:>5} {loss:>5.0%} {first / seeds:>11.0f} {dead_txt:>11} "
                  f"{suspected / seeds:>20.1f} {deaths / seeds:>12.1f} "
                  f"{msgs / seeds / n / horizon:>14.2f}")


def simulator_speed() -> None:
    print("\n== Simulator speed, n = 1000 (CPU seconds of this process)")
    cpu = time.process_time()
    c, ticks, _ = spread(1000, frozenset(), 0, gp_config())
    print(f"one wave, GP alone: {time.process_time() - cpu:.1f} s "
          f"(set-up included; {ticks} ticks, {c[0]} contacts)")
    cpu = time.process_time()
    sim = GossipSim(SimConfig(n=1000, seed=0, loss=0.05, gossip=GossipConfig(call_timeout=3)))
    sim.run(1)
    setup = time.process_time() - cpu
    sim.publish(sim.members[0], b"r")
    sim.run(99)
    print(f"everything on (SWIM, anti-entropy, 5% loss): set-up {setup:.1f} s, then "
          f"{(time.process_time() - cpu - setup) / 99 * 1000:.0f} ms per tick "
          f"({sum(sim.stats.sends.values()) / 100:.0f} messages per tick)")


def plots(rounds: dict[str, list[tuple[int, float]]],
          crashes: dict[str, list[tuple[float, float]]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib is not installed: no plots written)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in rounds.items():
        xs = [n for n, _ in pts]
        ax.plot(xs, [r for _, r in pts], "o", label=f"{label} crashed")
        c = fit_log2(pts)
        ax.plot(xs, [c * math.log2(x) for x in xs], "--", lw=1, label=f"{c:.2f} log2 n")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n")
    ax.set_ylabel("rounds to cover every live node")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "gossip_rounds.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in crashes.items():
        ax.plot([f * 100 for f, _ in pts], [r for _, r in pts], "o-", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("% of nodes crashed")
    ax.set_ylabel("rounds to cover every live node")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "gossip_crashes.png", dpi=110)
    print(f"\nplots: {DOCS / 'gossip_rounds.png'}, {DOCS / 'gossip_crashes.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller n, fewer seeds")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    seeds = args.seeds or (1 if args.quick else 3)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sizes = [16, 32, 64, 128, 256] + ([] if args.quick else [512, 1000])
    rounds = rounds_vs_n(sizes, seeds)
    crashes = coverage_under_crashes(200 if args.quick else 1000, 1 if args.quick else 2)
    loss_with_anti_entropy([100] if args.quick else [100, 1000], seeds)
    membership([30] if args.quick else [50, 100], seeds, 300)
    simulator_speed()
    if not args.no_plots:
        plots(rounds, crashes)
    print(f"\ncpu {time.process_time() - cpu0:.1f} s, wall {time.perf_counter() - wall0:.1f} s")


if __name__ == "__main__":
    main()

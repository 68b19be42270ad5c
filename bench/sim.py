"""Simulator throughput: message deliveries and committed client ops per wall-clock second.

Runs fault-free seeds of a 3- and a 5-node Raft cluster (codec on, as in sweeps) and prints
deliveries/wall-s, ok ops/wall-s and wall seconds per seed, against the target of 20,000
deliveries per wall-second on one core. Usage: `python bench/sim.py [--seeds N] [--time SECONDS]`.

Also printed: deliveries per CPU-second of this process (`time.process_time`), which a shared,
loaded machine distorts far less than the wall-clock rate (the verdict stays on the wall rate),
its inverse (CPU microseconds per delivery) and the deliveries counted over all seeds (a
protocol change that alters the message pattern changes that count, and with it what a
delivery costs on average: compare CPU per delivery only where the counts are close).
"""

from __future__ import annotations

import argparse
import time

from phalanx.jepsen.sim.run import RunConfig, run

TARGET_DELIVERIES_PER_S = 20_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--time", type=float, default=3.0, help="virtual seconds per seed")
    parser.add_argument("--faults", default="none", help="'none' (default) or 'all'")
    args = parser.parse_args()
    faults: tuple[str, ...] = () if args.faults == "none" else RunConfig(seed=0).faults
    print(f"{'nodes':>5} {'deliveries/s':>13} {'ok ops/s':>9} {'sim s/wall s':>12} "
          f"{'wall s/seed':>11} {'deliv/cpu-s':>11} {'cpu us/deliv':>12} {'deliveries':>10}"
          "  vs target")
    for nodes in (3, 5):
        deliveries = ops = 0
        wall = virtual = cpu = 0.0
        for seed in range(args.seeds):
            cfg = RunConfig(seed=seed, nodes=nodes, faults=faults, time_ns=int(args.time * 1e9))
            cpu0 = time.process_time()
            result = run(cfg)
            cpu += time.process_time() - cpu0
            deliveries += result.deliveries
            ops += result.ops_ok
            wall += result.wall_s
            virtual += (cfg.time_ns + cfg.liveness_ns) / 1e9
        rate = deliveries / wall
        verdict = "OK" if rate >= TARGET_DELIVERIES_PER_S else "BELOW"
        print(
            f"{nodes:>5} {rate:>13,.0f} {ops / wall:>9,.0f} {virtual / wall:>12.2f} "
            f"{wall / args.seeds:>11.2f} {deliveries / cpu:>11,.0f} "
            f"{cpu / deliveries * 1e6:>12.2f} {deliveries:>10,}  "
            f"{verdict} ({rate / TARGET_DELIVERIES_PER_S:.0%} of {TARGET_DELIVERIES_PER_S:,})"
        )


if __name__ == "__main__":
    main()

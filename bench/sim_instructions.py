"""Instructions per simulated delivery (valgrind callgrind), for Raft and PBFT.

A fixed-seed, fault-free simulator run is deterministic, so its instruction count is too:
counting instructions (not seconds) makes A/B comparisons of hot-path changes exact on a
machine whose speed drifts. Each protocol runs twice, for `--short` and `--long` virtual
seconds; the difference of the two counts divided by the difference of deliveries removes
start-up (imports, cluster boot). Needs `valgrind` on PATH.

    python bench/sim_instructions.py            # ~2 minutes
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile

CASES = (("raft", 3), ("pbft", 4))


def count(protocol: str, nodes: int, seconds: float) -> tuple[int, int]:
    """(instructions, deliveries) of one run under callgrind."""
    code = ("from phalanx.jepsen.sim.run import RunConfig, run\n"
            f"r = run(RunConfig(seed=3, protocol={protocol!r}, nodes={nodes}, faults=(), "
            f"swarm=False, time_ns={int(seconds * 1e9)}))\n"
            "print('DELIVERIES', r.deliveries)\n")
    with tempfile.NamedTemporaryFile() as out:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}",
             sys.executable, "-c", code], capture_output=True, text=True, check=True)
    instructions = re.search(r"Collected : (\d+)", proc.stderr)
    deliveries = re.search(r"DELIVERIES (\d+)", proc.stdout)
    if instructions is None or deliveries is None:
        raise SystemExit(f"could not read callgrind's output:\n{proc.stderr[-2000:]}")
    return int(instructions.group(1)), int(deliveries.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", type=float, default=0.5, help="virtual seconds (default 0.5)")
    p.add_argument("--long", type=float, default=1.5, help="virtual seconds (default 1.5)")
    args = p.parse_args()
    print(f"{'protocol':>8} {'deliveries':>10} {'instructions/delivery':>22}")
    for protocol, nodes in CASES:
        i1, d1 = count(protocol, nodes, args.short)
        i2, d2 = count(protocol, nodes, args.long)
        print(f"{protocol:>8} {d2 - d1:>10} {(i2 - i1) / (d2 - d1):>22,.0f}", flush=True)


if __name__ == "__main__":
    main()

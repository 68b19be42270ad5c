"""Fixed-seed simulator trace hashes, to prove a refactoring changed no behaviour.

Prints one line per run, ``PROTOCOL SEED SHA256``, for the seeds of each protocol (Raft
with every simulator fault kind; PBFT plain and with one Byzantine replica; each with a
deliberate bug switched on too). Run before and after a change and compare:

    python bench/trace_hashes.py > before.txt   # on the old commit
    python bench/trace_hashes.py --check before.txt

`--check FILE` exits 1 and lists the runs whose hash differs.
"""

from __future__ import annotations

import argparse
import sys

from phalanx.jepsen.sim.run import RunConfig, run

CASES: tuple[tuple[str, dict[str, object]], ...] = (
    ("raft", {}),
    ("raft", {"bugs": frozenset({"commit_on_minority"})}),
    ("pbft", {"nodes": 4}),
    ("pbft", {"nodes": 4, "byzantine": 1}),
    ("pbft", {"nodes": 4, "bugs": frozenset({"commit_on_2f"})}),
)


def lines(seeds: int) -> list[str]:
    out = []
    for protocol, extra in CASES:
        label = protocol + "".join(
            f",{k}={'+'.join(sorted(v)) if isinstance(v, frozenset) else v}"
            for k, v in extra.items())
        for seed in range(1, seeds + 1):
            result = run(RunConfig(seed=seed, protocol=protocol, **extra))  # type: ignore[arg-type]
            out.append(f"{label} {seed} {result.trace_hash}")
            print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=6, help="seeds per case (default 6)")
    p.add_argument("--check", metavar="FILE", help="compare against a previous output")
    args = p.parse_args(argv)
    got = lines(args.seeds)
    if args.check is None:
        return 0
    with open(args.check) as f:
        want = [line.strip() for line in f if line.strip()]
    diff = sorted(set(want) ^ set(got))
    if diff:
        print("DIFFERENT:\n" + "\n".join(diff), file=sys.stderr)
        return 1
    print(f"all {len(got)} trace hashes identical", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

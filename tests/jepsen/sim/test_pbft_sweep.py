"""PBFT under the simulator: sweeps with up to f Byzantine replicas at n=4 and n=7 pass every
check; the f+1 control (two twinned identities at n=4) must be caught."""

from __future__ import annotations

import os

from phalanx.jepsen.sim.run import RunConfig
from phalanx.jepsen.sim.sweep import sweep

_MS = 1_000_000
# Cheap but meaningful: faults for 0.6 s (swarm fault subsets), 1.2 s to heal and finish.
_SHAPE = {"time_ns": 600 * _MS, "liveness_ns": 1_200 * _MS, "clients": 2, "keys": 2}
# `make test` runs 60 seeds (two thirds at n=4, the rest at n=7); `make sweeps` runs 300.
SEEDS = int(os.environ.get("PHALANX_PBFT_SEEDS", "60"))


def test_sweep_with_f_byzantine_replicas_mixes_n4_and_n7() -> None:
    failures = []
    n4 = SEEDS * 2 // 3
    for n, seeds in ((4, range(0, n4)), (7, range(200, 200 + SEEDS - n4))):
        base = RunConfig(seed=0, protocol="pbft", nodes=n, byzantine=(n - 1) // 3, **_SHAPE)
        result = sweep(base, seeds, jobs=2)
        failures += [o.report for o in result.failures]
    assert not failures, "\n\n".join(failures[:3])


def test_f_plus_one_twins_control_is_caught() -> None:
    # Budget: 2 seeds. Seed 0 already fails (agreement between the two honest replicas).
    base = RunConfig(seed=0, protocol="pbft", nodes=4, twins=2, faults=(), swarm=False, **_SHAPE)
    result = sweep(base, range(2), jobs=1, stop_on_failure=True)
    assert not result.ok, "two twinned identities at n=4 went unnoticed"
    assert "violation: agreement" in result.failures[0].report

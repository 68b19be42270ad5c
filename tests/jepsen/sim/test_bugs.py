"""The checks can fail: with a deliberate Raft bug switched on, a small seeded sweep under a
fault mix that exposes it must report a violation (and name the seed)."""

from __future__ import annotations

import pytest

from phalanx.jepsen.sim.run import RunConfig
from phalanx.jepsen.sim.sweep import sweep

_MS = 1_000_000

# bug -> (fault mix, nodes, seed budget). Budgets are fixed: the runs are deterministic, so a
# bug found within its budget today is found at the same seed tomorrow.
CASES = {
    "commit_on_minority": (("isolate-leader",), 3, 4),
    "skip_vote_term_check": (("partition-one", "partition-halves", "loss", "delay"), 3, 6),
    "truncate_matching_suffix": (("duplicate", "delay", "loss"), 3, 2),
}


@pytest.mark.parametrize("bug", sorted(CASES))
def test_sweep_catches_deliberate_bug(bug: str) -> None:
    faults, nodes, budget = CASES[bug]
    base = RunConfig(
        seed=0, nodes=nodes, faults=faults, bugs=frozenset({bug}),
        time_ns=1_500 * _MS, liveness_ns=1_500 * _MS,
    )
    result = sweep(base, range(budget), jobs=1, stop_on_failure=True)
    assert not result.ok, f"{bug} went unnoticed in {budget} seeds"
    report = result.failures[0].report
    assert "violation:" in report
    assert f"--bug {bug}" in report

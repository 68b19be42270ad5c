"""The checks can fail: with a deliberate Raft bug switched on, a small seeded sweep under a
fault mix that exposes it must report a violation (and name the seed), and where a safety
check can see the bug, it must be a safety check (not only liveness or the runaway guard)
that reports it.

Not here: `forget_persist_vote`. Catching it needs two candidates in one term and a voter
that crashes between their RequestVotes; the `crash-after-ready` and `straggle` faults make
that possible but not yet likely enough for a budget `make test` affords (see the report of
the simulator work); `tests/consensus/raft/test_bug_scenarios.py` covers it as a scenario.
"""

from __future__ import annotations

import pytest

from phalanx.jepsen.sim.run import RunConfig
from phalanx.jepsen.sim.sweep import sweep

_MS = 1_000_000
_SAFETY = ("election-safety", "log-matching", "leader-completeness", "state-machine-safety",
           "committed-durable", "linearizability")

# bug -> (fault mix, nodes, seed budget, first catching seed today). Budgets are fixed and the
# runs deterministic (swarm off: the mix and the protocol defaults are exactly these), so a bug
# found within its budget today is found at the same seed tomorrow.
CASES = {
    "commit_on_minority": (("isolate-leader",), 3, 4),
    "skip_vote_term_check": (("partition-one", "partition-halves", "loss", "delay"), 3, 16),
    "truncate_matching_suffix": (("duplicate", "delay", "loss"), 3, 2),
}


@pytest.mark.parametrize("bug", sorted(CASES))
def test_sweep_catches_deliberate_bug_with_a_safety_check(bug: str) -> None:
    faults, nodes, budget = CASES[bug]
    base = RunConfig(
        seed=0, nodes=nodes, faults=faults, bugs=frozenset({bug}), swarm=False,
        time_ns=1_500 * _MS, liveness_ns=1_500 * _MS,
    )
    result = sweep(base, range(budget), jobs=1, stop_on_failure=True)
    assert not result.ok, f"{bug} went unnoticed in {budget} seeds"
    report = result.failures[0].report
    assert f"--bug {bug}" in report
    assert "--no-swarm" in report
    violations = [line for line in report.splitlines() if "violation:" in line]
    assert any(v.split("violation: ", 1)[1].startswith(_SAFETY) for v in violations), violations

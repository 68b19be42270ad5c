"""Seeded random schedules (loss, duplication, reordering, partitions, crashes, membership
changes, checkpoints) checked for Raft's safety properties and for liveness after healing;
and the same sweep with a deliberate bug on must find a violation. (forget_persist_vote and
truncate_matching_suffix need rarer interleavings than this small sweep produces: they are
pinned down by exact scenarios in test_bug_scenarios.py.)"""

from __future__ import annotations

import pytest
from fuzz_cluster import run_schedule


@pytest.mark.parametrize("membership", [False, True])
def test_random_schedules_are_safe_and_live(membership: bool) -> None:
    committed = 0
    for seed in range(25):
        out = run_schedule(seed, membership=membership)
        assert out.violations == [], f"seed {seed}: {out.violations}"
        committed += out.committed
    assert committed > 25  # the schedules make real progress


@pytest.mark.parametrize(("bug", "nodes", "budget"), [
    ("commit_on_minority", 3, 20),
    ("skip_vote_term_check", 5, 300),
])
def test_sweep_catches_deliberate_bug(bug: str, nodes: int, budget: int) -> None:
    for seed in range(budget):
        if run_schedule(seed, bugs=frozenset({bug}), nodes=nodes).violations:
            return
    pytest.fail(f"{bug}: no violation in {budget} seeds")

"""The leaderless core in the simulator: a seeded sweep (200 seeds), the deliberate bugs
caught, f Byzantine nodes tolerated and the f+1 control detected, and the core gaps the sweep
found (kept as regression seeds now that the core fixed them).

Faults: the sweeps draw every simulator fault kind but lose-disk (chosen when the core had
no amnesia recovery and the simulator's lose-disk was a plain kill; it now recovers with the
amnesia fence and state transfer); the n = 7 regression runs use every kind. The Byzantine
runs keep to the kinds that restart no node: an equivocating endorser plus a crashed honest
node leaves honest replicas apart (a core gap, docs/LEADERLESS.md "Simulation";
`BYZANTINE_FAULTS`).

Budget: the seeds are cheap (0.5 s of faults, 2.5 s of liveness, ~20 transactions); the
whole file costs about a minute of CPU (the n = 7 tests ~11 s of it). `make sim-leaderless`
runs the long sweeps."""

from __future__ import annotations

import pytest

from phalanx.consensus.leaderless.bugs import BUG_NAMES
from phalanx.jepsen.leaderless_byzantine import LEADERLESS_BEHAVIOURS
from phalanx.jepsen.sim.leaderless import SIM_KNOBS
from phalanx.jepsen.sim.run import RunConfig, RunResult, run, swarm_choices
from phalanx.jepsen.sim.sweep import sweep
from phalanx.protocols import get as get_protocol

BYZANTINE_FAULTS = ("pause", "partition-one", "partition-halves", "partition-ring",
                    "partition-asymmetric", "loss", "duplicate", "delay", "straggle",
                    "clock-skew")
FAULTS = (*BYZANTINE_FAULTS, "kill", "lose-unfsynced", "crash-after-ready")
_S = 1_000_000_000


def sim(seed: int, *, faults: tuple[str, ...] = FAULTS, time_s: float = 0.5,
        liveness_s: float = 2.5, bugs: frozenset[str] = frozenset(),
        byzantine: int = 0, settings: tuple[tuple[str, int], ...] = ()) -> RunResult:
    return run(RunConfig(seed=seed, protocol="leaderless", nodes=4, faults=faults, bugs=bugs,
                         byzantine=byzantine, time_ns=int(time_s * _S),
                         liveness_ns=int(liveness_s * _S), settings=settings))


def failures(results: list[RunResult]) -> str:
    return "\n\n".join(r.report() for r in results if not r.ok)


@pytest.mark.parametrize("start", [0, 100])
def test_sweep(start: int) -> None:
    """100 seeds a chunk, 200 in all: swarm-drawn faults and knobs, n=4; two worker
    processes (the seeds are independent, and the suite runs on 2 cores)."""
    base = RunConfig(seed=0, protocol="leaderless", nodes=4, faults=FAULTS,
                     time_ns=int(0.5 * _S), liveness_ns=int(2.5 * _S))
    result = sweep(base, range(start, start + 100), jobs=2)
    assert result.ok, "\n\n".join(o.report for o in result.failures)
    assert len(result.outcomes) == 100
    assert sum(o.ops_ok for o in result.outcomes) > 15 * 100  # the clients got work done


def test_the_registry_draws_the_simulators_knobs() -> None:
    spec = get_protocol("leaderless")
    assert spec.sim_knobs == SIM_KNOBS
    assert spec.byzantine_modes == LEADERLESS_BEHAVIOURS


CAUGHT: dict[str, tuple[int, ...]] = {
    # Two conflicting puts both commit: one is held at the version gate forever.
    # (Re-seeded with state transfer, whose keep-alive answers shift message timing: seed 0
    # no longer catches it, 4 does.)
    # (Re-seeded with batch endorsements, which stop relaying a transaction endorsed on
    # submit: seed 4 no longer catches it; 2, 3 and 7 do.)
    "endorse_despite_conflict": (2, 3, 7),
    # A chained put released before its predecessor applied at a lagging replica: the
    # conflicting puts apply in different orders.
    # (Re-seeded after merging main's reliable-broadcast veto into the hot-path branch:
    # seed 2 no longer catches it; of seeds 0-13 only 8, 10 and 13 do.)
    # (Re-seeded again with state transfer: its keep-alive queries shift message timing;
    # seed 8 no longer catches it, 1 does.)
    # (Re-seeded with batch endorsements: of seeds 0-83 only 34, 53 and 83 do.)
    "no_version_gate": (34, 53, 83),
    # A stale versioned put is endorsed and commits; its requirement never holds again.
    # (Seed 1 no longer catches it after that merge; 0, 2 and 3 do.)
    "skip_requirements": (0, 2, 3),
}
"""Per bug switch, seeds of the sweep (its faults and timing) whose checker fails with it."""


@pytest.mark.parametrize(("bug", "seeds"), sorted(CAUGHT.items()))
def test_a_deliberate_bug_is_caught(bug: str, seeds: tuple[int, ...]) -> None:
    for seed in seeds:
        caught = sim(seed, bugs=frozenset({bug}))
        assert not caught.ok, f"seed {seed}: --bug {bug} not caught"
        assert f"--bug {bug}" in caught.report()
    # (The same seeds pass without the bug: they are in `test_sweep`.)


def test_every_bug_is_caught_or_covered_elsewhere() -> None:
    """Two switches are not caught by a cheap sweep: both need a transaction whose quorum
    completes late (an endorsement signed before its deadline delivered after a conflicting
    transaction was endorsed on condition of it and committed). `drop_on_commit` is covered
    by the core's `test_gaps.py::test_no_drop_on_commit`, `count_conditional` by the seed
    below (a longer run under delay, straggle and loss, more conflicts and short deadlines)
    and by `test_config_bugs.py::test_count_conditional_commits_both_of_a_late_quorum`.
    `ordered_one_close` (the ordered resolution's) needs a Byzantine closer and a slow committer:
    `test_leaderless_ordered_veto.py::test_one_close_is_not_enough`. The state-transfer
    switches need a node away past the GC horizon: `skip_checkpoint_digest` is covered by
    `tests/consensus/leaderless/test_state_transfer.py`, `no_state_transfer` by
    `test_leaderless_state_transfer_sim.py`."""
    assert set(BUG_NAMES) == {*CAUGHT, "drop_on_commit", "count_conditional",
                              "ordered_one_close", "skip_checkpoint_digest",
                              "no_state_transfer"}


LATE_QUORUM = ("delay", "straggle", "loss", "partition-one")
LATE_QUORUM_MIX = (("conflict_pct", 60), ("hot_jitter_ms", 30), ("short_max_ms", 80),
                   ("short_pct", 30))
"""Since batch endorsements (a transaction endorsed on submit is no longer relayed, so
arrival orders vary less) seed 71 stopped catching it; under this mix (more conflicts, more
short deadlines) seed 76, the first of 0-76, did; since own signatures are re-sent in one
`SignatureResend` per peer (wire id 350) seed 70, the first of 0-70, does.
`tests/consensus/leaderless/test_config_bugs.py::test_count_conditional_commits_both_of_a_
late_quorum` builds the scenario by hand."""


@pytest.mark.parametrize("seed", [70])
def test_count_conditional_is_caught_by_a_late_quorum(seed: int) -> None:
    """A transaction expires while its endorsements split; a conflicting one is endorsed on
    condition of it and, counted at once, commits; the first one's quorum then completes
    late: both commit and the second's requirement never holds where it is gated."""
    assert sim(seed, faults=LATE_QUORUM, time_s=1.5, liveness_s=3.0,
               settings=LATE_QUORUM_MIX).ok
    caught = sim(seed, faults=LATE_QUORUM, time_s=1.5, liveness_s=3.0,
                 bugs=frozenset({"count_conditional"}), settings=LATE_QUORUM_MIX)
    assert not caught.ok
    assert "--bug count_conditional" in caught.report()


def test_f_byzantine_nodes_are_tolerated() -> None:
    """K = f = 1 at n = 4, seeded behaviours (one or two of `LEADERLESS_BEHAVIOURS`)."""
    results = [sim(seed, faults=BYZANTINE_FAULTS, byzantine=1) for seed in range(15)]
    assert failures(results) == ""


def test_f_byzantine_seed_22() -> None:
    """Found by the sweep before the core's anti-entropy and kept abort certificates: one
    equivocating node (n2), and honest replicas ended with different values of r0."""
    assert sim(22, faults=BYZANTINE_FAULTS, byzantine=1).ok


def test_the_f_plus_one_control_is_detected() -> None:
    """K = f+1 = 2 at n = 4: some seed must fail (seeds 34 and 35 since a fetched commit
    certificate commits past an equivocator: seeds 0-3 no longer diverge)."""
    results = [sim(seed, faults=BYZANTINE_FAULTS, byzantine=2) for seed in (34, 35)]
    assert any(not r.ok for r in results)


def test_a_restarted_node_catches_up() -> None:
    """n3 killed 368-969 ms while transactions commit: before the core's anti-entropy
    (`CommittedDigest`) it never heard of them and the replicas diverged."""
    assert sim(7, faults=("lose-unfsynced", "lose-disk", "kill"), time_s=1.0,
               liveness_s=3.0).ok


def test_mixed_update_kinds_on_one_key() -> None:
    """Seeds whose swarm draw mixes puts, adds and muls on ``x0`` and sadds and srems of one
    member on ``y0`` (`mixed_pct`): commuting updates require base versions, switches of a
    run the full one; every check (convergence, order, requirements) must pass."""
    mixed = [seed for seed in range(200)
             if dict(swarm_choices(RunConfig(seed=seed, protocol="leaderless", nodes=4,
                                             faults=FAULTS))[1]).get("mixed_pct")][:30]
    assert len(mixed) == 30
    results = [sim(seed) for seed in mixed]
    assert failures(results) == ""


def test_sweep_n7() -> None:
    """12 seeds at n = 7 (f = 2, Q = 5; the sweep above is n = 4 only), the same faults and
    budget: ~0.6 s of CPU a seed."""
    base = RunConfig(seed=0, protocol="leaderless", nodes=7, faults=FAULTS,
                     time_ns=int(0.5 * _S), liveness_ns=int(2.5 * _S))
    result = sweep(base, range(12), jobs=2)
    assert result.ok, "\n\n".join(o.report for o in result.failures)
    assert sum(o.ops_ok for o in result.outcomes) > 15 * 12


@pytest.mark.parametrize("seed", [0, 17])
def test_an_amnesiac_node_counts_its_own_lost_endorsements(seed: int) -> None:
    """Issue 15 (`phalanx sim --protocol leaderless --seed-start 0 --seeds 1 --nodes 7
    --bug no_state_transfer`): n6 loses its disk at 1.64 s; the certificate of `put r0 v15`
    needs its pre-loss endorsement, which the core skipped as "our own, echoed back", so
    the restarted n6 never committed it and held the six later puts of r0 at the gate.
    State transfer is switched off so that the fetch path alone must catch up (with it,
    the install happens to cover v15 and hides the bug). Seed 17 failed the same way."""
    result = run(RunConfig(seed=seed, protocol="leaderless", nodes=7,
                           bugs=frozenset({"no_state_transfer"})))
    assert result.ok, result.report()

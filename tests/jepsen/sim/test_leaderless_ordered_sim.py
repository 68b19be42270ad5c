"""The leaderless core with `stuck_resolution = "pbft"` (checkpoint votes ordered through an
embedded PBFT) in the simulator, under the leaderless checker: a seeded sweep, the
deliberate bugs still caught, and `phalanx sim --set` (docs/LEADERLESS.md "Ordered
resolution"). Same faults and budget per seed as `test_leaderless_sim.py`; the longer sweep
is marked long (`make sweeps`)."""

from __future__ import annotations

import pytest
from bug_seed_search import CatchRange, first_catch
from test_leaderless_sim import CHAINS

from phalanx.jepsen.sim.cli import parse_settings
from phalanx.jepsen.sim.run import RunConfig, RunResult, run, swarm_choices

FAULTS = ("pause", "partition-one", "partition-halves", "partition-ring",
          "partition-asymmetric", "loss", "duplicate", "delay", "straggle", "clock-skew",
          "kill", "lose-unfsynced", "crash-after-ready")
PBFT = (("stuck_resolution", "pbft"),)
_S = 1_000_000_000


def sim(seed: int, *, bugs: frozenset[str] = frozenset()) -> RunResult:
    return run(RunConfig(seed=seed, protocol="leaderless", nodes=4, faults=FAULTS, bugs=bugs,
                         time_ns=_S // 2, liveness_ns=int(2.5 * _S), settings=PBFT))


def failures(results: list[RunResult]) -> str:
    return "\n\n".join(r.report() for r in results if not r.ok)


def test_sweep_in_pbft_mode() -> None:
    """24 seeds (the same faults and swarm knobs as the veto-mode sweep's first seeds)."""
    results = [sim(seed) for seed in range(24)]
    assert failures(results) == ""
    assert sum(r.ops_ok for r in results) > 15 * len(results)


@pytest.mark.long
@pytest.mark.parametrize("start", [24, 62])
def test_long_sweep_in_pbft_mode(start: int) -> None:
    """Seeds 24-99 (with the fast test: 100)."""
    results = [sim(seed) for seed in range(start, start + 38)]
    assert failures(results) == ""


CAUGHT: dict[str, CatchRange] = {
    "endorse_despite_conflict": CatchRange(seeds=range(24), known=(2, 3)),
    "no_version_gate": CatchRange(seeds=range(24), known=(0, 3, 7)),
    "skip_requirements": CatchRange(seeds=range(16), known=(2, 3)),
}
"""The veto-mode controls (`test_leaderless_sim.py`), in pbft mode: a seed range each, at
least one seed must catch the bug (`bug_seed_search`; the pinned seeds moved with every
change of arrival orders). `no_version_gate` uses the chain mix (`CHAINS`)."""


@pytest.mark.parametrize(("bug", "where"), sorted(CAUGHT.items()))
def test_the_deliberate_bugs_are_still_caught(bug: str, where: CatchRange) -> None:
    def run_seed(seed: int, bugs: frozenset[str]) -> RunResult:
        if bug != "no_version_gate":
            return sim(seed, bugs=bugs)
        return run(RunConfig(seed=seed, protocol="leaderless", nodes=4, faults=CHAINS.faults,
                             bugs=bugs, time_ns=int(CHAINS.time_s * _S),
                             liveness_ns=int(2.5 * _S), settings=(*PBFT, *CHAINS.settings)))

    caught = first_catch(bug, where, run_seed)
    assert "--set stuck_resolution=pbft" in caught.report()  # the replay command


def test_set_fixes_a_knob_over_the_swarm() -> None:
    assert parse_settings(["stuck_resolution=pbft", "close_ticks=50", "x=true"]) == (
        ("close_ticks", 50), ("stuck_resolution", "pbft"), ("x", True))
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_settings(["stuck_resolution"])
    cfg = RunConfig(seed=3, protocol="leaderless", nodes=4, settings=PBFT)
    assert dict(swarm_choices(cfg)[1])["stuck_resolution"] == "pbft"
    assert "--set stuck_resolution=pbft" in cfg.replay_command()


def test_the_sim_command_runs_the_pbft_mode(capsys: pytest.CaptureFixture[str]) -> None:
    from phalanx.cli.main import main

    argv = ["sim", "--protocol", "leaderless", "--nodes", "4", "--seeds", "1", "--time", "0.3",
            "--liveness", "2"]
    assert main([*argv, "--set", "stuck_resolution=pbft"]) == 0
    assert "1 passed" in capsys.readouterr().out
    assert main([*argv, "--set", "stuck_resolution=quorum"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "stuck_resolution must be one of veto, pbft" in err


BYZANTINE_FAULTS = FAULTS[:10]  # the kinds that restart no node (test_leaderless_sim.py)


@pytest.mark.parametrize("seeds", [range(4), pytest.param(range(4, 40), marks=pytest.mark.long)])
def test_f_byzantine_nodes_are_tolerated_in_pbft_mode(seeds: range) -> None:
    """K = f = 1 with seeded behaviours (the vote lies act on its ordered votes: stripped,
    forged or equivocated evidence), many conflicting puts (`conflict_pct` 60) so that
    checkpoints happen. 40 seeds passed when this was written (forge_veto fired 27 times)."""
    results = [run(RunConfig(seed=seed, protocol="leaderless", nodes=4,
                             faults=BYZANTINE_FAULTS, byzantine=1, time_ns=_S // 2,
                             liveness_ns=int(2.5 * _S),
                             settings=(*PBFT, ("conflict_pct", 60))))
               for seed in seeds]
    assert failures(results) == ""

"""Whole-cluster simulations: determinism (same seed, same trace and history), seeded sweeps
that must pass, and the failure report's replay command.

The CI sweep (`test_swarm_sweep_passes`) runs SWARM_SEEDS seeds (default 60, `make sweeps`:
300; half on 3 nodes, half on 5) on two worker processes. Each seed draws its own subset of
every fault kind (kill, lose-unfsynced, pause, the five partitions, loss, duplicate, delay,
clock-skew, crash-after-ready, straggle) and its own Raft knobs (pre-vote, check-quorum,
election and heartbeat ticks, pipelining, batch size, log tail kept at compaction, checkpoint
interval), then runs 0.6 virtual seconds of faults and 1.0 s of healed liveness checks with
three clients over three keys; it is checked for election safety, log matching, leader
completeness, state-machine safety, committed-durable, monotone commit, linearizability and
liveness. The CLI default (2 s + 2 s) is richer; `make soak` runs 10,000 such seeds.
PHALANX_SIM_SEEDS scales the per-mix sweeps, PHALANX_SWARM_SEEDS the swarm sweep."""

from __future__ import annotations

import os

import pytest

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.run import RunConfig, run
from phalanx.jepsen.sim.sweep import sweep

_MS = 1_000_000
# Shorter runs than the CLI default keep `make test` within its budget; PHALANX_SIM_SEEDS
# raises the per-mix seed count, PHALANX_SWARM_SEEDS the swarm's (`make sweeps`: 300; the CLI
# and `make soak` run the long sweeps).
SEEDS_PER_MIX = int(os.environ.get("PHALANX_SIM_SEEDS", "2"))
SWARM_SEEDS = int(os.environ.get("PHALANX_SWARM_SEEDS", "60"))
SWARM_SHAPE = {"time_ns": 600 * _MS, "liveness_ns": 1_000 * _MS}
SHORT = {"time_ns": 1_000 * _MS, "liveness_ns": 1_500 * _MS}

MIXES = {
    "none": (),
    "crash": ("kill", "lose-unfsynced", "pause"),
    "network": ("partition-one", "partition-halves", "partition-ring", "partition-asymmetric",
                "isolate-leader"),
    "packets": ("loss", "duplicate", "delay", "clock-skew"),
    "all": nemesis.SIM_FAULT_KINDS,
}


def test_same_seed_same_trace_and_history() -> None:
    cfg = RunConfig(seed=7, nodes=3, **SHORT)
    a, b = run(cfg), run(cfg)
    assert a.trace_hash == b.trace_hash
    assert a.history == b.history
    assert a.ops_ok > 50, "a fault-laden run must still do real work"
    other = run(RunConfig(seed=8, nodes=3, **SHORT))
    assert other.trace_hash != a.trace_hash


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_sweep_passes(mix: str) -> None:
    nodes = 5 if mix in ("network", "all") else 3
    base = RunConfig(seed=0, nodes=nodes, faults=MIXES[mix], swarm=False, **SHORT)
    result = sweep(base, range(1000, 1000 + SEEDS_PER_MIX), jobs=1)
    assert result.ok, "\n\n".join(o.report for o in result.failures)
    assert sum(o.ops_ok for o in result.outcomes) > 100 * SEEDS_PER_MIX


def test_swarm_sweep_passes() -> None:
    half = SWARM_SEEDS // 2
    outcomes = []
    for nodes, seeds in ((3, range(0, half)), (5, range(half, SWARM_SEEDS))):
        base = RunConfig(seed=0, nodes=nodes, faults=nemesis.SIM_FAULT_KINDS, **SWARM_SHAPE)
        result = sweep(base, seeds, jobs=2)
        assert result.ok, "\n\n".join(o.report for o in result.failures)
        outcomes += result.outcomes
    assert len(outcomes) == SWARM_SEEDS
    assert sum(o.ops_ok for o in outcomes) > 30 * SWARM_SEEDS


def test_failure_report_names_seed_and_replay_command() -> None:
    cfg = RunConfig(
        seed=0, nodes=3, faults=("isolate-leader",), bugs=frozenset({"commit_on_minority"}),
        time_ns=1_500 * _MS, liveness_ns=1_500 * _MS,
    )
    result = run(cfg)
    assert not result.ok
    report = result.report()
    assert "seed 0: FAILED" in report
    assert "phalanx sim --protocol raft --seed-start 0 --seeds 1 --nodes 3" in report
    assert "--faults isolate-leader" in report
    assert "--bug commit_on_minority" in report
    assert len(result.trace_tail) == 40


def _cli(argv: list[str]) -> int:
    import argparse

    from phalanx.jepsen.sim.cli import add_sim_command

    parser = argparse.ArgumentParser(prog="phalanx")
    add_sim_command(parser.add_subparsers())
    args = parser.parse_args(["sim", *argv])
    code: int = args.handler(args)
    return code


def test_cli_exit_codes_and_trace(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    assert _cli(["--seeds", "2", "--faults", "none", "--time", "0.5"]) == 0
    # Without --nodes, seeds alternate between 3 and 5 nodes: one labelled summary per size
    # (issue 22: they were unlabelled and said "1 seeds"), then the total.
    captured = capsys.readouterr()
    assert "raft, 3 nodes: 1 seed, 1 passed, 0 failed" in captured.out
    assert "raft, 5 nodes: 1 seed, 1 passed, 0 failed" in captured.out
    assert "all: 2 seeds, 2 passed, 0 failed" in captured.out
    assert "\r" not in captured.err  # progress is plain lines when stderr is not a terminal
    assert "raft, 5 nodes: [1/1] 0 failed" in captured.err
    trace = tmp_path / "t.txt"
    code = _cli(["--seeds", "1", "--nodes", "3", "--faults", "isolate-leader", "--time", "1.5",
                 "--bug", "commit_on_minority", "--trace", str(trace)])
    assert code == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "replay: phalanx sim" in out
    assert trace.read_text().count("\n") > 1000
    assert _cli(["--faults", "bogus"]) == 2


def test_a_replay_command_reproduces_a_non_default_run(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bug-control sweeps run 2 clients on 2 keys with a smaller event budget: the replay
    # command printed for one of their seeds must carry all of that, or it replays another run.
    import shlex
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    cfg = RunConfig(seed=5, protocol="pbft", nodes=4, byzantine=1, time_ns=600 * _MS,
                    liveness_ns=1_200 * _MS, clients=2, keys=2, max_events=30_000,
                    use_codec=False)
    expected = run(cfg).trace_hash
    argv = shlex.split(cfg.replay_command())
    assert argv[:2] == ["phalanx", "sim"]
    argv = [a if not a.startswith("trace-") else str(tmp_path / a) for a in argv[2:]]
    assert _cli(argv) in (0, 1)
    assert f"trace hash {expected}" in capsys.readouterr().out

"""`phalanx jepsen run --shards 2`: the CLI refuses bad shard options before starting anything
(fast), and a real two-shard run (PBFT 4 with an equivocating replica + Raft 3, kills, pauses
and one-node partitions in each shard) is valid; the same history with one credit removed
from the receiving shard's last read is caught as a lost credit (long: `make sweeps`, ~60 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.jepsen.cross_shard_bank import ShardSpec, check_cross_shard
from phalanx.jepsen.harness.cli import EXIT_USAGE, EXIT_VALID, add_run_command
from phalanx.jepsen.history import History, read_history


def _run(tmp_path: Path, argv: list[str]) -> tuple[int, str, Path]:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    store = tmp_path / "store"
    args = parser.parse_args(["run", "--store", str(store), *argv])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=140))
    return code, out.read_text(), store / "latest"


@pytest.mark.parametrize("argv", [
    ["--shards", "2", "--workload", "register"],
    ["--protocol", "pbft,raft"],
    ["--shards", "2", "--protocol", "pbft,raft,raft"],
    ["--shards", "2", "--byzantine", "twins"],
    ["--shards", "2", "--protocol", "pbft,raft", "--nodes", "5"],
])
def test_bad_shard_options_are_refused_before_anything_starts(
        tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, latest = _run(tmp_path, argv)
    assert code == EXIT_USAGE
    assert "error" in capsys.readouterr().err
    assert not latest.exists()


def _lose_last_credit(history: History, shard: str) -> History:
    """The history with the newest inbox entry dropped from `shard`'s last read."""
    ops = list(history.ops)
    last = max(i for i, op in enumerate(ops)
               if op.f == "read" and op.key == shard and op.type == "ok")
    state = ops[last].value
    assert isinstance(state, tuple)
    inbox = [item for item in state if str(item[0]).startswith("cs/in/")]  # type: ignore[index]
    assert inbox, "the receiving shard got no credit"
    ops[last] = dataclasses.replace(ops[last], value=tuple(
        item for item in state if item != inbox[-1]))
    return History.of(ops)


@pytest.mark.long
def test_two_shards_under_faults_with_a_byzantine_replica_are_valid(tmp_path: Path) -> None:
    code, output, latest = _run(tmp_path, [
        "--shards", "2", "--protocol", "pbft,raft", "--workload", "cross-shard-bank",
        "--nemesis", "kill,pause,partition-one", "--byzantine", "equivocate",
        "--time", "20", "--rate", "12", "--concurrency", "3", "--seed", "1"])
    assert code == EXIT_VALID, output
    run_dir = latest.resolve()
    results = json.loads((run_dir / "results.json").read_text())
    checker = results["checkers"]["cross-shard-bank"]
    assert checker["valid"] is True
    assert min(checker["reads"].values()) > 0
    assert sum(checker["final_balances"].values()) == 8_000
    assert results["counts"]["send"]["ok"] > 0
    assert results["byzantine"].startswith("A: ")
    assert "equivocate" in results["byzantine"]
    history = read_history(run_dir / "history.jsonl")
    assert any(str(op.value).startswith(("A: start kill#", "B: start kill#"))
               for op in history.nemesis)
    clusters = results["clusters"]
    specs = (ShardSpec(name="A", cluster_id=clusters["A"], opening=4_000),
             ShardSpec(name="B", cluster_id=clusters["B"], opening=4_000))
    assert check_cross_shard(history, specs).valid is True
    broken = check_cross_shard(_lose_last_credit(history, "B"), specs)
    assert broken.valid is False
    assert broken.details["lost_credits"] == 1

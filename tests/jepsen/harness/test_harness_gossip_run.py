"""`phalanx jepsen run --workload gossip`: bad options are refused before anything starts (fast);
a short real run (Raft 5, kills and one-node partitions) is valid, and the same cell with the
deliberate bug (anti-entropy off on every node) is caught: INVALID, with nodes lacking rumors
(long: `make sweeps`, ~3 minutes for both).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.jepsen.gossip_checker import check_gossip
from phalanx.jepsen.harness import gossip_run
from phalanx.jepsen.harness.cli import (
    EXIT_INVALID,
    EXIT_USAGE,
    EXIT_VALID,
    GOSSIP_BUGS,
    add_run_command,
)
from phalanx.jepsen.history import read_history


def _run(tmp_path: Path, argv: list[str]) -> tuple[int, str, Path]:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    store = tmp_path / "store"
    args = parser.parse_args(["run", "--store", str(store), *argv])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=160))
    return code, out.read_text(), store / "latest"


def test_the_parser_knows_every_gossip_bug() -> None:
    assert GOSSIP_BUGS == gossip_run.BUGS


@pytest.mark.parametrize(("argv", "error"), [
    (["--workload", "gossip", "--rate", "100", "--time", "60"], "lower --rate or --time"),
    (["--workload", "gossip", "--protocol", "pbft", "--nodes", "5"], "3f+1"),
    (["--workload", "gossip", "--protocol", "pbft,raft"], "several protocols"),
    (["--workload", "register", "--gossip-bug", "no-anti-entropy"], "needs --workload gossip"),
])
def test_bad_gossip_options_are_refused_before_anything_starts(
        tmp_path: Path, argv: list[str], error: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, latest = _run(tmp_path, argv)
    assert code == EXIT_USAGE
    assert error in capsys.readouterr().err
    assert not latest.exists()


CELL = ["--workload", "gossip", "--protocol", "raft", "--nodes", "5", "--nemesis",
        "kill,partition-one", "--time", "20", "--rate", "10", "--concurrency", "3",
        "--seed", "3"]


@pytest.mark.long
def test_a_real_gossip_run_under_kills_and_partitions_is_valid(tmp_path: Path) -> None:
    code, out, latest = _run(tmp_path, CELL)
    assert code == EXIT_VALID, out
    results = json.loads((latest / "results.json").read_text())
    gossip = results["checkers"]["gossip"]
    assert gossip["required"] > 0
    assert gossip["missing"] == {}
    assert results["nemesis_events"] > 0
    history = read_history(latest / "history.jsonl")
    assert any(op.f == "kill" for op in history.nemesis)
    assert check_gossip(history, rumor_ttl_ms=results["rumor_ttl_ms"]).valid is True


@pytest.mark.long
def test_the_no_anti_entropy_control_is_caught_on_a_real_cluster(tmp_path: Path) -> None:
    code, out, latest = _run(tmp_path, [*CELL, "--gossip-bug", "no-anti-entropy"])
    assert code == EXIT_INVALID, out
    gossip = json.loads((latest / "results.json").read_text())["checkers"]["gossip"]
    assert gossip["valid"] is False
    assert gossip["missing"], gossip

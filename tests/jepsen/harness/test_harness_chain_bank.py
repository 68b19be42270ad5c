"""A short real run of the chain app's bank workload (`phalanx jepsen run --app chain
--workload bank`): 3 Raft nodes under kills and pauses (PBFT with a Byzantine replica and a
crash is `phalanx demo --app chain`'s, tests/cli/test_chain_demo.py). Signed transfers
between the genesis accounts; every read rebuilds the balances from verified blocks. The
bank checker (totals conserved, no negative balance) and the chain checker (every block
links and re-executes to its state root) must say valid. About 15-20 s of wall time (most
of it cluster start, recovery and the report)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from phalanx.jepsen.harness.cli import EXIT_USAGE, EXIT_VALID, add_run_command
from phalanx.jepsen.history import read_history


def _run(tmp_path: Path, argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    args = parser.parse_args(["run", "--app", "chain", "--workload", "bank",
                              "--store", str(tmp_path / "store"), *argv])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=120))
    return code, out.read_text()


def test_chain_bank_on_raft_under_kills_and_pauses(tmp_path: Path) -> None:
    code, output = _run(tmp_path, ["--protocol", "raft", "--nodes", "3", "--time", "3",
                                   "--rate", "40", "--concurrency", "4", "--seed", "2",
                                   "--nemesis", "kill,pause", "--nemesis-scale", "1"])
    assert code == EXIT_VALID, output
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert run_dir.parent.name == "raft-chain-bank-kill+pause-n3"
    results = json.loads((run_dir / "results.json").read_text())
    checkers = results["checkers"]
    assert checkers["bank"]["valid"] is True
    assert checkers["chain"]["valid"] is True
    assert checkers["chain"]["blocks_verified"] > 0
    assert results["final_reads"]["ok"] == 1
    nemesis = [str(op.value) for op in read_history(run_dir / "history.jsonl").nemesis]
    assert any(v.startswith("start kill#") for v in nemesis), nemesis


def test_the_chain_app_has_no_register_workload(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    args = parser.parse_args(["run", "--app", "chain", "--workload", "register",
                              "--store", str(tmp_path)])
    assert args.handler(args) == EXIT_USAGE

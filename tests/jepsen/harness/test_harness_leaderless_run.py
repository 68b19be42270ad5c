"""Short real leaderless runs (n=4, f=1) through `phalanx jepsen run`'s handler: the bank
workload (snapshot reads and transfers as transactions with requirements) under kills and
one-node partitions, honest, and with an equivocating endorser (`node run --byzantine
equivocate`). Both are within f, so both should be valid, with every honest node's state
identical at the end (the convergence checker). About 25 s each on 2 cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.jepsen.harness.cli import EXIT_VALID, add_run_command
from phalanx.jepsen.history import read_history


def _run(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    store = tmp_path / "store"
    args = parser.parse_args([
        "run", "--protocol", "leaderless", "--nodes", "4", "--workload", "bank", "--time", "12",
        "--rate", "10", "--concurrency", "3", "--nemesis", "kill,partition-one", "--seed", "2",
        "--store", str(store), *extra])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=120))
    return code, out.read_text(), (store / "latest").resolve()


def _check_valid_run(code: int, output: str, run_dir: Path, honest: list[str]) -> None:
    assert code == EXIT_VALID, output
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["checkers"]) == {"bank", "stats", "convergence", "recovery"}
    assert all(c["valid"] is True for c in results["checkers"].values())
    assert results["final_reads"]["ok"] == results["final_reads"]["total"] == 1
    digests = results["checkers"]["convergence"]["digests"]
    assert sorted(digests) == honest
    assert len(set(digests.values())) == 1
    history = read_history(run_dir / "history.jsonl")
    assert any(str(op.value).startswith("start kill#") for op in history.nemesis)
    done = {(op.f, op.type) for op in history.ops if op.process != "nemesis"}
    assert {("transfer", "ok"), ("read", "ok")} <= done


def test_leaderless_bank_under_kills_and_partitions_is_valid_and_converges(
    tmp_path: Path,
) -> None:
    code, output, run_dir = _run(tmp_path)
    assert run_dir.parent.name == "leaderless-bank-kill+partition-one-n4"
    _check_valid_run(code, output, run_dir, ["n1", "n2", "n3", "n4"])


@pytest.mark.long  # `make sweeps` runs it (an xfail has no place in make test's budget)
@pytest.mark.xfail(strict=False, reason=(
    "liveness, not safety: since the version-gate fixes it passed at least 18 of 21 runs; the "
    "failures checked were the final read never committing after heal (bank and convergence "
    "valid): transactions pending when the faults stopped are never decided with the liar "
    "(no abort certificate, no unanimous drop), docs/LEADERLESS.md 'Running it', 'expired "
    "transactions that never end with a liar'"))
def test_leaderless_bank_with_a_liar_under_kills_and_partitions_is_valid(
    tmp_path: Path,
) -> None:
    code, output, run_dir = _run(tmp_path, "--byzantine", "n4=equivocate")
    assert run_dir.parent.name == "leaderless-bank-kill+partition-one-byz-equivocate-n4"
    assert "BYZANTINE mode equivocate" in (run_dir / "nodes" / "n4" / "n4.log").read_text()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["byzantine"]["modes"] == {"n4": "equivocate"}
    assert results["checkers"]["bank"]["valid"] is True  # safety of the history itself
    _check_valid_run(code, output, run_dir, ["n1", "n2", "n3"])

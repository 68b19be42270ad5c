"""Short real leaderless runs (n=4, f=1) through `phalanx jepsen run`'s handler: the bank
workload (snapshot reads and transfers as transactions with requirements) under kills and
one-node partitions with an equivocating endorser (`node run --byzantine equivocate`).
Within f, so it must be valid, and the honest nodes' states must end identical. About 25 s
of wall time on 2 cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from phalanx.jepsen.harness.cli import EXIT_VALID, add_run_command
from phalanx.jepsen.history import read_history


def test_leaderless_bank_with_a_liar_under_kills_and_partitions_is_valid(
    tmp_path: Path,
) -> None:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    store = tmp_path / "store"
    args = parser.parse_args([
        "run", "--protocol", "leaderless", "--nodes", "4", "--workload", "bank", "--time", "12",
        "--rate", "10", "--concurrency", "3", "--nemesis", "kill,partition-one", "--seed", "2",
        "--byzantine", "n4=equivocate", "--store", str(store)])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=120))
    output = out.read_text()
    assert code == EXIT_VALID, output
    run_dir = (store / "latest").resolve()
    assert run_dir.parent.name == "leaderless-bank-kill+partition-one-byz-equivocate-n4"
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["checkers"]) == {"bank", "stats", "convergence", "recovery"}
    digests = results["checkers"]["convergence"]["digests"]
    assert sorted(digests) == ["n1", "n2", "n3"]  # the honest nodes, all equal
    assert len(set(digests.values())) == 1
    assert all(c["valid"] is True for c in results["checkers"].values())
    assert results["final_reads"]["ok"] == results["final_reads"]["total"] == 1
    assert results["byzantine"]["modes"] == {"n4": "equivocate"}
    assert "BYZANTINE mode equivocate" in (run_dir / "nodes" / "n4" / "n4.log").read_text()
    history = read_history(run_dir / "history.jsonl")
    assert any(str(op.value).startswith("start kill#") for op in history.nemesis)
    done = {(op.f, op.type) for op in history.ops if op.process != "nemesis"}
    assert {("transfer", "ok"), ("read", "ok")} <= done

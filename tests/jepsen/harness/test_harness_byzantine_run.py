"""Short real PBFT runs (n=4, f=1) with one Byzantine replica, through `phalanx jepsen run`'s
handler: n1 (the view-0 primary) equivocating under kills and one-node partitions, and one
twinned node (two processes, one identity and key; the proxies give each twin its own half
of the honest replicas). Both are within f, so both must be valid.

Asserts the verdict, that the Byzantine replica really ran in its mode (its process log),
that the twins really split the cluster (twin B linked only to side-B replicas, twin A only
to side A), and that test.json, results.json, the history and the report name the Byzantine
replicas. About 20 s + 17 s of wall time.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.jepsen.harness.cli import EXIT_VALID, add_run_command
from phalanx.jepsen.history import read_history


def _run(tmp_path: Path, argv: list[str]) -> tuple[int, str, Path]:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    store = tmp_path / "store"
    args = parser.parse_args(["run", "--protocol", "pbft", "--nodes", "4", "--rate", "30",
                              "--concurrency", "4", "--store", str(store), *argv])
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = args.handler(args, console=Console(file=f, width=120))
    return code, out.read_text(), (store / "latest").resolve()


def _links(log: str) -> set[str]:
    return set(re.findall(r"link to (n\d+) at \S+ established", log))


def test_an_equivocating_primary_under_kills_and_partitions_stays_valid(tmp_path: Path) -> None:
    code, output, run_dir = _run(tmp_path, [
        "--time", "12", "--nemesis", "kill,partition-one", "--seed", "3",
        "--byzantine", "n1=equivocate"])
    assert code == EXIT_VALID, output
    assert run_dir.parent.name == "pbft-register-kill+partition-one-byz-equivocate-n4"
    test = json.loads((run_dir / "test.json").read_text())
    assert test["config"]["byzantine"] == "n1=equivocate"
    assert test["config"]["byzantine_plan"]["modes"] == {"n1": "equivocate"}
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True
    assert results["byzantine"]["nodes"] == ["n1"]
    assert results["final_reads"]["ok"] == results["final_reads"]["total"] > 0
    assert set(results["node_status"]) >= {"n2", "n3", "n4"}
    assert "BYZANTINE mode equivocate" in (run_dir / "nodes" / "n1" / "n1.log").read_text()
    assert "BYZANTINE" not in (run_dir / "nodes" / "n2" / "n2.log").read_text()
    nemesis = read_history(run_dir / "history.jsonl").nemesis
    assert (nemesis[0].f, nemesis[0].value) == ("byzantine", "n1 runs equivocate")
    assert any(str(op.value).startswith("start kill#") for op in nemesis)
    assert "n1 runs equivocate" in (run_dir / "index.html").read_text()


@pytest.mark.long  # `make sweeps`; the simulator's twins control stays in make test
def test_one_twinned_replica_splits_the_honest_ones_and_stays_valid(tmp_path: Path) -> None:
    code, output, run_dir = _run(tmp_path, [
        "--time", "10", "--nemesis", "partition-one", "--seed", "3", "--byzantine", "twins"])
    assert code == EXIT_VALID, output
    results = json.loads((run_dir / "results.json").read_text())
    plan = results["byzantine"]
    (twin,) = plan["twins"]
    side_a = set(plan["side_a"])
    side_b = {f"n{i}" for i in range(1, 5)} - side_a - {twin}
    assert side_a
    assert side_b
    twin_a_log = (run_dir / "nodes" / twin / f"{twin}.log").read_text()
    twin_b_log = (run_dir / "nodes" / f"{twin}-b" / f"{twin}.log").read_text()
    # Each twin dialled only its own side (the other side's links are refused at the proxy),
    # so no honest replica ever had two connections from the one identity fighting.
    assert _links(twin_a_log) == side_a
    assert _links(twin_b_log) == side_b
    assert f"{twin}-b" in results["node_status"]
    assert "twins" in json.loads((run_dir / "test.json").read_text())["config"]["byzantine"]
    assert "replaces the older one" not in "".join(
        (run_dir / "nodes" / n / f"{n}.log").read_text() for n in sorted(side_a | side_b))

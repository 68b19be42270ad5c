"""Short real Jepsen runs through `phalanx jepsen run`'s handler on 3-node Raft clusters of
real processes: register under SIGKILL + partitions for 30 s, and bank under machine crashes
(lose-unfsynced), kill-leader, kill-all and a torn WAL tail for 20 s.

Asserts the verdict (exit 0: valid), that the nemesis really acted (kills, restarts and
blocked links), and that the store is complete: test.json, history.jsonl, results.json
(every checker), each node's log and data, latency.svg, rate.svg and index.html with the
nemesis intervals. About 40 s + 30 s of wall time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.cli.errors import EXIT_USAGE
from phalanx.jepsen.harness.cli import EXIT_VALID, add_run_command
from phalanx.jepsen.history import NEMESIS, read_history


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


@pytest.mark.long  # ~35 s: `make sweeps`; make test keeps the Raft bank run under machine crashes
def test_raft_register_under_kill_and_partition_is_valid_and_stored(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = _parse(["--nodes", "3", "--time", "30", "--workload", "register",
                   "--nemesis", "kill,partition-one,partition-halves", "--rate", "40",
                   "--concurrency", "4", "--seed", "3", "--store", str(store)])
    console = Console(file=(tmp_path / "out.txt").open("w"), width=120)
    code = args.handler(args, console=console)
    console.file.close()
    output = (tmp_path / "out.txt").read_text()
    assert code == EXIT_VALID, output

    run_dir = (store / "latest").resolve()
    assert run_dir.parent.name == "raft-register-kill+partition-one+partition-halves-n3"
    test = json.loads((run_dir / "test.json").read_text())
    assert test["seed"] == 3
    assert test["config"]["nodes"] == 3
    assert test["nemesis_schedule"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True
    assert results["workload"] == "register"
    assert set(results["checkers"]) == {"linearizable", "stats", "recovery"}
    assert all(c["valid"] is True for c in results["checkers"].values())
    assert results["recovered"] is True
    assert results["final_reads"]["ok"] == results["final_reads"]["total"] > 0
    assert results["network"]["refused"] + results["network"]["closed_by_partition"] > 0
    history = read_history(run_dir / "history.jsonl")
    nemesis_ops = [op for op in history.ops if op.process == NEMESIS]
    described = " ".join(str(op.value) for op in nemesis_ops)
    assert "killed n" in described
    assert "restarted n" in described
    assert "partition" in described
    assert nemesis_ops[-1].f == "heal"
    assert sum(1 for op in history.ops if op.type == "ok") > 100
    for node in ("n1", "n2", "n3"):
        assert (run_dir / "nodes" / node / f"{node}.log").stat().st_size > 0
        assert any((run_dir / "nodes" / node / "data").glob("wal-*.seg"))
    for plot in ("latency.svg", "rate.svg"):
        assert (run_dir / plot).read_text().startswith("<svg ")
    page = (run_dir / "index.html").read_text()
    assert "valid" in page
    assert 'class="nem"' in page
    assert "start kill#" in page
    assert f"report: {run_dir / 'index.html'}" in " ".join(output.split())


def test_pbft_run_under_kill_and_partition_is_valid(tmp_path: Path) -> None:
    """A 4-replica PBFT cluster (f=1) of real processes: kills and one-node partitions."""
    store = tmp_path / "store"
    args = _parse(["--protocol", "pbft", "--nodes", "4", "--time", "15", "--workload", "register",
                   "--nemesis", "kill,partition-one", "--rate", "30", "--concurrency", "4",
                   "--seed", "3", "--store", str(store)])
    console = Console(file=(tmp_path / "out.txt").open("w"), width=120)
    code = args.handler(args, console=console)
    console.file.close()
    output = (tmp_path / "out.txt").read_text()
    assert code == EXIT_VALID, output
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["checkers"]["recovery"]["valid"] is True
    nemesis_ops = [str(op.value) for op in read_history(run_dir / "history.jsonl").nemesis]
    assert any(v.startswith("start kill#") for v in nemesis_ops)
    assert (run_dir / "index.html").exists()


def test_bad_pbft_sizes_and_unknown_nemeses_are_refused_with_exit_2(tmp_path: Path) -> None:
    console = Console(file=(tmp_path / "out.txt").open("w"))
    for argv in (["--protocol", "pbft", "--nodes", "5"], ["--nemesis", "kill,bogus"]):
        args = _parse([*argv, "--store", str(tmp_path / "s")])
        assert args.handler(args, console=console) == EXIT_USAGE
    assert not (tmp_path / "s").exists()


def test_bank_under_machine_crashes_leader_kills_kill_all_and_torn_wals_is_valid(
    tmp_path: Path,
) -> None:
    """3 nodes, 20 s: lose-unfsynced kills (volatile writes), kill-leader, kill-all and a
    torn WAL tail; the seed's schedule has each of them (see `real_schedule`)."""
    store = tmp_path / "store"
    args = _parse(["--nodes", "3", "--time", "20", "--workload", "bank", "--nemesis-scale", "2",
                   "--nemesis", "kill,lose-unfsynced,kill-leader,kill-all,truncate-wal",
                   "--rate", "40", "--concurrency", "4", "--seed", "13", "--store", str(store)])
    console = Console(file=(tmp_path / "out.txt").open("w"), width=120)
    code = args.handler(args, console=console)
    console.file.close()
    output = (tmp_path / "out.txt").read_text()
    assert code == EXIT_VALID, output

    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["checkers"]) == {"bank", "stats", "recovery"}
    assert results["checkers"]["bank"]["valid"] is True
    assert results["counts"]["transfer"]["ok"] > 20
    nemesis_ops = [str(op.value) for op in read_history(run_dir / "history.jsonl").nemesis]
    kill_all = [v for v in nemesis_ops if v.startswith("start kill-all#")]
    assert kill_all
    assert all("nodes=n1,n2,n3 " in v and "(killed n" in v for v in kill_all)  # live ones
    assert any(v.startswith("start kill-leader#") and "killed n" in v for v in nemesis_ops)
    assert any(v.startswith("start kill#") and "value=1" in v for v in nemesis_ops)
    torn = [v for v in nemesis_ops if "tore wal-" in v]
    assert torn
    node = torn[0].split("(")[1].split(":")[0]
    assert "cut a torn WAL tail" in (run_dir / "nodes" / node / f"{node}.log").read_text()

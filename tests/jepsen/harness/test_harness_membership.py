"""``phalanx jepsen run --nemesis membership`` (issue 21, item 3): the schedule's membership
episodes over the spare nodes, the options (opt-in, refused by a protocol with static
membership, never part of ``all``), and one short real run on Raft processes in which nodes
are added, promoted and removed under kills and partitions (long: ~30 s)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.cli.errors import EXIT_USAGE
from phalanx.jepsen import nemesis
from phalanx.jepsen.harness.cli import EXIT_VALID, add_run_command
from phalanx.jepsen.harness.runner import RunOptions
from phalanx.jepsen.harness.schedule import REAL_FAULT_KINDS, real_schedule
from phalanx.jepsen.history import NEMESIS, read_history


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_options_name_the_spares_and_the_schedule_uses_them() -> None:
    options = RunOptions(nodes=3, faults=("kill", "membership"), time_s=60, seed=4)
    assert options.node_names == ("n1", "n2", "n3")
    assert options.spare_names == ("n4", "n5")
    assert RunOptions(nodes=3, faults=("kill",)).spare_names == ()
    names = options.node_names
    events = real_schedule(options, names, options.spare_names)
    changes = [e for e in events if e.fault == nemesis.MEMBERSHIP]
    assert {e.nodes for e in changes} == {("n4",), ("n5",)}
    assert real_schedule(options, names, options.spare_names) == events  # seeded
    assert all(set(e.nodes) <= set(names) for e in events if e.fault != nemesis.MEMBERSHIP)
    split = RunOptions(nodes=3, faults=("partition-halves", "membership"), time_s=60, seed=4)
    halves = [e for e in real_schedule(split, names, split.spare_names)
              if e.fault == "partition-halves"]
    assert halves
    for e in halves:  # every spare is on a side (else it would be cut from everyone)
        assert sorted(n for g in e.groups for n in g) == ["n1", "n2", "n3", "n4", "n5"]
    plain = RunOptions(nodes=3, faults=("kill",), time_s=60, seed=4)
    assert not [e for e in real_schedule(plain, names) if e.fault == nemesis.MEMBERSHIP]
    assert nemesis.MEMBERSHIP not in REAL_FAULT_KINDS  # `--nemesis all` leaves it out


def test_a_protocol_with_static_membership_refuses_it(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not support it"):
        RunOptions(protocol="pbft", nodes=4, faults=("membership",))
    args = _parse(["--protocol", "pbft", "--nodes", "4", "--nemesis", "membership",
                   "--store", str(tmp_path)])
    assert args.handler(args, console=Console(file=(tmp_path / "o.txt").open("w"))) == (
        EXIT_USAGE)
    assert "protocol pbft does not support it" in capsys.readouterr().err


@pytest.mark.long  # ~30 s of real processes: `make sweeps`
def test_raft_register_with_membership_changes_is_valid(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = _parse(["--nodes", "3", "--time", "25", "--workload", "register",
                   "--nemesis", "membership,kill,partition-halves", "--rate", "30",
                   "--concurrency", "3", "--seed", "5", "--store", str(store)])
    console = Console(file=(tmp_path / "out.txt").open("w"), width=120)
    code = args.handler(args, console=console)
    console.file.close()
    output = (tmp_path / "out.txt").read_text()
    assert code == EXIT_VALID, output
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True
    assert results["recovered"] is True
    history = read_history(run_dir / "history.jsonl")
    changes = [str(op.value) for op in history.ops
               if op.process == NEMESIS and op.f == "membership"]
    assert any("add-learner n4 done" in c for c in changes), changes
    assert any(" done" in c and c.startswith("remove") for c in changes), changes

"""`phalanx jepsen run --option NAME=VALUE`: the protocol's core options reach the cluster's
`cluster init` (checked by the protocol's node, as `cluster init --option`). No processes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from rich.console import Console

from phalanx.cli.errors import EXIT_USAGE
from phalanx.jepsen.harness.cli import add_run_command
from phalanx.jepsen.harness.cluster import prepare_cluster
from phalanx.jepsen.harness.runner import RunOptions
from phalanx.ops.node_config import load_node_config


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_bad_options_are_refused_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console = Console(file=(tmp_path / "out.txt").open("w"))
    cases = {
        "expected NAME=VALUE": ["--protocol", "leaderless", "--option", "stuck_resolution"],
        "not an option of the leaderless core": ["--protocol", "leaderless",
                                                 "--option", "bogus=1"],
        "must be one of veto, pbft": ["--protocol", "leaderless",
                                      "--option", "stuck_resolution=bogus"],
        "protocol raft takes no --option": ["--protocol", "raft", "--nodes", "3",
                                            "--option", "stuck_resolution=pbft"],
    }
    for message, argv in cases.items():
        args = _parse([*argv, "--nodes", "4", "--store", str(tmp_path / "s")]
                      if "--nodes" not in argv else [*argv, "--store", str(tmp_path / "s")])
        assert args.handler(args, console=console) == EXIT_USAGE
        assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_option_goes_into_every_node_config(tmp_path: Path) -> None:
    options = RunOptions(protocol="leaderless", nodes=4, workload="bank",
                         protocol_options=(("stuck_resolution", "pbft"),))
    prepared = prepare_cluster(tmp_path / "c", nodes=4, protocol="leaderless",
                               protocol_options=dict(options.protocol_options))
    for node in prepared.config.nodes:
        cfg = load_node_config(prepared.config.node_config_path(node.id))
        assert dict(cfg.protocol_options) == {"stuck_resolution": "pbft"}

"""`phalanx cluster init --option NAME=VALUE`: protocol options in every node config's
`[protocol]` table, checked by the protocol's node first (leaderless: `stuck_resolution`,
`close_ticks`; docs/LEADERLESS.md "Ordered resolution"); a bad one is a one-line error and
writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main
from phalanx.ops.node_config import load_node_config
from phalanx.protocols.leaderless_node import leaderless_config


def test_the_option_reaches_the_core_config(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "c"
    assert main(["cluster", "init", str(target), "--protocol", "leaderless", "--nodes", "4",
                 "--option", "stuck_resolution=pbft", "--option", "close_ticks=40"]) == 0
    capsys.readouterr()
    cfg = load_node_config(target / "nodes" / "n2.toml")
    assert cfg.protocol_options == {"close_ticks": "40", "stuck_resolution": "pbft"}
    core = leaderless_config(cfg)
    assert (core.stuck_resolution, core.close_ticks) == ("pbft", 40)


@pytest.mark.parametrize(("protocol", "option", "message"), [
    ("leaderless", "stuck_resolution=quorum", "stuck_resolution must be one of veto, pbft"),
    ("leaderless", "close_ticks=soon", "close_ticks: expected int"),
    ("leaderless", "colour=blue", "colour: not an option of the leaderless core"),
    ("leaderless", "stuck_resolution", "expected NAME=VALUE"),
    ("raft", "stuck_resolution=pbft", "protocol raft takes no --option"),
])
def test_a_bad_option_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          protocol: str, option: str, message: str) -> None:
    target = tmp_path / "c"
    assert main(["cluster", "init", str(target), "--protocol", protocol,
                 "--option", option]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err
    assert not target.exists()

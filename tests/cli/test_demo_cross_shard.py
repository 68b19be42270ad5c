"""`phalanx demo --scenario cross-shard` end to end (~25 s, so `long`): a PBFT shard with an
equivocating replica and a Raft shard of real processes, linked; transfers both ways, a
SIGKILL and a restart; money conserved and every credit applied exactly once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from phalanx.demo.cross_shard import run


@pytest.mark.long
def test_cross_shard_demo_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(rounds=2, byzantine="equivocate", seed=7)
    assert run(args, tmp_path / "demo", delete=False) == 0
    out = capsys.readouterr().out
    assert out.count("PASS  ") == 5
    assert "= 8000" in out


def test_the_scenario_is_named_cross_shard(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's name (`--scenario cross-shard`), taken from the service's spec."""
    from phalanx.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["demo", "--help"])
    assert done.value.code == 0
    assert "cross-shard" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["demo", "--scenario", "clustersend"])
    assert refused.value.code == 2

"""`phalanx demo --scenario clustersend` end to end (~25 s, so `long`): a PBFT shard with an
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

"""`phalanx demo --scenario gossip` end to end on real processes: 5 nodes with the gossip
service, rumors to all, 2 SIGKILLed, rumors to every live node, suspect/dead, a restart
rejoining and catching up by anti-entropy. ~16 s on an idle 2-core box, so `make sweeps`
runs it (make test's budget keeps the in-process service tests,
tests/runtime/test_gossip_service.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from phalanx.demo.gossip import run


@pytest.mark.long  # ~16 s of real processes: `make sweeps`
def test_gossip_demo_passes_every_step(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(protocol=None, rounds=2)
    code = run(args, tmp_path / "demo", delete=False)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("PASS  ") == 7, out
    assert "RESULT: PASS (7/7 steps passed)" in out

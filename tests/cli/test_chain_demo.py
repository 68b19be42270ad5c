"""`phalanx demo --app chain` end to end (real processes, ~20 s): PBFT with n1 Byzantine
(equivocating) and an honest replica SIGKILLed and restarted during signed transfers; the
restarted replica catches up; the exported chain validates, the supply is conserved and a
light-client proof from the restarted replica verifies, its header trusted by a block
certificate. Exit 0 means PASS."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main


def test_chain_demo_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["demo", "--app", "chain", "--warmup", "2", "--seed", "1",
                 "--keep", str(tmp_path / "demo")])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "verdict                           PASS" in out
    assert "exported chain                    valid, " in out
    assert "supply conserved                  5,000,000 of 5,000,000" in out
    assert "light client                      verified on " in out
    assert "(certificate (" in out  # trusted by a block certificate, not f+1 reports
    assert "block certificate                 block " in out
    assert "n1 runs --byzantine equivocate" in out
    export = tmp_path / "demo" / "cluster" / "chain-export.bin"
    assert main(["chain", "validate", str(export)]) == 0

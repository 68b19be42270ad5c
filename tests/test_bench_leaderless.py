"""Smoke test of `bench/leaderless.py`: its `--quick` mode starts a real cluster, drives
every level and prints the table and the targets (no timing is asserted: figures belong
to the benchmark, docs/BENCHMARKS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long  # `make sweeps` runs it: a real cluster for a smoke check of a bench script
def test_quick_run_prints_its_table_for_one_protocol(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "leaderless.py"), "--quick", "--protocols", "raft",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=90, check=False, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("protocol") and "commits/s" in line for line in lines), out.stdout
    rows = [line.split() for line in lines if line.startswith("raft ")]
    assert [(r[2], r[3]) for r in rows] == [("1", "0%"), ("4", "0%"), ("4", "50%")], out.stdout
    assert all(int(r[4].replace(",", "")) > 0 and r[6] == "0" for r in rows), out.stdout
    assert "SKIPPED" not in out.stdout

"""Smoke test of `bench/scale.py` (issue 19): its `--quick` run at n = 4 simulates every
experiment over the 5-region WAN, every cell passes its checker, and the table, the plot
and the parse-back (`--plot-from`) agree. Figures are the benchmark's (docs/SCALE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long  # `make sweeps` runs it: ~12 simulated clusters for a smoke check
def test_quick_run_prints_every_experiment_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "scale.png"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--quick", "--sizes", "4",
         "--plot", str(plot)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| experiment")]
    experiments = {row.split("|")[1].strip() for row in rows}
    assert experiments == {"base", "conflicts", "gossip", "crashed", "byzantine"}, out.stdout
    assert all(row.rstrip().endswith("| ok |") for row in rows), out.stdout
    assert plot.stat().st_size > 0
    report = tmp_path / "report.txt"
    report.write_text(out.stdout)
    again = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--plot-from", str(report),
         "--plot", str(tmp_path / "again.png")],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    assert [line for line in again.stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| experiment")] == rows


def test_one_conflicts_cell_with_its_bytes_by_kind() -> None:
    """`--conflicts 50` runs the 50% cell alone; `--by-kind` names where its bytes went."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--quick", "--sizes", "4",
         "--only", "conflicts", "--conflicts", "50", "--protocols", "leaderless",
         "--by-kind", "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| conflicts")]
    assert [row.split("|")[2].strip() for row in rows] == ["leaderless, conflicts 50%"]
    (kinds,) = [line for line in out.stdout.splitlines() if "bytes by kind:" in line]
    assert "EndorsementBatch" in kinds, kinds

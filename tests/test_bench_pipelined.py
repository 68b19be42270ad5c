"""Smoke test of `bench/pipelined.py` (issue 23): its `--quick` run drives a real 3-node Raft
cluster with the pre-encoded generator and the client library (and etcd when it is
installed), every arm acknowledges writes, and the report prints its CPU-per-write columns
and the verdict line; `bench/client_path_cpu.py` prints its per-write split. Figures are the
benchmark's (docs/BENCHMARKS.md, issue 23 Round 6)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long  # `make sweeps` runs it: a real cluster (and etcd) for a smoke check
def test_quick_run_reports_every_arm() -> None:
    arms = ["phalanx-raw", "phalanx-client"]
    if shutil.which("etcd") is not None:
        arms += ["etcd-pipelined", "etcd-conns"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pipelined.py"), "--quick", "--arms",
         ",".join(arms)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()
            if line.split() and line.split()[0] in arms and line.split()[1] == "1x32"}
    assert set(rows) == set(arms), out.stdout
    for arm, row in rows.items():
        assert float(row[3].replace(",", "")) > 0, (arm, out.stdout)  # writes/s
        assert float(row[6]) > 0, (arm, out.stdout)  # servers' CPU ms/write
        assert float(row[7]) > 0, (arm, out.stdout)  # the generator's
    assert re.search(r"target >= 30,000 writes/s at 1x32: [\d,]+.* -> (PASS|MISS)", out.stdout)


@pytest.mark.long
def test_client_path_cpu_prints_its_split() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_path_cpu.py"), "--passes", "5",
         "--runs", "1"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )
    assert re.search(r"read\+admit [\d.]+ us, answer\+deliver\+flush [\d.]+ us", out.stdout)

"""The scale bench's ``load`` experiment (issue 19 item 4, docs/SCALE.md "Under load"):
closed-loop clients per region, figures over a window of the run, the busiest node's CPU
share and queueing under the CPU model, and the table's parse-back (`--plot-from`)."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

from bench_module import load_bench

from phalanx.jepsen.sim.cpu import CpuCosts


def _scale() -> ModuleType:
    return load_bench("scale.py", "scale_bench_load_under_test")


def test_load_cells_measure_a_window_and_the_busiest_node(tmp_path: Path) -> None:
    scale = _scale()
    scale.CPU[0] = CpuCosts()
    try:
        rows = [scale.measure_load(scale.Cell("load", p, 4), 10, 1, (1.0, 0.4, 2.0), {})
                for p in ("pbft", "leaderless")]
    finally:
        scale.CPU[0] = None
    pbft = rows[0]
    for row in rows:
        assert row.ok, row.note
        # 10 closed-loop clients, each ~2 operations a second at these latencies
        assert 5 < row.ops_per_s < 60, row
        assert 100 < row.p50_ms <= row.p99_ms < 2_000, row
        assert 0 < row.busiest_pct < 100, row
        assert not math.isnan(row.wait_ms)
    assert pbft.busiest == "n1"  # the primary: every request goes through it
    report = tmp_path / "report.txt"
    report.write_text("\n".join(scale.load.load_line(r) for r in rows) + "\n")
    back = scale.load.load_rows_from([str(report)])
    assert [(r.protocol, r.clients, r.busiest, r.ok) for r in back] == [
        (r.protocol, r.clients, r.busiest, r.ok) for r in rows]
    assert [round(r.p50_ms) for r in back] == [round(r.p50_ms) for r in rows]
    assert scale.load.ratios(back)[0].startswith("n = 4, 10 clients: pbft p50 / leaderless")

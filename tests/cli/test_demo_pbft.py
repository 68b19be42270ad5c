"""`phalanx demo --protocol pbft` end to end, shortened (~10 s): 4 replica processes, n1
equivocating as the primary of view 0 (`node run --byzantine equivocate`), a primary
SIGKILL, a view change, the history checked for linearizability and no acknowledged write
lost."""

from __future__ import annotations

import math
from pathlib import Path

import trio
from rich.console import Console

from phalanx.demo.pbft import PbftDemoOptions, run_pbft_demo


def test_pbft_demo_survives_a_byzantine_primary_and_its_kill(tmp_path: Path) -> None:
    options = PbftDemoOptions(warmup=1.5, after_failover=1.0, workers=2, keys=2, seed=7,
                              directory=tmp_path)
    console = Console(file=open(tmp_path / "out.txt", "w"), width=100)  # noqa: SIM115
    try:
        result = trio.run(run_pbft_demo, options, console)
    finally:
        console.file.close()
    assert result.passed, result.explain  # linearizable, nothing acked lost, a write after
    # The equivocating n1 may already have been voted out (a view change) before the kill:
    # the demo then kills the primary of that later view.
    assert result.killed
    assert result.new_view > result.killed_view
    assert result.new_primary != result.killed
    assert not math.isnan(result.time_to_view)
    assert result.writes_acked > 0

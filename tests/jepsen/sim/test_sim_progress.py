"""`phalanx sim`'s progress (`phalanx.jepsen.sim.sim_progress`): plain lines (no carriage
returns) off a terminal, rich bars on one, failures named either way."""

from __future__ import annotations

import io

from phalanx.jepsen.sim.sim_progress import SweepProgress, wants_rich
from phalanx.jepsen.sim.sweep import SeedOutcome


def outcome(seed: int, ok: bool) -> SeedOutcome:
    return SeedOutcome(seed=seed, ok=ok, trace_hash="", report="", ops_ok=1, deliveries=1,
                       wall_s=0.0)


def test_a_log_gets_sweeps_plain_lines() -> None:
    log = io.StringIO()
    assert not wants_rich(log)
    with SweepProgress(log) as shown:
        assert shown.group("raft, 3 nodes", 4) == {"progress": log}


def test_a_terminal_gets_one_bar_per_group_and_each_failure_printed() -> None:
    screen = io.StringIO()
    with SweepProgress(screen, rich=True) as shown:
        for label in ("raft, 3 nodes", "raft, 5 nodes"):
            args = shown.group(label, 2)
            assert args["progress"] is None
            args["on_outcome"](outcome(1, True))
            args["on_outcome"](outcome(3, False))
    text = screen.getvalue()
    assert "raft, 5 nodes: seed 3 FAILED" in text
    assert "2/2" in text

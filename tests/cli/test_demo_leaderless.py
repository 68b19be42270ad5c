"""`phalanx demo --protocol leaderless` end to end, shortened: 4 endorser processes, n4
equivocating (`node run --byzantine equivocate`), n2 SIGKILLed and restarted between rounds
of conflicting puts, commuting adds throughout; every node's state must end identical."""

from __future__ import annotations

from pathlib import Path

import trio
from rich.console import Console

from phalanx.demo.leaderless import WRITERS, LeaderlessDemoOptions, run_leaderless_demo


def test_leaderless_demo_converges_despite_a_liar_and_a_restart(tmp_path: Path) -> None:
    options = LeaderlessDemoOptions(directory=tmp_path, rounds=2, down=1.0, seed=3)
    console = Console(file=open(tmp_path / "out.txt", "w"), width=120)  # noqa: SIM115
    try:
        result = trio.run(run_leaderless_demo, options, console)
    finally:
        console.file.close()
    assert result.passed, (result.problems, (tmp_path / "out.txt").read_text())
    assert result.restarted
    assert len(set(result.digests.values())) == 1
    assert len(result.digests) == 4
    # Conflicting puts with one requirement: at most one per round commits, the rest abort.
    for won, aborted, unknown in result.rounds:
        assert len(won) <= 1
        assert len(won) + aborted + unknown == WRITERS
    assert sum(a for _, a, _ in result.rounds) > 0
    assert result.adds_ok <= result.counter <= result.adds_ok + result.adds_unknown
    assert result.adds_ok > 0
    assert result.members >= len(result.members_ok) > 0

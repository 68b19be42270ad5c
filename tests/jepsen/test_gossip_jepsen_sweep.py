"""Seeded gossip runs in the simulator, recorded in the harness's history vocabulary and checked
by the same checker (`phalanx.jepsen.gossip_sweep`): correct machines pass under crashes,
restarts and 5% loss; the deliberate bugs (anti-entropy off; silent forwarders with it off)
are caught. A failing seed prints how to replay it. The wide sweep is `long` (`make sweeps`).
"""

from __future__ import annotations

import pytest

from phalanx.jepsen.gossip_checker import DELIVERIES, PUBLISH, check_gossip
from phalanx.jepsen.gossip_sweep import (
    BUGS,
    TICK_NS,
    GossipSweepConfig,
    check_gossip_run,
    run_gossip_sim,
)
from phalanx.jepsen.history import Op

FAST = GossipSweepConfig(n=8, fault_ticks=200, settle_ticks=200, down_ticks=(20, 80))


def _assert_valid(seed: int, cfg: GossipSweepConfig) -> None:
    result = check_gossip_run(seed, cfg)
    assert result.valid is True, (
        f"seed {seed}: {result.details['problems']}; replay: {cfg.replay(seed)}")


@pytest.mark.parametrize("seed", [0, 1])
def test_correct_gossip_passes_the_checker_under_crashes_restarts_and_loss(seed: int) -> None:
    _assert_valid(seed, FAST)


def test_a_run_is_deterministic_and_exercises_what_the_checker_rules_on() -> None:
    cfg = GossipSweepConfig(n=6, fault_ticks=150, settle_ticks=150, crash_p=0.05)
    history = run_gossip_sim(3, cfg)
    short = run_gossip_sim(3, GossipSweepConfig(n=6, fault_ticks=60, settle_ticks=0,
                                                crash_p=0.05))
    def head(ops: tuple[Op, ...]) -> tuple[Op, ...]:
        return tuple(op for op in ops if op.time < 59 * TICK_NS)
    assert head(history.ops) == head(short.ops) != ()  # same seed, same run
    kills = [op for op in history.nemesis if op.f == "kill"]
    restarts = [op for op in history.nemesis if op.f == "restart"]
    assert kills
    assert restarts
    assert any(op.f == PUBLISH for op in history.ops)
    finals = [p for p in history.pairs if p.invoke.f == DELIVERIES]
    assert len(finals) == cfg.n
    assert any(p.outcome == "fail" for p in finals)
    result = check_gossip(history, rumor_ttl_ms=cfg.gossip.rumor_ttl)
    assert result.valid is True, result.details["problems"]
    assert 0 < result.details["required"] < result.details["publishes"]["ok"]  # type: ignore[index]


@pytest.mark.parametrize("bug", BUGS)
def test_the_deliberate_bugs_are_caught(bug: str) -> None:
    cfg = GossipSweepConfig(n=8, fault_ticks=200, settle_ticks=200, down_ticks=(20, 80),
                            bug=bug)
    result = check_gossip_run(0, cfg)
    assert result.valid is False, f"bug {bug} not caught; replay: {cfg.replay(0)}"
    assert result.details["missing"]


def test_an_unknown_bug_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown gossip bug"):
        GossipSweepConfig(bug="typo")


@pytest.mark.long
@pytest.mark.parametrize("seed", range(2, 32))
def test_gossip_sweep_wide(seed: int) -> None:
    _assert_valid(seed, GossipSweepConfig(n=12 if seed % 2 else 8, loss=0.1 if seed % 3 else 0.05))


@pytest.mark.long
@pytest.mark.parametrize("bug", BUGS)
def test_the_deliberate_bugs_are_caught_by_most_seeds(bug: str) -> None:
    cfg = GossipSweepConfig(bug=bug)
    caught = sum(check_gossip_run(seed, cfg).valid is False for seed in range(10))
    assert caught >= 9, f"bug {bug} caught by {caught}/10 seeds"

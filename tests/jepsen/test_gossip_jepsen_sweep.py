"""Seeded gossip runs in the simulator, recorded in the harness's history vocabulary and checked
by the same checker (`phalanx.jepsen.gossip_sweep`): correct machines pass under crashes,
restarts and 5% loss; the deliberate bugs (anti-entropy off; silent forwarders with it off)
are caught; any single lost, duplicated or altered log entry of a valid run is caught
(hypothesis). A failing seed prints how to replay it. The wide sweep is `long` (`make sweeps`).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.jepsen.gossip_checker import (
    DELIVERIES,
    PUBLISH,
    FinalRead,
    check_gossip,
    final_reads,
)
from phalanx.jepsen.gossip_sweep import (
    BUGS,
    TICK_NS,
    GossipSweepConfig,
    check_gossip_run,
    run_gossip_sim,
)
from phalanx.jepsen.history import History, Op

FAST = GossipSweepConfig(n=8, fault_ticks=200, settle_ticks=200, down_ticks=(20, 80))


def _assert_valid(seed: int, cfg: GossipSweepConfig) -> None:
    result = check_gossip_run(seed, cfg)
    assert result.valid is True, (
        f"seed {seed}: {result.details['problems']}; replay: {cfg.replay(seed)}")


@pytest.mark.parametrize("seed", [0])  # and seed 5 below (the mutation test's run)
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


_SMALL = GossipSweepConfig(n=6, fault_ticks=150, settle_ticks=150, crash_p=0.05)
_HISTORY = run_gossip_sim(5, _SMALL)
_FINALS = final_reads(_HISTORY)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_lost_duplicated_or_altered_log_entry_of_a_valid_run_is_caught(
        data: st.DataObject) -> None:
    ttl = _SMALL.gossip.rumor_ttl
    assert check_gossip(_HISTORY, rumor_ttl_ms=ttl, finals=_FINALS).valid is True
    required = _required(_HISTORY, _FINALS, ttl)
    node = data.draw(st.sampled_from(sorted(_FINALS)))
    final = _FINALS[node]
    assert final.rumors
    i = data.draw(st.integers(0, len(final.rumors) - 1))
    entry = final.rumors[i]
    how = data.draw(st.sampled_from(["drop", "duplicate", "payload", "seq"]))
    if how == "drop" and entry[:3] not in required.get(node, set()):
        how = "duplicate"  # dropping a rumor the node does not owe is allowed
    rumors = list(final.rumors)
    if how == "drop":
        del rumors[i]
    elif how == "duplicate":
        rumors.insert(data.draw(st.integers(0, len(rumors))), entry)
    elif how == "payload":
        rumors[i] = (*entry[:3], entry[3] + "x", entry[4])
    else:
        rumors[i] = (entry[0], entry[1], entry[2] + 10_000, entry[3], entry[4])
    mutated = {**_FINALS, node: dataclasses.replace(final, rumors=tuple(rumors))}
    assert check_gossip(_HISTORY, rumor_ttl_ms=ttl, finals=mutated).valid is False, how


def _required(history: History, finals: dict[str, FinalRead], ttl: int
              ) -> dict[str, set[tuple[str, int, int]]]:
    """Per node, the rumor ids the checker's rule 1 says it owes (written out again)."""
    acked: list[tuple[str, int, int, int]] = []
    for p in history.pairs:
        if p.invoke.f == PUBLISH and p.outcome == "ok" and p.completion is not None:
            origin, inc, seq, ms = p.completion.value  # type: ignore[misc]
            acked.append((str(origin), int(inc), int(seq), int(ms)))  # type: ignore[arg-type]
    return {node: {(o, i, s) for o, i, s, ms in acked
                   if o in finals and finals[o].incarnation == i
                   and ms >= final.started_ms - ttl // 2}
            for node, final in finals.items()}


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

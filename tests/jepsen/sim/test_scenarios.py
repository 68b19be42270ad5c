"""Named nemesis scenarios (`phalanx.jepsen.sim.scenarios`): what `long-halves` adds to a
seed's schedule, and the errors for unknown names and short fault phases."""

from __future__ import annotations

import random

import pytest

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.run import RunConfig
from phalanx.jepsen.sim.scenarios import LONG_HALVES, check_scenario, with_scenario

MS = 1_000_000
VOTERS = ("n1", "n2", "n3", "n4")


def test_long_halves_cuts_two_halves_for_most_of_the_fault_phase() -> None:
    splits = set()
    for seed in range(20):
        events = with_scenario(LONG_HALVES, (), seed=seed, voters=VOTERS, time_ns=3_000 * MS)
        start, stop = events
        assert (start.action, stop.action) == ("start", "stop")
        assert start.fault == stop.fault == nemesis.PARTITION_HALVES
        assert start.groups == stop.groups
        assert start.episode == stop.episode == 0
        left, right = start.groups
        assert len(left) == len(right) == 2
        assert sorted(left + right) == list(VOTERS)
        assert 200 * MS <= start.at_ns < 400 * MS
        assert 2_400 * MS < stop.at_ns <= 3_000 * MS
        splits.add(frozenset(start.groups))
        assert events == with_scenario(LONG_HALVES, (), seed=seed, voters=VOTERS,
                                       time_ns=3_000 * MS)  # a function of the seed
    assert len(splits) == 3  # every split of four nodes into halves occurs


def test_a_scenario_adds_to_the_generated_schedule_after_its_episodes() -> None:
    generated = nemesis.generate_schedule(random.Random(1), nodes=VOTERS,
                                          faults=("pause", "loss"), duration_ns=3_000 * MS)
    assert generated
    both = with_scenario(LONG_HALVES, generated, seed=1, voters=VOTERS, time_ns=3_000 * MS)
    added = [e for e in both if e not in generated]
    assert len(both) == len(generated) + 2
    assert {e.episode for e in added} == {1 + max(e.episode for e in generated)}
    assert [e.at_ns for e in both] == sorted(e.at_ns for e in both)
    assert with_scenario("", generated, seed=1, voters=VOTERS, time_ns=3_000 * MS) == generated


def test_bad_scenarios_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        check_scenario("nope", 3_000 * MS)
    with pytest.raises(ValueError, match="at least 1 s of faults"):
        RunConfig(seed=0, scenario=LONG_HALVES, time_ns=500 * MS)
    with pytest.raises(ValueError, match="not with an explicit schedule"):
        RunConfig(seed=0, scenario=LONG_HALVES, schedule=())
    assert "--scenario long-halves" in RunConfig(seed=0, scenario=LONG_HALVES).replay_command()

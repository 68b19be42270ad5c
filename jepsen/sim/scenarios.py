"""Named nemesis scenarios: scripted fault shapes, drawn from the seed, that a seeded sweep
runs on top of (or instead of) the generated schedule (`RunConfig.scenario`, `phalanx sim
--scenario NAME`).

Owns: `SCENARIOS` (the names), `check_scenario` and `with_scenario` (a seed's schedule
with the scenario's events added).

- ``long-halves``: the voters cut into two halves (a seeded split; at n = 4 two sides of
  2, so neither side holds a leaderless quorum Q = 3, nor a majority) for most of the fault
  phase: from a seeded 200-400 ms to a seeded point in the last fifth of it (the rest heals
  at `time_ns`). Every transaction submitted meanwhile stays pending past its deadline on
  both sides, its checkpoints gather the votes of one side only, and at the heal dozens
  of checkpoints decide in one step: the shape of issue 15's "DROP meets a commit in one
  drain" (docs/LEADERLESS.md; the control is the bug `cascade_in_drain`). With many
  signing clients and hot keys (`tests/jepsen/sim/test_leaderless_long_halves.py`, `make
  sim-leaderless`), stuck transactions are endorsed conditionally on each other.

Rules: a pure function of (name, seed, voters, fault-phase length, the schedule it
extends): its draws come from `random.Random("scenario:NAME:SEED")` only, so a scenario
changes no other draw of the run; its episodes are numbered after the schedule's.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from phalanx.jepsen import nemesis

LONG_HALVES = "long-halves"
SCENARIOS: tuple[str, ...] = (LONG_HALVES,)

_MS = 1_000_000
MIN_TIME_NS = {LONG_HALVES: 1_000 * _MS}
"""The shortest fault phase a scenario needs (`check_scenario`)."""


def check_scenario(name: str, time_ns: int) -> None:
    """ValueError (one line) for an unknown scenario or a fault phase too short for it."""
    if not name:
        return
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if time_ns < MIN_TIME_NS[name]:
        raise ValueError(f"scenario {name} needs at least {MIN_TIME_NS[name] / 1e9:g} s of "
                         f"faults (--time), got {time_ns / 1e9:g}")


def with_scenario(name: str, schedule: nemesis.Schedule, *, seed: int,
                  voters: Sequence[str], time_ns: int) -> nemesis.Schedule:
    """`schedule` plus the events of scenario `name` ("": `schedule` as it is), in time
    order."""
    if not name:
        return schedule
    check_scenario(name, time_ns)
    rng = random.Random(f"scenario:{name}:{seed}")
    episode = 1 + max((e.episode for e in schedule), default=-1)
    added = _long_halves(rng, voters, time_ns, episode)
    return tuple(sorted((*schedule, *added), key=lambda e: (e.at_ns, e.episode,
                                                             e.action == "start")))


def _long_halves(rng: random.Random, voters: Sequence[str], time_ns: int,
                 episode: int) -> nemesis.Schedule:
    shuffled = sorted(voters)
    rng.shuffle(shuffled)
    cut = len(shuffled) // 2
    groups = (tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])))
    start = rng.randrange(200 * _MS, 400 * _MS)
    stop = time_ns - rng.randrange(0, time_ns // 5)
    cut_at = nemesis.FaultEvent(at_ns=start, action="start", fault=nemesis.PARTITION_HALVES,
                                episode=episode, groups=groups)
    return cut_at, dataclasses.replace(cut_at, at_ns=stop, action="stop")

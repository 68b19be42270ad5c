"""Deliberate-bug controls that do not hang on one seed: a bug's control runs a small seed
range and needs at least one seed to catch it (docs/LEADERLESS.md "Simulation").

Why: which seeds catch a bug depends on message arrival orders, which move whenever the
core's timing changes (batching, a new message): a control pinned to seed 34 silently
starts passing with the bug on. A range keeps catching while the bug is catchable at all.

Owns: `first_catch` (search a range in order, stop at the first seed whose checker fails
with the bug on; that seed must pass with the bug off, so the catch is the bug's) and
`CatchRange` (a bug's range, its settings and the seeds known to catch it, tried first so
the usual cost is one or two runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phalanx.jepsen.sim.run import RunResult

RunSeed = Callable[[int, frozenset[str]], RunResult]
"""Run one seed of the control's configuration with the given bug switches."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchRange:
    """`seeds` searched in order after `known` (the seeds that caught the bug when the
    range was chosen: tried first, so a stable bug costs one run)."""

    seeds: range
    known: tuple[int, ...] = ()

    def order(self) -> list[int]:
        return [*self.known, *(s for s in self.seeds if s not in self.known)]


def first_catch(bug: str, where: CatchRange, run_seed: RunSeed) -> RunResult:
    """The first seed (of `where.order()`) whose run fails with `bug` switched on; it must
    pass without the bug and its report must replay the bug. Fails the test, printing the
    seeds tried and a replay command, when no seed catches it."""
    tried: list[int] = []
    last: RunResult | None = None
    for seed in where.order():
        caught = run_seed(seed, frozenset({bug}))
        if caught.ok:
            tried.append(seed)
            last = caught
            continue
        report = caught.report()
        assert f"--bug {bug}" in report, report  # the replay command carries the bug
        clean = run_seed(seed, frozenset())
        assert clean.ok, (f"seed {seed} fails without --bug {bug} too (not the bug's catch):"
                          f"\n{clean.report()}")
        return caught
    replay = last.config.replay_command() if last is not None else ""
    raise AssertionError(
        f"--bug {bug} was caught by none of seeds {_ranges(tried)}: the checker or the "
        f"workload no longer exercises it (arrival orders moved? widen the range or the "
        f"mix). Replay one: {replay}")


def _ranges(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds)) if len(seeds) <= 8 else (
        f"{len(seeds)} seeds from {min(seeds)} to {max(seeds)}")

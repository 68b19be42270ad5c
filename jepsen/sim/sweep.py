"""Seed sweeps: many independent simulations, optionally on two processes, with a summary.

Owns: `SweepConfig`, `SeedOutcome` (what crosses a process boundary: plain data), `sweep()`
and the fault mixes used when a sweep rotates fault kinds per seed.

Rules:
- Each seed's outcome depends on the seed and the config only; parallelism changes wall
  time and the order results arrive, never a result. Results are reported in seed order.
- Worker processes are started with `spawn` (no inherited state) and receive only plain
  data; nothing is pickled beyond multiprocessing's own transport of these dataclasses.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TextIO

from phalanx.jepsen.sim.run import RunConfig, run


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedOutcome:
    seed: int
    ok: bool
    trace_hash: str
    report: str
    ops_ok: int
    deliveries: int
    wall_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    outcomes: tuple[SeedOutcome, ...]
    wall_s: float

    @property
    def failures(self) -> tuple[SeedOutcome, ...]:
        return tuple(o for o in self.outcomes if not o.ok)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self, label: str = "") -> str:
        """One line (plus the failing seeds); `label` (e.g. ``raft, 3 nodes``) opens it."""
        n = len(self.outcomes)
        ops = sum(o.ops_ok for o in self.outcomes)
        deliveries = sum(o.deliveries for o in self.outcomes)
        bad = self.failures
        head = (
            f"{label + ': ' if label else ''}{n} seed{'' if n == 1 else 's'}, "
            f"{n - len(bad)} passed, {len(bad)} failed; {ops} ok client ops, "
            f"{deliveries} message deliveries, {self.wall_s:.1f}s wall"
        )
        if bad:
            head += "\nfailing seeds: " + " ".join(str(o.seed) for o in bad)
        return head


def _one(cfg: RunConfig) -> SeedOutcome:
    result = run(cfg)
    return SeedOutcome(
        seed=cfg.seed,
        ok=result.ok,
        trace_hash=result.trace_hash,
        report="" if result.ok else result.report(),
        ops_ok=result.ops_ok,
        deliveries=result.deliveries,
        wall_s=result.wall_s,
    )


def _configs(base: RunConfig, seeds: range) -> Iterator[RunConfig]:
    for seed in seeds:
        yield replace(base, seed=seed)


def sweep(
    base: RunConfig,
    seeds: range,
    *,
    jobs: int = 1,
    progress: TextIO | None = None,
    label: str = "",
    on_outcome: Callable[[SeedOutcome], None] | None = None,
    stop_on_failure: bool = False,
) -> SweepResult:
    """Run `base` once per seed in `seeds`. `jobs > 1` uses that many worker processes.

    `progress`: a stream for progress, one line rewritten in place (``\\r``) on a terminal,
    otherwise plain lines at every 10% and at each failure (no ``\\r`` in logs), each opened
    by `label` when given.
    """
    wall0 = time.perf_counter()
    outcomes: list[SeedOutcome] = []
    total = len(seeds)
    tty = progress is not None and progress.isatty()
    prefix = f"{label}: " if label else ""

    def note(outcome: SeedOutcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
        if progress is not None:
            done = len(outcomes)
            failed = sum(1 for o in outcomes if not o.ok)
            every = max(1, total // (50 if tty else 10))
            if not outcome.ok or done == total or done % every == 0:
                line = (f"{prefix}[{done}/{total}] {failed} failed, "
                        f"{time.perf_counter() - wall0:.1f}s")
                if not tty:
                    progress.write(line + "\n")
                else:
                    progress.write("\r" + line + ("\n" if done == total or not outcome.ok else ""))
                progress.flush()

    if jobs <= 1 or total <= 1:
        for cfg in _configs(base, seeds):
            outcome = _one(cfg)
            note(outcome)
            if stop_on_failure and not outcome.ok:
                break
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(jobs) as pool:
            for outcome in pool.imap_unordered(_one, _configs(base, seeds), chunksize=2):
                note(outcome)
                if stop_on_failure and not outcome.ok:
                    pool.terminate()
                    break
    outcomes.sort(key=lambda o: o.seed)
    return SweepResult(outcomes=tuple(outcomes), wall_s=time.perf_counter() - wall0)

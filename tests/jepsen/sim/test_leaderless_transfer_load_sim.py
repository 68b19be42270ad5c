"""Leaderless state transfer under constant load (docs/LEADERLESS.md "State transfer"): n4
is cut off longer than the GC horizon while clients keep writing, and no replica ever takes
a quiet-point checkpoint (`idle_checkpoint_ticks` = 0: a load without pauses). The peers'
content-defined checkpoints (`cut_every`) give f+1 of them a common applied set; each
vouches for a retained one while what it applied since can still be fetched, so n4
installs one DURING the load and the checker's convergence holds. The control
(`cut_every` = 0: checkpoints only at quiet points, as before) never installs and diverges.
"""

from __future__ import annotations

import functools
import re

import pytest

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.run import RunConfig, RunResult, run

MS = 1_000_000
CLIENTS = 4
LOAD_MS = 4_500
"""Clients issue operations until then (then the run's liveness phase drains them)."""


CUT_OFF_PAST_THE_HORIZON: tuple[tuple[str, int], ...] = ()
"""The checker's `quiescence` was off (`quiescence=0`) until its per-transaction scope; now
judged with the default scope, which excuses exactly the transactions named here (each traced
as waiting for an abstaining node, or conditioned on one) and judges the rest. Where n4 is cut
off (partitioned, up) past the horizon: the transactions it alone received meanwhile stay
pending there for good, since n1-n3 hold nothing of them and hear of their checkpoints only
past deadline + horizon, so they abstain and the DROP never comes (docs/LEADERLESS.md
"Forgotten commits", liveness cost (2); also outside the horizon contract, `delta_old_ms` = 1 s
= `gc_horizon_ms`, "Limits" 6). Killed or with its disk lost, n4 takes no submissions: judged
there."""


def constant_load(seed: int, *, cut_every: int, kind: str = nemesis.PARTITION_ONE,
                  byzantine: int = 0, bugs: frozenset[str] = frozenset(),
                  vote_batch_ticks: int = 1) -> RunResult:
    shape: dict[str, object] = {"fault": kind, "episode": 1, "nodes": ("n4",)}
    if kind == nemesis.PARTITION_ONE:
        shape["groups"] = (("n4",), ("n1", "n2", "n3"))
    schedule = (nemesis.FaultEvent(at_ns=300 * MS, action="start", **shape),  # type: ignore[arg-type]
                nemesis.FaultEvent(at_ns=2_300 * MS, action="stop", **shape))  # type: ignore[arg-type]
    return run(RunConfig(
        seed=seed, protocol="leaderless", nodes=4, faults=(kind,), swarm=False,
        time_ns=LOAD_MS * MS, liveness_ns=3_000 * MS, schedule=schedule, keep_trace=True,
        byzantine=byzantine, bugs=bugs,
        settings=(("conflict_pct", 0), ("gc_horizon_ms", 1_000), ("clients", CLIENTS),
                  ("ops_per_client", 1_000), ("think_ns", 20 * MS),
                  ("idle_checkpoint_ticks", 0), ("cut_every", cut_every),
                  ("vote_batch_ticks", vote_batch_ticks),
                  *(CUT_OFF_PAST_THE_HORIZON if kind == nemesis.PARTITION_ONE else ()))))


def install_times_ms(result: RunResult) -> list[float]:
    return [float(m.group(1)) for line in result.trace_lines
            if (m := re.search(r"t=([\d.]+)ms n4 INSTALL", line))]


def replay(seed: int, cut_every: int) -> str:
    return (f"replay: constant_load({seed}, cut_every={cut_every}) in {__file__} "
            "(a scripted `RunConfig.schedule`)")


SEEDS = (3, 4, 5, 1, 2, 0)
"""Tried in order: the first whose run installs during the load is the test's seed (and its
control's). Single pinned seeds kept moving as message timing changed (seed 1 when
endorsements were batch-signed, seed 2 with the digest rotation and `SignatureResend`: it
installed at 4.6 s, just after the load); on 2026-12-02 seeds 1 and 3-5 install during it."""


@functools.cache
def _installing_seed() -> tuple[int, RunResult]:
    tried = []
    for seed in SEEDS:
        result = constant_load(seed, cut_every=4)
        assert result.ok, f"{replay(seed, 4)}\n{result.report()}"
        times = install_times_ms(result)
        if times and times[0] < LOAD_MS:
            return seed, result
        tried.append((seed, times[:1]))
    raise AssertionError(f"no seed of {SEEDS} installed during the load (first installs: "
                         f"{tried}); replay: constant_load(SEED, cut_every=4) in {__file__}")


def test_a_node_cut_off_under_constant_load_installs_and_converges() -> None:
    seed, result = _installing_seed()
    assert result.ok, f"{replay(seed, 4)}\n{result.report()}"


def test_without_cuts_the_same_run_never_installs_and_diverges() -> None:
    """The control: no quiet point, no common checkpoint. Tried on the seeds of `SEEDS`
    whose run installs during the load, in order, until one diverges without cuts (since an
    install re-applies what it lacks, 2026-12-02, seed 3 installs even without cuts: two
    peers happened to share a checkpoint older than n4's applies, once refused; seed 4
    does not: tried first). Since dead endorsements abort (2026-12-03, docs/LEADERLESS.md
    "Dead endorsements abort") the run without cuts installs and converges on every seed
    here: the control runs without that rule (`no_dead_abort`), the rules the cuts were
    added for."""
    tried = []
    for seed in (4, *(s for s in SEEDS if s != 4)):
        with_cuts = constant_load(seed, cut_every=4)
        times = install_times_ms(with_cuts)
        if not (with_cuts.ok and times and times[0] < LOAD_MS):
            continue
        result = constant_load(seed, cut_every=0, bugs=frozenset({"no_dead_abort"}))
        if not install_times_ms(result):
            assert not result.ok, replay(seed, 0)
            assert any("converge" in v or "gate" in v for v in result.report().splitlines())
            return
        tried.append(seed)
    raise AssertionError(f"without cuts, seeds {tried} installed anyway (of {SEEDS}); "
                         f"replay: constant_load(SEED, cut_every=0, "
                         f"bugs=frozenset({{'no_dead_abort'}})) in {__file__}")


def test_an_install_under_load_reapplies_what_it_lacks() -> None:
    """Issue 15 (the livelock of the long sweep below): n4, back from the partition, commits
    and applies the load's new transactions on its old state before its first install; every
    checkpoint its peers offer is older than some of them. The install rule refused such a
    checkpoint ("would undo an apply"), so n4 never installed and its later commits stayed
    gated. Now the install goes in and what it lacks is applied again after it
    (`ReleaseGate.regate`). The control `refuse_behind_checkpoint` (the old rule) must fail
    on some run (lose-disk and kill seed 5 on 2026-12-02, tried first; partition seed 2 and
    lose-disk seed 0 failed alike before message timing moved); that run must pass,
    installing, without it. The veto votes' echoes and readies go alone here
    (`vote_batch_ticks=0`, the timing those seeds were found with): batched, the control is
    caught only on kill seeds 6 and 11 of 0-13, whose runs fail `converge` without it too,
    batched or not (an open problem of the install path, not of this rule). Since a
    transaction undecided past the GC horizon asks for state transfer (2026-12-02 evening,
    docs/LEADERLESS.md "An install never undoes a forgotten apply", rule 2), n4 asks again
    later and finds a checkpoint covering its new applies (lose-disk seed 5 then installs
    at 4.3 s even with the old rule), so the control turns that ask off too
    (`no_overdue_transfer`), and the dead-endorsement abort of 2026-12-03 (`no_dead_abort`),
    which otherwise resolves the stuck transactions first: the old rules as they were."""
    tries = ((nemesis.LOSE_DISK, 5), (nemesis.KILL, 5), (nemesis.PARTITION_ONE, 2),
             *((kind, seed) for seed in range(10)
               for kind in (nemesis.LOSE_DISK, nemesis.KILL, nemesis.PARTITION_ONE)))
    for kind, seed in tries:
        caught = constant_load(seed, cut_every=4, kind=kind, vote_batch_ticks=0,
                               bugs=frozenset({"refuse_behind_checkpoint",
                                               "no_overdue_transfer", "no_dead_abort"}))
        if not caught.ok:
            clean = constant_load(seed, cut_every=4, kind=kind, vote_batch_ticks=0)
            assert clean.ok, f"{kind}: {replay(seed, 4)}\n{clean.report()}"
            assert install_times_ms(clean), f"{kind}: {replay(seed, 4)}"
            assert any("gate" in v or "converge" in v for v in caught.report().splitlines())
            return
    raise AssertionError("refuse_behind_checkpoint was caught by none of seeds 0-9 (lose-disk, "
                         f"kill, partition): replay: constant_load(SEED, cut_every=4, kind=KIND) "
                         f"in {__file__}")


@pytest.mark.long
@pytest.mark.parametrize("kind", [nemesis.PARTITION_ONE, nemesis.KILL, nemesis.LOSE_DISK])
def test_sweep_under_constant_load(kind: str) -> None:
    """`make sweeps`: 10 seeds a fault kind: every run valid, and in most of them n4 installs
    a checkpoint during the load (partition, 2026-12-02: 7 of 10; seed 6 installed after it,
    and seeds 7 and 8, whose clients sent a third of the others' messages, converged by
    fetching alone: the peers still held what n4 missed)."""
    failed, during = [], []
    for seed in range(10):
        result = constant_load(seed, cut_every=4, kind=kind)
        times = install_times_ms(result)
        if not result.ok:
            failed.append(seed)
        elif times and times[0] < LOAD_MS:
            during.append(seed)
    assert failed == [], f"{kind}: seeds {failed}; {replay(failed[0], 4)}"
    assert len(during) >= 7, f"{kind}: installed during the load only at seeds {during}"

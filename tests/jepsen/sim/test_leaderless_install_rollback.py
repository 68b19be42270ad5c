"""An install must never undo an acknowledged write (issue 15, found 2026-12-02 by the
seed-31/87 triage, fixed the same evening; docs/LEADERLESS.md "An install never undoes a
forgotten apply").

Seed 87 of the 1 s-horizon configuration (`horizon_run` in test_leaderless_sim.py) plus a
kill of the four nodes that committed `c1#5 srem s0 m12` from 1.7 s to 3.0 s: n1, n3 and
n6, cut off one way while it committed, hold it pending; the four committers applied it,
answered the client and forgot it at deadline + horizon. Restarted past their horizon,
they ask for state transfer, and f + 1 = 3 matching descriptors vouch for the three's
checkpoint (`tx_count` 14, without `c1#5`). Before the fix they installed it, and the
install re-applied only what the installing node still held, so the acknowledged `srem` was
undone on every replica (the checker's `folds` failed on all seven).

Now (1) the coverage rule refuses a checkpoint whose transaction table lacks an id of the
node's own replica table that the core no longer holds: the committers keep their state
(their own checkpoint is the one f+1 of them agree on); (2) n1, n3 and n6, whose `c1#5`
stays undecided past the GC horizon (no node holds its certificate any more, so no
checkpoint vote can keep it), ask for state transfer and install the committers'
checkpoint, whose table decides it committed there. With the kill at 1.7 s (2) alone
suffices (the three install before the committers restart, so no lacking checkpoint is
agreed any more); with the kill at 1.5 s, before the three find `c1#5` past their horizon,
each rule is needed: `install_over_forgotten` (the coverage rule off) brings the rollback
back on all seven replicas, `no_overdue_transfer` (no ask for the undecided transaction)
leaves the three without the srem. Both switches together are the old behaviour: the
original failure (`folds` on all seven).
"""

from __future__ import annotations

import pytest

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim import run as run_module
from phalanx.jepsen.sim.run import RunConfig, RunResult, run

MS = 1_000_000
COMMITTERS = ("n2", "n4", "n5", "n7")
REPLAY = ("replay: this test's schedule (seed 87 of `phalanx sim --protocol leaderless --nodes 7 "
          "--faults all --time 2 --liveness 4 --set gc_horizon_ms=1000 --set "
          "max_deadline_lead_ms=2000`, plus a kill of n2, n4, n5, n7 from 1.7 s to 3.0 s) "
          "is `_killed_committers_run` in tests/jepsen/sim/test_leaderless_install_rollback.py")


def _killed_committers_run(monkeypatch: pytest.MonkeyPatch, bugs: frozenset[str] = frozenset(),
                           kill_ms: int = 1_700) -> RunResult:
    original = nemesis.generate_schedule

    def schedule(rng, *, nodes, faults, duration_ns):  # type: ignore[no-untyped-def]
        planned = original(rng, nodes=nodes, faults=faults, duration_ns=2_000 * MS)
        kill = tuple(nemesis.FaultEvent(at_ns=at * MS, action=action, fault=nemesis.KILL,
                                        episode=99, nodes=COMMITTERS)
                     for at, action in ((kill_ms, "start"), (3_000, "stop")))
        return tuple(sorted((*planned, *kill), key=lambda e: e.at_ns))

    monkeypatch.setattr(run_module.nemesis, "generate_schedule", schedule)
    return run(RunConfig(seed=87, protocol="leaderless", nodes=7, time_ns=3_200 * MS,
                         liveness_ns=4_000 * MS, bugs=bugs,
                         settings=(("gc_horizon_ms", 1_000), ("max_deadline_lead_ms", 2_000),
                                   *COMMITTERS_AWAY_PAST_THE_HORIZON)))


COMMITTERS_AWAY_PAST_THE_HORIZON: tuple[tuple[str, int], ...] = ()
"""The checker's `quiescence` was off (`quiescence=0`) until its per-transaction scope; now
judged with the default scope, which excuses exactly the transactions named here (each traced
as waiting for an abstaining node, or conditioned on one) and judges the rest. n1, n3 and n6
end with two transactions pending for good (`efc2db`, `398b84`: in a checkpoint only they voted
drop in) and every node with one conditioned on them, since the four committers, killed past
their horizon, hold nothing of them and hear of the checkpoint only past deadline + horizon:
they abstain and the DROP never comes (docs/LEADERLESS.md "Forgotten commits", liveness cost
(2); the run is also outside the horizon contract, `delta_old_ms` = 1 s = `gc_horizon_ms`,
"Limits" 6)."""


@pytest.mark.parametrize("kill_ms", [1_700, 1_500])
def test_an_install_never_undoes_an_acknowledged_write(monkeypatch: pytest.MonkeyPatch,
                                                       kill_ms: int) -> None:
    result = _killed_committers_run(monkeypatch, kill_ms=kill_ms)
    assert result.ok, f"{REPLAY} (kill from {kill_ms} ms)\n{result.report()}"


@pytest.mark.parametrize(("kill_ms", "bugs"), [
    (1_700, ("install_over_forgotten", "no_overdue_transfer")),  # the old behaviour
    (1_500, ("install_over_forgotten",)),
])
def test_the_rollback_comes_back_without_the_coverage_rule(
        monkeypatch: pytest.MonkeyPatch, kill_ms: int, bugs: tuple[str, ...]) -> None:
    """The committers install the three's checkpoint and the acknowledged srem is gone from
    every replica (`folds` on all seven)."""
    result = _killed_committers_run(monkeypatch, frozenset(bugs), kill_ms)
    folds = [v for v in result.violations if v.startswith("folds")]
    assert len(folds) == 7, f"{REPLAY} (kill from {kill_ms} ms, bugs {bugs})\n{result.report()}"


def test_without_the_overdue_ask_the_holders_never_apply_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`no_overdue_transfer`: n1, n3 and n6 keep `c1#5` pending for good: they differ from
    the committers and lack the acknowledged srem."""
    result = _killed_committers_run(monkeypatch, frozenset({"no_overdue_transfer"}), 1_500)
    kinds = {v.split(":")[0] for v in result.violations}
    assert kinds == {"converge", "folds"}, f"{REPLAY} (kill from 1500 ms)\n{result.report()}"

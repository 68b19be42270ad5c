"""A known safety bug of the leaderless state transfer, pinned by a strict xfail (issue 15,
found 2026-12-02 by the seed-31/87 triage; docs/LEADERLESS.md "Limits").

Seed 87 of the 1 s-horizon configuration (`horizon_run` in test_leaderless_sim.py) plus a
kill of the four nodes that committed `c1#5 srem s0 m12` from 1.7 s to 3.0 s: n1, n3 and
n6, cut off one way while it committed, hold it pending; the four committers applied it,
answered the client and forgot it at deadline + horizon. Restarted past their horizon,
they ask for state transfer and install the checkpoint the three vouch for (f + 1 = 3
matching descriptors, `tx_count` 14, without `c1#5`). The install re-applies only what the
installing node still holds, so the acknowledged `srem` is undone on every replica: the
checker's `folds` fails on all seven. Two causes: `StateTransfer.on_descriptor` commits to
the first descriptor to reach f + 1 (here 0.06 ms before the committers' own, `tx_count`
15), and nothing refuses a checkpoint lacking a transaction the node applied and forgot.
A fix candidate: refuse a checkpoint whose transaction table lacks an id of the node's own
replica table (kept for horizon + deadline lead) that the core no longer holds; it meets
the livelock rule of "The livelock, fixed" and needs care.
"""

from __future__ import annotations

import pytest

from phalanx.jepsen import nemesis
from phalanx.jepsen.sim import run as run_module
from phalanx.jepsen.sim.run import RunConfig, RunResult, run

MS = 1_000_000
COMMITTERS = ("n2", "n4", "n5", "n7")


def _killed_committers_run(monkeypatch: pytest.MonkeyPatch) -> RunResult:
    original = nemesis.generate_schedule

    def schedule(rng, *, nodes, faults, duration_ns):  # type: ignore[no-untyped-def]
        planned = original(rng, nodes=nodes, faults=faults, duration_ns=2_000 * MS)
        kill = tuple(nemesis.FaultEvent(at_ns=at * MS, action=action, fault=nemesis.KILL,
                                        episode=99, nodes=COMMITTERS)
                     for at, action in ((1_700, "start"), (3_000, "stop")))
        return tuple(sorted((*planned, *kill), key=lambda e: e.at_ns))

    monkeypatch.setattr(run_module.nemesis, "generate_schedule", schedule)
    return run(RunConfig(seed=87, protocol="leaderless", nodes=7, time_ns=3_200 * MS,
                         liveness_ns=4_000 * MS,
                         settings=(("gc_horizon_ms", 1_000), ("max_deadline_lead_ms", 2_000))))


@pytest.mark.xfail(strict=True, reason=(
    "open safety bug, issue 15 (docs/LEADERLESS.md Limits 5): a node down past its GC "
    "horizon installs an f+1-vouched checkpoint lacking a write it applied, acknowledged "
    "and forgot; strict, so the fix must turn this test into a pass"))
def test_an_install_never_undoes_an_acknowledged_write(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _killed_committers_run(monkeypatch)
    assert result.ok, result.report()

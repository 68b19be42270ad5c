"""`LeaderlessCore.stuck` (`status.stuck_report`): the simulator's inspection of the old
pending transactions and what they wait on (the per-transaction `quiescence` scope,
`jepsen/sim/leaderless_scope.py`). Reads only."""

from __future__ import annotations

from leaderless_harness import EPOCH, Cluster, make_tx, tx_id, version

from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


def test_a_stuck_transaction_names_the_checkpoint_and_the_votes_it_waits_for() -> None:
    """n3 and n4 down: a put endorsed by n1 and n2 only (Q = 3) never commits; past
    `delta_old_ms` it is checkpointed, and n1 votes drop, but with two of four nodes up no
    vote is reliably delivered (2f+1 echoes): the checkpoint waits for all four. The report
    names it (with the cutoff honoured), and building it changes nothing."""
    c = Cluster(4, delta_old_ms=200, checkpoint_ticks=2)
    c.down = {N3, N4}
    tx = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    c.submit(tx, to=(N1, N2))
    c.tick(100, rounds=20)
    core = c.nodes[N1].core
    before = core.status()
    report = core.stuck(c.now)
    assert [t.tx_id for t in report.txs] == [tx_id(tx)]
    stuck = report.txs[0]
    assert stuck.deadline_ms == EPOCH + 300
    assert not stuck.past_horizon
    assert stuck.conditions == ()
    (wait,) = stuck.checkpoints
    assert wait.waiting_on == (N1, N2, N3, N4)
    assert wait.tx_ids == (tx_id(tx),)
    assert report.undecided == (wait,)
    assert report.unvoted == ()  # n1 voted drop
    assert core.stuck(EPOCH + 299).txs == ()  # deadline after the cutoff: not reported
    assert core.status() == before

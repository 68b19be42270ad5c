"""A pending transaction that can never gather a quorum is dropped (`_check_hopeless`): its
endorsements are conditional on a transaction committed here (a condition holds only once
its transaction is dropped) or its endorsers refused it, n-Q+1+f distinct nodes in all.

Found by the real-cluster run of the ordered resolution (docs/LEADERLESS.md, "A pbft-mode
real-cluster run"): such transactions stayed pending for ever (a checkpoint KEEPs them on Q
merged endorsements), every later transfer on their accounts waited behind them, and the
final read never committed.
"""

from __future__ import annotations

import pytest
from leaderless_harness import EPOCH, KvApp, endorsement, make_tx, run, solo, tx_id, version

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N2, N3, N4 = NodeId("n2"), NodeId("n3"), NodeId("n4")


@pytest.mark.parametrize("condition_commits", [True, False])
def test_endorsements_conditional_on_a_committed_transaction_never_count(
        condition_commits: bool) -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    c = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 1_000)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 2_000)
    for tx in (c, t):  # n1 endorses c (the first it sees), and so not t, which conflicts
        run(core, app, Receive(src=N2, message=tx))
    # n2..n4 endorsed t once c's deadline passed on their clocks: on condition that c drops.
    for node in (N2, N3, N4):
        run(core, app, Receive(src=node, message=endorsement(node, t, (tx_id(c),))))
    if condition_commits:  # ... but c commits after all (n1, n2, n3 endorsed it)
        for node in (N2, N3):
            run(core, app, Receive(src=node, message=endorsement(node, c)))
        assert app.data == {"x": b"a"}
    aborted = []
    period = core._config.rebroadcast_ticks
    for i in range(3 * period):  # past t's deadline: n1 refuses it; a periodic pass checks
        aborted += run(core, app, Tick(now_ms=EPOCH + 2_100 + i)).aborted
    state = core._store.state_of(tx_id(t))
    if condition_commits:
        # Out: n1 (refused) and n2..n4 (their only endorsements name committed c): 4 >= 3.
        assert state is TxState.DROPPED
        assert [a.request.client_id for a in aborted] == ["c2"]
    else:
        # c may still drop (a checkpoint), which would make the three endorsements valid.
        assert state is TxState.PENDING
        assert aborted == []


def test_a_dropped_condition_outlives_the_horizon_while_a_pending_endorsement_names_it() -> None:
    """t (hopeless, as above) is dropped; t3's endorsements name t. Past t's GC horizon its
    tombstone stays while they do, so the last endorsement of t3 still commits it here, as
    on a node that never collected it. Collected, the condition would be unknown: t3 would
    stay pending here while other nodes commit it (seen in the real run after the drop)."""
    core, app = solo(app=KvApp(refuse_policy="p"), gc_horizon_ms=1_000, delta_old_ms=100)
    run(core, app, Tick(now_ms=EPOCH))
    c = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 1_000)
    t = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 2_000)
    t3 = make_tx("set x c", client="c3", reqs={"x": version(b"a")},
                 deadline=EPOCH + 20_000, policy="p")  # n1's app refuses it: n1 never endorses
    for tx in (c, t, t3):
        run(core, app, Receive(src=N2, message=tx))
    for node in (N2, N3, N4):
        run(core, app, Receive(src=node, message=endorsement(node, t, (tx_id(c),))))
    for node in (N2, N3):
        run(core, app, Receive(src=node, message=endorsement(node, c)))
        run(core, app, Receive(src=node, message=endorsement(node, t3, (tx_id(t),))))
    for now in range(EPOCH + 2_100, EPOCH + 6_000, 10):  # t dropped; then 2 s past its horizon
        run(core, app, Tick(now_ms=now))
    assert core._store.state_of(tx_id(t)) is TxState.DROPPED
    run(core, app, Receive(src=N4, message=endorsement("n4", t3, (tx_id(t),))))
    assert core._store.state_of(tx_id(t3)) is TxState.COMMITTED
    assert app.data == {"x": b"c"}

"""A node that committed T and collected it past its GC horizon must not complete a DROP of
T (docs/LEADERLESS.md "Forgotten commits", `memory.py`): the residual race of issue 15,
reproduced deterministically, and the coverage rule's cases one by one."""

from __future__ import annotations

import pytest
from leaderless_harness import EPOCH, Cluster, endorsement, make_tx, run, solo, tx_id, version

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import StartCheckpoint, VetoChoice
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))
HORIZON = 2_000


@pytest.mark.parametrize("bug", [False, True])
def test_a_forgotten_commit_never_meets_a_drop(bug: bool) -> None:
    """n4 commits T (n2 and n3 endorse it, only n4 hears them), applies it, and is cut off;
    n1-n3 hold T pending, checkpoint it and vote drop. n4's clock passes T's deadline plus
    its GC horizon: it collects T. Then the partition heals and the others' pulls (with T's
    body) reach n4. Before the fix (`drop_forgotten`) n4 votes drop, the checkpoint decides
    DROP and n2, n3 abort the T that n4 applied. Now n4 abstains: nobody drops T (it stays
    pending at n1-n3: the liveness cost)."""
    c = Cluster(4, seed=3, gc_horizon_ms=HORIZON, delta_old_ms=200, checkpoint_ticks=2,
                bugs={N4: frozenset({"drop_forgotten"})} if bug else None)
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 500)
    t_id = tx_id(t)
    everyone = [(a, b) for a in c.ids for b in c.ids if a != b]
    c.cut = {pair for pair in everyone if pair not in ((N2, N4), (N3, N4))}
    c.submit(t, to=(N2, N3, N4))
    c.deliver()
    assert c.nodes[N4].app.data == {"x": b"a"}  # committed on n2, n3, n4 and applied
    assert c.nodes[N2].core._store.state_of(t_id) is TxState.PENDING

    c.down = {N4}  # cut off: what is sent to it is lost; the others talk again
    c.cut = {(N4, other) for other in (N1, N2, N3)}
    c.tick(rounds=30)  # past deadline + horizon; n1-n3 checkpoint T and vote drop
    for n in (N2, N3):
        assert c.nodes[n].core._checkpoints.blocked(t_id), n
        assert c.nodes[n].core._store.state_of(t_id) is TxState.PENDING, n
    c.step(N4, Tick(now_ms=c.now))  # n4's own clock: it syncs T's WAL entry (idle since) ...
    c.step(N4, Tick(now_ms=c.now + 1))  # ... and collects T
    assert c.nodes[N4].core._store.state_of(t_id) is None
    assert c.nodes[N4].app.data == {"x": b"a"}

    c.down, c.cut = set(), set()
    c.tick(rounds=20)
    n4_votes = [s.message for r in c.nodes[N4].readys for s in r.messages
                if isinstance(s.message, VetoChoice) and t_id in s.message.tx_ids]
    aborted_t = [n for n in (N2, N3) if any(
        (a.request.client_id, a.request.request_no) == (t.client_id, t.request_no)
        for a in c.nodes[n].aborted)]
    if bug:
        assert n4_votes
        assert all(v.drop for v in n4_votes)
        assert aborted_t == [N2, N3]  # DROP met n4's commit: replicas apart for good
        assert c.nodes[N2].core.status().dropped_txs == 1
        assert c.nodes[N2].app.data == {} != c.nodes[N4].app.data
        return
    assert n4_votes == []  # abstains: its memory no longer covers T
    assert aborted_t == []
    for n in (N2, N3):
        assert c.nodes[n].core._store.state_of(t_id) is TxState.PENDING, n
    assert all(c.nodes[n].core.status().dropped_txs == 0 for n in c.ids)


def _start_from_n2(core_app: tuple[object, object], msg: StartCheckpoint) -> list[VetoChoice]:
    core, app = core_app
    ready = run(core, app, Receive(src=N2, message=msg))  # type: ignore[arg-type]
    return list({s.message: None for s in ready.messages if isinstance(s.message, VetoChoice)})


def test_coverage_rule_for_ids_held_nothing_of() -> None:
    """Past the horizon (clock beyond it, nothing held of T): no body → abstain; a body of
    a deadline within the horizon → drop; one older than the horizon → abstain; a body that
    is not about a listed id is counted and ignored. With the horizon still at or below 0
    nothing can have been collected: drop, as before."""
    now = EPOCH + 10_000
    fresh = make_tx("set x a", deadline=now - HORIZON + 100)
    old = make_tx("set y a", deadline=now - HORIZON - 100)
    other = make_tx("set z a", deadline=now)
    node = solo(gc_horizon_ms=HORIZON)
    run(*node, Tick(now_ms=now))

    assert _start_from_n2(node, StartCheckpoint(tx_ids=(tx_id(fresh),))) == []
    (vote,) = _start_from_n2(node, StartCheckpoint(tx_ids=(tx_id(fresh),), txs=(fresh,)))
    assert vote.drop  # the pull with the body lets it vote
    assert _start_from_n2(node, StartCheckpoint(tx_ids=(tx_id(old),), txs=(old,))) == []
    assert _start_from_n2(node, StartCheckpoint(tx_ids=(tx_id(old),), txs=(other,))) == []
    assert node[0].status().dropped.get("bad_checkpoint_body") == 1

    young = solo(gc_horizon_ms=HORIZON)
    run(*young, Tick(now_ms=HORIZON - 1))  # horizon < 0: nothing ever collected
    (vote,) = _start_from_n2(young, StartCheckpoint(tx_ids=(tx_id(old),)))
    assert vote.drop


def test_a_held_transaction_goes_out_with_the_checkpoint() -> None:
    """A node that starts (and pulls) a checkpoint attaches the bodies of the listed ids it
    holds, so a peer that holds nothing of them can judge them."""
    core, app = solo(delta_old_ms=0, checkpoint_ticks=1, gc_horizon_ms=HORIZON)
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 100)
    run(core, app, Receive(src=N2, message=t))
    run(core, app, Receive(src=N2, message=endorsement("n2", t)))
    starts = []
    for i in range(1, 4):
        ready = run(core, app, Tick(now_ms=EPOCH + 200 * i))
        starts += [s.message for s in ready.messages if isinstance(s.message, StartCheckpoint)]
    assert starts
    assert all(m.tx_ids == (tx_id(t),) and m.txs == (t,) for m in starts)

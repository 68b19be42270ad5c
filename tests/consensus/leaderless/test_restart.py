"""Crash and restart from the durable record: no conflicting endorsement, no lost or doubled
apply, and every own signature is durable before it is sent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import (
    EPOCH,
    REGISTRY,
    Cluster,
    KvApp,
    endorsement,
    make_tx,
    run,
    sent_endorsements,
    solo,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import Endorsement, LeaderlessDurableState, Refusal
from phalanx.consensus.types import Entry, NodeId

N2, N3 = NodeId("n2"), NodeId("n3")


def _reload(state: object) -> LeaderlessDurableState:
    assert isinstance(state, LeaderlessDurableState)
    return REGISTRY.decode(REGISTRY.encode(state), expected=LeaderlessDurableState)


def test_signatures_are_recorded_before_they_are_sent() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    ready = run(core, app, Receive(src=N2, message=make_tx("add x 1", deadline=EPOCH + 10)))
    sent = sent_endorsements(ready)
    assert sent
    assert ready.must_sync
    assert isinstance(ready.core_state, LeaderlessDurableState)
    assert sent[0] in ready.core_state.endorsed
    assert ready.number == 1
    assert not ready.early_messages
    ready = run(core, app, Tick(now_ms=EPOCH + 100))
    refusals = [s.message for s in ready.messages if isinstance(s.message, Refusal)]
    assert refusals == []  # endorsed: never refused
    other = make_tx("set y 1", reqs={"y": version(b"no")}, deadline=EPOCH + 150)
    run(core, app, Receive(src=N2, message=other))  # a requirement fails: not endorsed
    ready = run(core, app, Tick(now_ms=EPOCH + 200))
    refusals = [s.message for s in ready.messages if isinstance(s.message, Refusal)]
    assert {r.tx_id for r in refusals} == {tx_id(other)}  # type: ignore[attr-defined]
    assert ready.must_sync
    assert isinstance(ready.core_state, LeaderlessDurableState)
    assert all(r in ready.core_state.refused for r in refusals)


def test_restart_never_signs_a_conflicting_endorsement() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 1000)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 2000)
    ready = run(core, app, Receive(src=N2, message=t1))
    state = _reload(ready.core_state)
    assert [e.tx_id for e in state.endorsed] == [tx_id(t1)]
    core, _ = solo(app=app, restored=state)
    run(core, app, Tick(now_ms=EPOCH + 10))
    ready = run(core, app, Receive(src=N2, message=t2))
    assert not sent_endorsements(ready)
    ready = run(core, app, Receive(src=N2, message=t1))  # a replay: no second endorsement
    assert not sent_endorsements(ready)
    # After T1 expired, n1 endorses T2 only on condition T1.
    ready = run(core, app, Tick(now_ms=EPOCH + 1100))
    (e,) = sent_endorsements(ready)[:1]
    assert isinstance(e, Endorsement)
    assert e.tx_id == tx_id(t2)
    assert e.conditions == (tx_id(t1),)


def _three_committed() -> tuple[KvApp, LeaderlessDurableState, list[Entry]]:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    txs = [make_tx(f"add x {i}", no=i + 1) for i in range(3)]
    state = None
    released: list[Entry] = []
    for tx in txs:
        run(core, app, Receive(src=N2, message=tx))
        for node in ("n2", "n3"):
            ready = run(core, app, Receive(src=NodeId(node), message=endorsement(node, tx)))
            state = ready.core_state or state
            released += ready.committed
    assert app.data == {"x": b"3"}
    assert app.applied() == 3
    restored = _reload(state)
    assert restored.released == 3
    assert restored.released_at == (1, 2, 3)
    return app, restored, released


def test_restart_does_not_release_what_the_replica_applied() -> None:
    """Found by the conformance suite's crash cuts: a restart released every released proof
    again at new local indexes (the replica deduplicated them, but every replica's indexes
    drifted apart and each restart re-applied the whole GC window)."""
    app, restored, _ = _three_committed()
    core, _ = solo(app=app, restored=restored)
    ready = run(core, app, Tick(now_ms=EPOCH + 10))
    assert ready.committed == ()
    assert app.data == {"x": b"3"}
    assert core.status().commit_index == 3


def test_restart_re_releases_what_the_replica_lost_at_the_same_indexes() -> None:
    """A crash after the record was written but before the WAL kept the applies: the
    proofs beyond the replica's applied index are released again, at their old indexes."""
    _, restored, log = _three_committed()
    app = KvApp()
    app.apply(log[0])
    core, _ = solo(app=app, restored=restored)
    ready = run(core, app, Tick(now_ms=EPOCH + 10))
    assert [e.index for e in ready.committed] == [2, 3]
    assert [e.requests for e in ready.committed] == [log[1].requests, log[2].requests]
    assert app.data == {"x": b"3"}
    assert core.status().commit_index == 3


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), restart_at=st.integers(0, 30), who=st.integers(1, 4))
def test_cluster_with_a_restart_converges(seed: int, restart_at: int, who: int) -> None:
    c = Cluster(4, seed=seed)
    c.tick()
    adds = [make_tx(f"add x {i}", client=f"c{i % 3}", no=i + 1) for i in range(6)]
    for i, tx in enumerate(adds):
        c.submit(tx, to=(c.ids[i % 4], c.ids[(i + 1) % 4]))
    c.deliver(limit=restart_at)
    c.restart(NodeId(f"n{who}"))
    c.tick(rounds=25)
    states = c.states()
    assert all(s == {"x": b"15"} for s in states), states

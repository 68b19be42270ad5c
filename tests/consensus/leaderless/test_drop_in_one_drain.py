"""Checkpoints decided DROP together are applied together: no id of them commits on the way
(docs/LEADERLESS.md "DROP meets a commit in one drain"; issue 15, the long halves partition
of `bench/leaderless_refetch.py --sim 4`).

Dropping T1 makes the endorsements of T2 conditioned on T1 definitely valid; when T2 is in a
checkpoint decided DROP in the same drain, `blocked(T2)` is already false (its checkpoint is
decided), so a cascade from T1's drop committed T2 before the core reached T2's drop, while
every node that met T2's checkpoint first dropped it: the replicas parted. Since then
`blocked` also holds for the ids of a checkpoint decided DROP, so no commit path (that
cascade re-enabled, here) can commit one (defence in depth). The deliberate bug
`cascade_in_drain` (`bugs.py`) is the old rule; the simulator's control for it is
`tests/jepsen/sim/test_leaderless_long_halves.py`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from leaderless_harness import (
    EPOCH,
    KvApp,
    endorsement,
    make_tx,
    run,
    solo,
    submit_of,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import CheckpointDecision, Transaction, TxId
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import CheckpointMachine, VetoEffects
from phalanx.consensus.types import NodeId

N2, N3, N4 = (NodeId(f"n{i}") for i in range(2, 5))


class DecidesDrop:
    """The node's real machine, plus DROP decisions of `ids` at the next drain, as
    `CheckpointMachine._collect` reports them: in decision order, their checkpoints already
    decided (so none of the ids is `blocked` any more)."""

    def __init__(self, inner: CheckpointMachine, ids: tuple[TxId, ...]) -> None:
        self._inner, self._ids = inner, ids

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def blocked(self, tx_id: TxId) -> bool:
        return tx_id not in self._ids and self._inner.blocked(tx_id)

    def drain(self) -> VetoEffects:
        effects, ids = self._inner.drain(), self._ids
        self._ids = ()
        return replace(effects, dropped=effects.dropped + ids)


def t1_t2_pending(bugs: frozenset[str] = frozenset()) -> tuple[
        LeaderlessCore, KvApp, Transaction, Transaction]:
    """T1 pending with two endorsements; T2 pending with Q endorsements, each conditioned
    on T1 (so dropping T1 makes T2 committable)."""
    core, app = solo("n1", bugs=bugs, delta_old_ms=100)
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set r a", reqs={"r": version(None)}, deadline=EPOCH + 500)
    t2 = make_tx("set r b", client="c2", reqs={"r": version(None)}, deadline=EPOCH + 600)
    run(core, app, submit_of(t1))  # n1 endorses T1: with n2's, 2 < Q = 3: pending
    run(core, app, Receive(src=N2, message=endorsement("n2", t1)))
    run(core, app, submit_of(t2))
    for node in (N2, N3, N4):  # Q endorsements of T2, each conditioned on T1
        run(core, app, Receive(src=node, message=endorsement(node, t2, (tx_id(t1),))))
    assert core._store.state_of(tx_id(t1)) is TxState.PENDING
    assert core._store.state_of(tx_id(t2)) is TxState.PENDING
    return core, app, t1, t2


def test_a_dependent_dropped_in_the_same_drain_never_commits() -> None:
    core, app, t1, t2 = t1_t2_pending()
    store = core._store
    assert isinstance(core._checkpoints, CheckpointMachine)
    core._checkpoints = DecidesDrop(core._checkpoints, (tx_id(t1), tx_id(t2)))  # type: ignore[assignment]
    ready = run(core, app, Tick(now_ms=EPOCH + 700))

    assert store.state_of(tx_id(t1)) is TxState.DROPPED
    assert store.state_of(tx_id(t2)) is TxState.DROPPED  # was COMMITTED before the fix
    assert not ready.committed
    assert app.data == {}
    assert {(a.request.client_id, a.request.request_no) for a in ready.aborted} == {
        ("c1", 1), ("c2", 1)}
    assert "checkpoint_dropped_committed" not in core.status().dropped


def test_a_drop_decided_id_is_refused_by_any_commit_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth (`blocked` holds for the ids of a remembered checkpoint decided
    DROP): with the cascade of each drop re-enabled (the path the test above closes by
    dropping all first), T1's drop makes T2 committable while T2's own checkpoint is already
    decided DROP in the real machine (two restored decisions, T1's first): the commit is
    refused and T2 is dropped. Before, `blocked(T2)` was false once its checkpoint decided,
    and T2 committed (then `checkpoint_dropped_committed`)."""
    core, app, t1, t2 = t1_t2_pending()
    config = core._config
    machine = CheckpointMachine(
        node_id=config.node_id, nodes=config.nodes, crypto=core._crypto,
        checkpoint_ticks=config.checkpoint_ticks, batch=config.checkpoint_batch,
        verify_proof=core._verify_proof, tx_id_of=core._tx_id,
        restored_decisions=tuple(CheckpointDecision(tx_ids=(tx_id(t),), drop=True)
                                 for t in (t1, t2)))
    machine.unprovable = core._unprovable
    core._checkpoints = machine
    drop_tx = core._drop_tx
    monkeypatch.setattr(core, "_drop_tx", lambda record, reason, out, cascade=True: drop_tx(
        record, reason, out, True))
    ready = run(core, app, Tick(now_ms=EPOCH + 700))

    assert core._store.state_of(tx_id(t1)) is TxState.DROPPED
    assert core._store.state_of(tx_id(t2)) is TxState.DROPPED
    assert not ready.committed
    assert app.data == {}
    assert "checkpoint_dropped_committed" not in core.status().dropped
    assert machine.blocked(tx_id(t2))


def test_the_cascade_in_drain_bug_commits_the_dependent() -> None:
    """The deliberate bug: the old rule, each drop cascading at once (DROP meets a commit;
    the fake machine here does not block the DROP-decided T2, as before the hardening)."""
    core, app, t1, t2 = t1_t2_pending(frozenset({"cascade_in_drain"}))
    assert isinstance(core._checkpoints, CheckpointMachine)
    core._checkpoints = DecidesDrop(core._checkpoints, (tx_id(t1), tx_id(t2)))  # type: ignore[assignment]
    ready = run(core, app, Tick(now_ms=EPOCH + 700))
    assert core._store.state_of(tx_id(t1)) is TxState.DROPPED
    assert core._store.state_of(tx_id(t2)) is TxState.COMMITTED
    assert len(ready.committed) == 1
    assert core.status().dropped.get("checkpoint_dropped_committed") == 1

"""A committed transaction that a pending transaction's endorsements name as a condition is
not garbage-collected while named (docs/LEADERLESS.md "Garbage collection").

The bug this guards (found replaying the state-transfer sweep with one Byzantine node,
seeds 2 and 17): T2 was endorsed by Q nodes on condition T (T pending and expired), then
T committed, was applied and went past the GC horizon everywhere. T2's condition became
unknown, so `Rules.stuck` queued T for a checkpoint; no node held T's certificate any more,
every node voted drop, T was "dropped" and T2, which conflicts with T, committed on those
endorsements: two conflicting transactions both committed, T2 gated forever.

Each test fails on the old GC (a committed record went once applied).
"""

from __future__ import annotations

from leaderless_harness import EPOCH, KvApp, endorsement, make_tx, run, solo, tx_id, version

from phalanx.consensus.core import Ready, Receive, Tick
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import StartCheckpoint, Transaction, VetoChoice
from phalanx.consensus.leaderless.parts import Outbox
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N2 = NodeId("n2")
HORIZON_MS = 1_000


def _t_committed_t2_named_on_it() -> tuple[LeaderlessCore, KvApp, Transaction, Transaction]:
    """n1 commits and applies T (set x a, deadline +10 ms); T2 (set x b, on the same
    version of x) holds n2, n3 and n4's endorsements on condition T."""
    core, app = solo(gc_horizon_ms=HORIZON_MS, delta_old_ms=100)
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 10)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 5_000)
    for tx in (t, t2):
        run(core, app, Receive(src=N2, message=tx))
    run(core, app, Tick(now_ms=EPOCH + 20))  # T expired
    for node in ("n2", "n3", "n4"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t2, (tx_id(t),))))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t)))
    assert app.data == {"x": b"a"}
    assert core.status().committed == 1
    return core, app, t, t2


def _ticks(core: LeaderlessCore, app: KvApp, start: int, stop: int) -> list[Ready]:
    return [run(core, app, Tick(now_ms=now)) for now in range(start, stop, 10)]


def _votes(readies: list[Ready], t: Transaction) -> list[VetoChoice]:
    return [s.message for r in readies for s in r.messages
            if isinstance(s.message, VetoChoice) and tx_id(t) in s.message.tx_ids]


def test_a_named_committed_condition_outlives_the_horizon() -> None:
    core, app, t, t2 = _t_committed_t2_named_on_it()
    readies = _ticks(core, app, EPOCH + 30, EPOCH + 30 + 2 * HORIZON_MS)
    assert core._store.state_of(tx_id(t)) is TxState.COMMITTED
    assert not [v for v in _votes(readies, t) if v.drop], "voted to drop what it committed"
    # A peer that forgot T asks: n1 vetoes with T's certificate.
    ready = run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=(tx_id(t),))))
    (vote,) = set(_votes([ready], t)) or set(_votes(readies, t))
    assert not vote.drop
    assert [p.tx for p in vote.proofs] == [t]
    assert app.data == {"x": b"a"}
    assert core._store.state_of(tx_id(t2)) is not TxState.COMMITTED


def test_it_goes_once_nothing_names_it() -> None:
    """Bounded by T2's decision: T2 (undecided: its endorsements' condition T committed, so
    they never count) is never collected past its deadline (docs/LEADERLESS.md "Undecided
    transactions are never forgotten"), so T stays; once T2 is decided (dropped, as a
    checkpoint's DROP does it), both go at the next GC."""
    core, app, t, t2 = _t_committed_t2_named_on_it()
    _ticks(core, app, EPOCH + 30, t2.deadline_ms + 2 * HORIZON_MS + 500)
    assert core._store.state_of(tx_id(t2)) is TxState.PENDING
    assert core._store.state_of(tx_id(t)) is TxState.COMMITTED
    record = core._store.get(tx_id(t2))
    assert record is not None
    core._drop_tx(record, "dropped by a checkpoint (veto procedure)", Outbox())
    now = t2.deadline_ms + 2 * HORIZON_MS + 600
    _ticks(core, app, now, now + 30)
    assert core._store.state_of(tx_id(t2)) is None
    assert core._store.state_of(tx_id(t)) is None
    assert app.data == {"x": b"a"}

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
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N2 = NodeId("n2")
HORIZON_MS = 1_000


def _t_committed_t2_named_on_it() -> tuple[LeaderlessCore, KvApp, Transaction, Transaction]:
    """n1 commits and applies T (set x a, deadline +10 ms); T2 (set x b, on the same
    version of x) holds n2 and n3's endorsements on condition T and n4's unconditional one.
    Two dead endorsements are no abort certificate (3 at n = 4, with refusals: `refusals.py`,
    docs/LEADERLESS.md "Dead endorsements abort"), and with T dropped T2 would commit on
    the three. n1 applied T before T2 was endorsable: it never endorses T2."""
    core, app = solo(gc_horizon_ms=HORIZON_MS, delta_old_ms=100)
    run(core, app, Tick(now_ms=EPOCH))
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 10)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 5_000)
    for tx in (t, t2):
        run(core, app, Receive(src=N2, message=tx))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t)))
    assert app.data == {"x": b"a"}
    run(core, app, Tick(now_ms=EPOCH + 20))  # T expired
    for node, conditions in (("n2", (tx_id(t),)), ("n3", (tx_id(t),)), ("n4", ())):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t2, conditions)))
    assert core.status().committed == 1
    assert core._store.state_of(tx_id(t2)) is TxState.PENDING
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
    """Bounded by T2's decision: T2 (undecided: two of its endorsements name the committed
    T, so they never count) is never collected past its deadline (docs/LEADERLESS.md
    "Undecided transactions are never forgotten"), so T stays; at T2's deadline n1 refuses
    it, and its refusal with the two dead endorsements drops T2 (an abort certificate);
    both go at the next GC."""
    core, app, t, t2 = _t_committed_t2_named_on_it()
    _ticks(core, app, EPOCH + 30, t2.deadline_ms - 10)
    assert t.deadline_ms + 2 * HORIZON_MS < t2.deadline_ms - 10
    assert core._store.state_of(tx_id(t2)) is TxState.PENDING
    assert core._store.state_of(tx_id(t)) is TxState.COMMITTED
    now = t2.deadline_ms + 2 * HORIZON_MS + 600
    _ticks(core, app, t2.deadline_ms - 10, now)
    assert core._store.state_of(tx_id(t2)) is None
    assert core._store.state_of(tx_id(t)) is None
    assert app.data == {"x": b"a"}

"""A checkpoint id whose holders all DROPPED it still has a body behind their own signatures:
the safety kernel keeps the transaction of every own endorsement or refusal until GC, while
a dropped record leaves the store (only its tombstone stays) and pending records are not
durable (issue 15 item 3 B, the abstention limit; docs/LEADERLESS.md "Bodies behind own
signatures").

Before, starts and pulls carried only the bodies of store records: a node holding nothing
of such an id (it never heard of it, or restarted without it) could never learn its
deadline, abstained for good ("Forgotten commits"), and under unanimity the checkpoint
never decided, its drop voters blocked on its ids. Now the bodies come from the kernel
when the store has none."""

from __future__ import annotations

from leaderless_harness import EPOCH, Cluster, make_tx, tx_id, version

from phalanx.consensus.core import Receive
from phalanx.consensus.leaderless.messages import StartCheckpoint, VetoChoice
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


def refused_while_n1_was_away() -> tuple[Cluster, bytes]:
    """n1 cut off; T (a put of x requiring a version x never had) reaches n2, n3 and n4:
    none endorses it, each refuses it at its deadline, and the three refusals abort it: T is
    DROPPED there (a tombstone in the store, the body only behind each refusal, in the
    kernel). n1 never hears of it."""
    c = Cluster(4, delta_old_ms=100, checkpoint_ticks=2)
    c.tick()
    t = make_tx("set x b", reqs={"x": version(b"never")}, deadline=EPOCH + 400)
    c.cut = {(a, N1) for a in c.ids} | {(N1, a) for a in c.ids}
    c.submit(t, to=(N2, N3, N4))
    c.tick(rounds=6)
    for n in (N2, N3, N4):
        core = c.nodes[n].core
        assert core._store.state_of(tx_id(t)) is TxState.DROPPED
        assert core._store.get(tx_id(t)) is None
        assert core._kernel.transaction(tx_id(t)) == t
    assert c.nodes[N1].core._store.state_of(tx_id(t)) is None
    c.net.clear()
    c.cut.clear()
    return c, tx_id(t)


def test_a_checkpoint_of_an_id_its_holders_dropped_decides() -> None:
    """A start of {T} without bodies (as from a node that holds nothing of T either: one
    whose endorsement names T, say) reaches all four nodes. n2-n4 vote drop at once; n1,
    holding nothing and its horizon past 0, abstains until a pull brings T's body, which
    only the kernels of n2-n4 hold. With the kernels' bodies it votes drop and {T} is
    DROPPED everywhere; before (store bodies only), n1 abstained and {T} stayed open for
    good at all four nodes."""
    c, t = refused_while_n1_was_away()
    first = c.step(N1, Receive(src=N2, message=StartCheckpoint(tx_ids=(t,))))
    assert not any(isinstance(s.message, VetoChoice) for s in first.messages)  # abstains
    for n in (N2, N3, N4):
        c.step(n, Receive(src=N1, message=StartCheckpoint(tx_ids=(t,))))
    c.deliver()
    c.tick(rounds=10)
    for n in c.ids:
        m = c.nodes[n].core._checkpoints
        assert [(d.tx_ids, d.drop) for d in m.veto_decisions()] == [((t,), True)], n
    assert c.nodes[N1].core._store.state_of(t) is TxState.DROPPED


def test_a_pull_carries_a_body_only_the_kernel_holds() -> None:
    """n2's pull of the open {T} (every period) carries T's body although its store holds
    only T's tombstone."""
    c, t = refused_while_n1_was_away()
    c.cut = {(a, b) for a in c.ids for b in c.ids if a != b}  # keep {T} open at n2
    c.step(N2, Receive(src=N3, message=StartCheckpoint(tx_ids=(t,))))
    c.tick(rounds=2)
    pulls = [s.message for r in c.nodes[N2].readys for s in r.messages
             if isinstance(s.message, StartCheckpoint) and s.message.tx_ids == (t,)]
    assert pulls
    assert all(p.txs and tx_id(p.txs[0]) == t for p in pulls)

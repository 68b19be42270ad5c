"""A checkpoint id no voter holds a record of may still have a body behind a node's own
signature: the safety kernel keeps the transaction of every own endorsement or refusal in
the durable record until GC, while pending records are not durable (issue 15 item 3 B, the
abstention limit; docs/LEADERLESS.md "Bodies behind own signatures").

Before, a restarted node holding nothing of a listed id in its store abstained (its
deadline unknown: "Forgotten commits"), and its peers' starts and pulls carried only the
bodies of their store records: an id every holder had dropped, or lost on a restart, was
never decided (unanimity), and its drop voters stayed blocked on it. Now a node takes the
deadline from its kernel's body too, and attaches its kernel's bodies to its starts and
pulls."""

from __future__ import annotations

from leaderless_harness import EPOCH, Cluster, make_tx, tx_id, version

from phalanx.consensus.core import Receive
from phalanx.consensus.leaderless.messages import StartCheckpoint, VetoChoice
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


def endorsed_alone(node: NodeId, *, ticks: int = 0) -> tuple[Cluster, bytes]:
    """`node`, cut off, endorses T (one endorsement: pending), runs `ticks` more ticks and
    restarts from its record: its store holds nothing of T, its kernel T's body."""
    c = Cluster(4, delta_old_ms=100, checkpoint_ticks=2)
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 400)
    c.cut = {(a, b) for a in c.ids for b in c.ids if a != b}
    c.submit(t, to=(node,))
    assert c.nodes[node].core._kernel.endorsement(tx_id(t)) is not None
    c.tick(rounds=ticks)
    c.restart(node)
    core = c.nodes[node].core
    assert core._store.state_of(tx_id(t)) is None
    assert core._kernel.transaction(tx_id(t)) == t
    return c, tx_id(t)


def test_a_restarted_endorser_votes_on_its_kernels_body() -> None:
    """n2 restarted holding T only in its kernel; a bodiless start of {T} reaches it: it
    votes drop (T's deadline is within its horizon: it would hold T had it committed it).
    Before, it abstained for good."""
    c, t = endorsed_alone(N2)
    ready = c.step(N2, Receive(src=N3, message=StartCheckpoint(tx_ids=(t,))))
    votes = [s.message for s in ready.messages if isinstance(s.message, VetoChoice)]
    assert votes and all(v.drop and v.voter == N2 for v in votes)
    assert c.nodes[N2].core._checkpoints.blocked(t)


def test_an_id_held_only_in_a_kernel_is_decided_everywhere() -> None:
    """n2, cut off, endorses T, checkpoints it past its deadline (drop vote, blocked) and
    restarts: no store holds T any more. Healed, n2's pulls carry T's body from its kernel,
    n1, n3 and n4 (which never heard of T) learn its deadline, vote drop, and {T} is
    DROPPED everywhere; n2 is no longer blocked by an open checkpoint. Before (pulls with
    store bodies only) the three abstained and the checkpoint stayed open for good."""
    c, t = endorsed_alone(N2, ticks=6)  # past T's deadline and delta_old: n2 starts {T}
    own = c.nodes[N2].core._checkpoints.votes()  # restored: its drop vote
    assert [(v.tx_ids, v.drop) for v in own] == [((t,), True)]
    assert c.nodes[N2].core._checkpoints.blocked(t)
    c.net.clear()
    c.cut.clear()
    c.tick(rounds=10)
    assert {c.nodes[n].core._store.state_of(t) for n in c.ids} == {TxState.DROPPED}
    for n in c.ids:
        m = c.nodes[n].core._checkpoints
        assert [(d.tx_ids, d.drop) for d in m.veto_decisions()] == [((t,), True)], n

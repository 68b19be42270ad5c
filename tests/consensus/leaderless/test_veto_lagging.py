"""A lagging node learns a checkpoint decision from nodes that decided it and went quiet
(issue 15 item 9, the veto-mode seed-2 real-cluster run): the deciding messages to it are
lost, the others decide (and, in the second case, restart from their durable record, as the
kill nemesis does); once the links heal, its pulls must bring it the same decision, and no
node may sign a second vote on the checkpoint (docs/LEADERLESS.md "Decided checkpoints stay
in the record")."""

from __future__ import annotations

import pytest
from veto_harness import Cluster, about, proof, restarted, start, tid

from phalanx.consensus.leaderless.messages import VetoChoice
from phalanx.consensus.types import NodeId

DECIDERS = ("n0", "n1", "n2")
LAGGING = "n3"


def decided_without_n3() -> tuple[Cluster, tuple[bytes, ...]]:
    """n2 vetoes tx 5 with a valid proof; everything about n2's vote sent to n3 is lost:
    n0, n1, n2 decide KEEP, n3 delivers only the three drops and stays undecided."""
    c = Cluster(4)
    c.proofs["n2"][tid(5)] = proof(5)
    c.lose = lambda s, t, m: t == LAGGING and about(m, "n2")
    ids = start(c, [5])
    c.run()
    for node in DECIDERS:
        assert c.decided(node) == "keep"
    assert c.decided(LAGGING) is None
    assert c.machines[LAGGING].blocked(ids[0])  # its own drop vote blocks tx 5 there
    c.lose = lambda s, t, m: False
    return c, ids


def settle(c: Cluster, periods: int = 8) -> None:
    for _ in range(periods):
        c.tick()
        c.run()


def test_a_lagging_node_learns_the_decision_from_quiet_deciders() -> None:
    c, ids = decided_without_n3()
    settle(c)
    assert c.decided(LAGGING) == "keep"
    assert not c.machines[LAGGING].blocked(ids[0])
    assert all(not c.dropped[x] for x in c.nodes)


@pytest.mark.parametrize("who", [DECIDERS, ("n2",), ("n0", "n1")])
def test_a_lagging_node_learns_the_decision_after_the_deciders_restarted(
        who: tuple[NodeId, ...]) -> None:
    """The deciders restart from their durable record; n2 no longer holds its proof (a
    pending record is not persisted: asked again, it would vote drop). Before the fix the
    record kept nothing of a decided checkpoint: the restarted deciders voted again when
    n3 pulled (seen: a second vote each), n2 a drop this time, and with all three restarted
    n3 and then the deciders themselves decided DROP, against the KEEP decided before."""
    c, ids = decided_without_n3()
    c.wire.clear()
    for node in who:
        restarted(c, node)
    c.proofs["n2"].clear()
    signed = {x: len(c.persisted[x]) for x in c.nodes}
    settle(c)
    assert c.decided(LAGGING) == "keep", c.machines[LAGGING].dropped_counts()
    assert not c.machines[LAGGING].blocked(ids[0])
    for node in c.nodes:
        assert not c.dropped[node], f"{node} dropped what the deciders kept"
        assert len(c.persisted[node]) == signed[node], f"{node} signed a second vote"
        assert not c.machines[node].blocked(ids[0])
    # Each voter's votes on the wire are one value (no second vote of a restarted node).
    for voter in c.nodes:
        sent = {m for s, _, m in c.log if isinstance(m, VetoChoice) and m.voter == voter}
        assert len(sent) <= 1, f"{voter} sent {len(sent)} different votes"

"""A checkpoint kept on one id's proof says nothing of its other ids: they are queued again
(docs/LEADERLESS.md "Kept on another's proof"). Found as the 1 s-horizon "runaway" seed 44
(`tests/jepsen/sim/test_leaderless_sim.py::test_a_kept_checkpoints_other_ids_go_again`):
the veto mode's checkpoint {T', T, ...} was kept on T''s proof (applicable on endorsements
conditional on T) while T itself had too few endorsements; T was never checkpointed again,
so neither could ever commit or drop. `veto_decided_once` (bugs.py) is the old rule."""

from __future__ import annotations

from veto_harness import Cluster, proof, start, tid

from phalanx.consensus.leaderless.messages import StartCheckpoint


def cluster(*, decided_once: bool = False) -> Cluster:
    return Cluster(4, decided_once=decided_once)


def kept_on_five(c: Cluster) -> None:
    """Checkpoint {5, 6} kept everywhere on the proof of 5 that n2 holds; 6 has none."""
    c.proofs["n2"][tid(5)] = proof(5)
    start(c, [5, 6])
    c.run()
    assert all(c.decided(node) == "keep" for node in c.nodes)


def starts_of(c: Cluster, ids: tuple[bytes, ...]) -> int:
    return sum(1 for _, _, m in c.log if isinstance(m, StartCheckpoint) and m.tx_ids == ids)


def test_the_other_id_of_a_kept_checkpoint_goes_again_and_is_dropped() -> None:
    c = cluster()
    kept_on_five(c)
    for node in c.nodes:  # still stuck: the core queues both again every period
        c.machines[node].queue(tid(5))
        c.machines[node].queue(tid(6))
    c.tick()
    c.run()
    assert starts_of(c, (tid(6),)) > 0
    assert starts_of(c, (tid(5),)) == 0  # kept on its own proof: not again
    for node in c.nodes:
        assert c.dropped[node] == [tid(6)]
        assert c.machines[node].blocked(tid(6))  # decided DROP: never committed here


def test_a_holder_of_a_proof_still_keeps_the_new_checkpoint() -> None:
    """The new checkpoint is an ordinary one: a node that can show 6 applicable (or
    committed) vetoes it, and nothing is dropped."""
    c = cluster()
    kept_on_five(c)
    c.proofs["n3"][tid(6)] = proof(6)
    c.machines["n0"].queue(tid(6))
    c.tick()
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == []
        assert [p.tx for p in c.kept[node]][-1].request_no == 6


def test_control_decided_once_never_checkpoints_it_again() -> None:
    c = cluster(decided_once=True)
    kept_on_five(c)
    for _ in range(3):
        for node in c.nodes:
            c.machines[node].queue(tid(6))
        c.tick()
        c.run()
    assert starts_of(c, (tid(6),)) == 0
    assert all(c.dropped[node] == [] for node in c.nodes)

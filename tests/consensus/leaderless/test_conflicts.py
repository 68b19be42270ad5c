"""Conflicting writes under random delivery: every replica ends in one state, with the
same transactions committed and the others aborted everywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import EPOCH, Cluster, make_tx, tx_id, version

from phalanx.consensus.types import NodeId

IDS = tuple(NodeId(f"n{i}") for i in range(1, 5))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6),
       writes=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(),
                                 st.integers(0, 3), st.integers(100, 900)),
                       min_size=2, max_size=5))
def test_conflicting_sets_converge(seed: int, writes: list[tuple[str, bool, int, int]]) -> None:
    c = Cluster(4, seed=seed, checkpoint_ticks=3, delta_old_ms=100, rebroadcast_ticks=5)
    c.tick()
    txs = []
    for i, (value, after_a, node, life) in enumerate(writes):
        req = version(b"a") if after_a else version(None)
        tx = make_tx(f"set x {value}{i}", client=f"c{i}", reqs={"x": req},
                     deadline=EPOCH + life)
        txs.append(tx)
        c.submit(tx, to=(IDS[node], IDS[(node + 1) % 4]))
        c.deliver(limit=c.rng.randrange(30))
    c.tick(ms=100, rounds=60)
    states = c.states()
    assert all(s == states[0] for s in states), states
    for n in IDS:
        st_ = c.nodes[n].core.status()
        assert st_.pending == 0, st_
        assert st_.gated == 0, st_
    outcome = {n: sorted(tx_id(t) in c.nodes[n].app.applied_ids for t in txs) for n in IDS}
    assert len({tuple(v) for v in outcome.values()}) == 1
    committed = {n: {tx_id(t) for t in txs if tx_id(t) in c.nodes[n].app.applied_ids}
                 for n in IDS}
    assert all(v == committed[IDS[0]] for v in committed.values())
    aborted = {n: {a.request.client_id for a in c.nodes[n].aborted} for n in IDS}
    assert all(len(aborted[n]) + len(committed[n]) == len(txs) for n in IDS), (aborted, committed)

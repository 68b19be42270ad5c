"""Mixing commuting updates and versioned writes on one key (docs/LEADERLESS.md "Mixing
update kinds on one key"): a commuting update carries a requirement on the key's BASE
version, so a replica that learns of it before the write it was endorsed after gates it
until that write applied, and every replica converges."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import EPOCH, Cluster, make_tx, sign_tx, version

from phalanx.consensus.leaderless.messages import Requirement, Transaction
from phalanx.consensus.types import NodeId

N1, N4 = NodeId("n1"), NodeId("n4")


def _add(c: Cluster, amount: int, *, no: int, src: NodeId, base: bool,
         deadline: int = EPOCH + 5000) -> Transaction:
    tx = make_tx(f"add x {amount}", no=no, deadline=deadline)
    if base:
        reqs = (Requirement(key="x", version=c.nodes[src].app.bases.get("x", b""), base=True),)
        tx = sign_tx(tx.client, replace(tx, requirements=reqs, signature=b""))
    return tx


@pytest.mark.parametrize("fixed", [True, False])
def test_add_certificate_before_the_set_it_follows(fixed: bool) -> None:
    """n4 misses `set x 10`; `add x 1` is endorsed after it. n4 receives the add's
    certificate first. Without a base requirement it applies the add at once and the set's
    requirement (x absent) never holds there again: it diverges (the old limit)."""
    c = Cluster(4, seed=3)
    for node in c.ids:
        c.nodes[node].app.base_required = fixed
    c.tick()
    c.down = {N4}
    c.submit(make_tx("set x 10", reqs={"x": version(None)}), to=(N1,))
    c.tick(rounds=3)
    assert [c.nodes[n].app.data for n in c.ids[:3]] == [{"x": b"10"}] * 3
    c.down = set()
    add = _add(c, 1, no=2, src=N1, base=fixed)
    c.submit(add, to=c.ids)
    c.deliver()
    assert c.nodes[N4].core.status().committed == 1  # the add, before the set
    c.tick(rounds=60)
    states = c.states()
    if fixed:
        assert states == [{"x": b"11"}] * 4
        assert all(c.nodes[n].core.status().gated == 0 for n in c.ids)
    else:
        assert states[:3] == [{"x": b"11"}] * 3
        assert states[3] == {"x": b"1"}
        assert c.nodes[N4].core.status().gated == 1


@pytest.mark.parametrize("fixed", [True, False])
def test_base_update_certificate_before_a_pinned_update_it_follows(fixed: bool) -> None:
    """Sim seeds 108, 218, 402, 564 (docs/LEADERLESS.md "Simulation"): n4 misses U1, an
    add requiring x's FULL version; U2, an add requiring only x's base, is endorsed after
    U1 applied. n4 learns U2's certificate first. When a pinned update moves the base
    (`pinned_moves_base`, as the KV app's `apply_tx`), U2's base does not exist at n4 before
    U1: U2 waits at the gate and every replica converges. Under the old rule (the control)
    n4 applies U2 at once and U1's full requirement never holds there again."""
    c = Cluster(4, seed=3)
    for node in c.ids:
        c.nodes[node].app.base_required = True
        c.nodes[node].app.pinned_moves_base = fixed
    c.tick()
    c.down = {N4}
    have = c.nodes[N1].app.versions(["x"])[0]
    c.submit(make_tx("add x 1", reqs={"x": have}), to=(N1,))  # U1: full requirement
    c.tick(rounds=3)
    assert [c.nodes[n].app.data for n in c.ids[:3]] == [{"x": b"1"}] * 3
    c.down = set()
    u2 = _add(c, 2, no=2, src=N1, base=True)
    c.submit(u2, to=c.ids)
    c.deliver()
    assert c.nodes[N4].core.status().committed == 1  # U2, before U1
    c.tick(rounds=60)
    states = c.states()
    if fixed:
        assert states == [{"x": b"3"}] * 4
        assert all(c.nodes[n].core.status().gated == 0 for n in c.ids)
    else:
        assert states[:3] == [{"x": b"3"}] * 3
        assert states[3] == {"x": b"2"}
        assert c.nodes[N4].core.status().gated == 1


OPS = st.lists(st.tuples(st.sampled_from(["set", "add"]), st.integers(0, 9),
                         st.sampled_from(["n1", "n2", "n3", "n4"]),
                         st.sampled_from(["", "n1", "n2", "n3", "n4"]),
                         st.integers(0, 3)),
               min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_mixed_updates_on_one_key_converge(
        ops: list[tuple[str, int, str, str, int]], seed: int) -> None:
    """Sets (full requirement) and adds (base requirement), each read from one node's
    applied state (possibly stale), sent while one node may be cut off, delivered in a
    seeded order: once healed and quiet, every replica holds the same value and nothing
    waits at the version gate."""
    c = Cluster(4, seed=seed)
    for node in c.ids:
        c.nodes[node].app.base_required = True
    c.tick()
    for no, (op, value, src, down, rounds) in enumerate(ops, start=1):
        src_id = NodeId(src)
        c.down = {NodeId(down)} if down and down != src else set()
        deadline = c.now + 3000
        if op == "set":
            have = c.nodes[src_id].app.versions(["x"])[0]
            tx = make_tx(f"set x {value}", no=no, deadline=deadline, reqs={"x": have})
        else:
            tx = _add(c, value, no=no, src=src_id, base=True, deadline=deadline)
        c.submit(tx, to=tuple(n for n in c.ids if n not in c.down))
        c.tick(rounds=rounds)
    c.down = set()
    c.tick(rounds=80)
    states = c.states()
    assert all(s == states[0] for s in states), states
    assert all(c.nodes[n].core.status().gated == 0 for n in c.ids)

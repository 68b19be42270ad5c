"""LeaderlessConfig validation, bug switches, determinism."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import (
    EPOCH,
    Cluster,
    endorsement,
    make_tx,
    run,
    sent_endorsements,
    solo,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.bugs import BUG_NAMES, check_bugs
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.messages import Endorsement
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

IDS = tuple(NodeId(f"n{i}") for i in range(1, 5))


def test_config_defaults_and_quorums() -> None:
    cfg = LeaderlessConfig(node_id=IDS[0], nodes=IDS, policy_quorums=(("all", 4),))
    assert (cfg.n, cfg.faults, cfg.quorum) == (4, 1, 3)
    assert cfg.quorum_for("all") == 4
    assert cfg.quorum_for("") == 3
    seven = tuple(NodeId(f"n{i}") for i in range(1, 8))
    assert LeaderlessConfig(node_id=seven[0], nodes=seven).quorum == 5
    assert LeaderlessConfig(node_id=IDS[0], nodes=IDS, f=0).quorum == 3


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"nodes": (NodeId("n2"), NodeId("n1"))}, "sorted"),
    ({"node_id": NodeId("zz")}, "not one of"),
    ({"f": 2}, "n > 3f"),
    ({"policy_quorums": (("p", 2),)}, "must be in"),
    ({"policy_quorums": (("p", 5),)}, "must be in"),
    ({"policy_quorums": (("b", 3), ("a", 3))}, "sorted by unique"),
    ({"checkpoint_ticks": 0}, "checkpoint_ticks"),
    ({"max_pending": 0}, "max_pending"),
    ({"delta_old_ms": -1}, "delta_old_ms"),
    ({"max_deadline_lead_ms": 0}, "max_deadline_lead_ms"),
])
def test_config_rejects(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"node_id": IDS[0], "nodes": IDS, **kwargs}
    with pytest.raises(ValueError, match=match):
        LeaderlessConfig(**args)  # type: ignore[arg-type]


def test_bug_names() -> None:
    assert {"drop_on_commit", "no_version_gate", "endorse_despite_conflict"} <= set(BUG_NAMES)
    with pytest.raises(ValueError, match="unknown"):
        check_bugs(["nope"])
    with pytest.raises(ValueError, match="unknown"):
        solo(bugs=frozenset({"nope"}))


@pytest.mark.parametrize("bug", [False, True])
def test_endorse_despite_conflict(bug: bool) -> None:
    core, app = solo(bugs=frozenset({"endorse_despite_conflict"}) if bug else frozenset())
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set x a", reqs={"x": version(None)})
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)})
    signed = []
    for tx in (t1, t2):
        ready = run(core, app, Receive(src=NodeId("n2"), message=tx))
        signed += set(sent_endorsements(ready))
    unconditional = [e for e in signed if isinstance(e, Endorsement) and not e.conditions]
    assert [e.tx_id for e in unconditional] == ([tx_id(t1), tx_id(t2)] if bug else [tx_id(t1)])


def _trace(seed: int) -> list[object]:
    c = Cluster(4, seed=seed, checkpoint_ticks=3, delta_old_ms=100)
    c.tick()
    c.submit(make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 400),
             to=(IDS[0],))
    c.submit(make_tx("set x b", client="c2", reqs={"x": version(None)}), to=(IDS[3],))
    c.submit(make_tx("add y 2", client="c3"), to=(IDS[1],))
    c.tick(rounds=30)
    return [r for n in IDS for r in c.nodes[n].readys]


def test_deterministic() -> None:
    assert _trace(7) == _trace(7)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6),
       adds=st.lists(st.tuples(st.sampled_from("abc"), st.integers(-5, 5),
                               st.integers(0, 3)), min_size=1, max_size=8))
def test_commuting_updates_converge_under_reordering(
        seed: int, adds: list[tuple[str, int, int]]) -> None:
    c = Cluster(4, seed=seed)
    c.tick()
    for i, (key, n, node) in enumerate(adds):
        c.submit(make_tx(f"add {key} {n}", client=f"c{i}", no=1), to=(IDS[node],))
        if i % 2:
            c.deliver(limit=c.rng.randrange(20))
    c.tick(rounds=3)
    expected: dict[str, int] = {}
    for key, n, _ in adds:
        expected[key] = expected.get(key, 0) + n
    want = {k: str(v).encode() for k, v in expected.items()}
    assert all(s == want for s in c.states())
    assert all(c.nodes[n].core.status().committed == len(adds) for n in IDS)


@pytest.mark.parametrize("bug", [False, True])
def test_count_conditional_commits_both_of_a_late_quorum(bug: bool) -> None:
    """The late quorum by hand: T1 expires with only n1's endorsement here; T2 (conflicting)
    is endorsed on condition of T1 by n1, n2, n3; then n2's and n3's endorsements of T1,
    signed before its deadline, arrive late. Correct: T1 commits and T2 waits (its
    endorsements now never count). With ``count_conditional``, T2 commits on its conditional
    endorsements first, and T1 after: both conflicting transactions commit."""
    core, app = solo(bugs=frozenset({"count_conditional"}) if bug else frozenset())
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 100)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 5000)
    run(core, app, Receive(src=NodeId("n2"), message=t1))
    run(core, app, Tick(now_ms=EPOCH + 200))  # T1 expired, pending
    ready = run(core, app, Receive(src=NodeId("n2"), message=t2))
    assert [e.conditions for e in sent_endorsements(ready)][:1] == [(tx_id(t1),)]
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t2, (tx_id(t1),))))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t1)))
    assert core.status().committed == (2 if bug else 1)
    assert core._store.state_of(tx_id(t2)) is (TxState.COMMITTED if bug else TxState.PENDING)

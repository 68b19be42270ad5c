"""Leaderless core: commit, conflicts, requirements, policies, intake (docs/LEADERLESS.md)."""

from __future__ import annotations

from leaderless_harness import EPOCH, Cluster, make_tx, submit_of, tx_id, version

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import Endorsement
from phalanx.consensus.types import NodeId


def test_conflict_free_commit_with_q_unconditional_endorsements() -> None:
    c = Cluster(4)
    c.tick()
    tx = make_tx("set x 1", reqs={"x": version(None)})
    c.submit(tx)
    c.deliver()
    for node in c.ids:
        st = c.nodes[node].core.status()
        assert st.commit_index == 1
        assert st.committed == 1
        assert st.pending == 0
        assert c.nodes[node].app.data == {"x": b"1"}
        assert st.role == "endorser"
        assert st.term == 0
        assert st.leader is None
    proof = c.nodes[NodeId("n1")].durable.committed[0]  # type: ignore[union-attr]
    assert len(proof.endorsements) >= 3
    assert all(not e.conditions for e in proof.endorsements)


def test_entry_carries_the_encoded_transaction() -> None:
    c = Cluster(4)
    c.tick()
    tx = make_tx("add x 2")
    c.submit(tx)
    c.deliver()
    ready = next(r for r in c.nodes[NodeId("n2")].readys if r.committed)
    (entry,) = ready.committed
    assert ready.entries == ready.committed
    assert entry.term == 0
    assert entry.index == 1
    (req,) = entry.requests
    assert (req.client_id, req.request_no, req.read_only) == ("c1", 1, False)
    assert req.command == submit_of(tx).request.command


def test_requirement_mismatch_is_not_endorsed_then_aborted_by_refusals() -> None:
    c = Cluster(4)
    c.tick()
    tx = make_tx("set x 1", reqs={"x": version(b"nope")}, deadline=EPOCH + 500)
    c.submit(tx)
    c.deliver()
    assert all(c.nodes[n].core.status().pending == 1 for n in c.ids)
    c.tick(ms=300, rounds=3)
    for node in c.ids:
        st = c.nodes[node].core.status()
        assert st.pending == 0
        assert st.dropped_txs == 1
        assert st.commit_index == 0
        (abort,) = c.nodes[node].aborted
        assert abort.request.request_no == 1
        assert "refused" in abort.reason
    assert all(s == {} for s in c.states())


def test_missing_requirement_on_a_set_is_never_endorsed() -> None:
    c = Cluster(4)
    c.tick()
    c.submit(make_tx("set x 1", deadline=EPOCH + 500))  # a blind overwrite
    c.deliver()
    c.tick(ms=300, rounds=3)
    assert all(c.nodes[n].core.status().dropped_txs == 1 for n in c.ids)


def test_policy_refusal_aborts() -> None:
    from leaderless_harness import KvApp

    apps = {NodeId(f"n{i}"): KvApp(refuse_policy="strict") for i in (1, 2)}
    c = Cluster(4, apps=apps)
    c.tick()
    c.submit(make_tx("add x 1", policy="strict", deadline=EPOCH + 500))
    c.deliver()
    assert all(c.nodes[n].core.status().pending == 1 for n in c.ids)  # 2 < Q = 3
    # Two endorsed, so only two refuse: short of an abort certificate (3 at n=4); the
    # transaction is stuck past deadline + delta_old and a checkpoint drops it.
    c.tick(ms=100, rounds=60)
    assert all(c.nodes[n].core.status().dropped_txs == 1 for n in c.ids)
    assert all(len(c.nodes[n].aborted) == 1 for n in c.ids)
    assert "checkpoint" in c.nodes[c.ids[0]].aborted[0].reason


def test_per_policy_quorum_requires_more_endorsements() -> None:
    apps = {NodeId("n4"): __import__("leaderless_harness").KvApp(refuse_policy="all")}
    c = Cluster(4, apps=apps, policy_quorums=(("all", 4),))
    c.tick()
    c.submit(make_tx("add x 1", policy="all", deadline=EPOCH + 500))
    c.submit(make_tx("add y 1", no=2))
    c.deliver()
    for node in c.ids:
        st = c.nodes[node].core.status()
        assert st.committed == 1
        assert st.pending == 1


def test_commuting_adds_commit_without_requirements() -> None:
    c = Cluster(4)
    c.tick()
    for i in range(5):
        c.submit(make_tx(f"add x {i}", no=i + 1), to=(c.ids[i % 4],))
    c.deliver()
    assert all(s == {"x": b"10"} for s in c.states())


def test_conflicting_sets_split_and_checkpoint_resolves() -> None:
    """n=4, Q=3: T1 endorsed by n1, n2; T2 by n3, n4. After T1's deadline, n1 and n2
    endorse T2 on condition T1; T1 is checkpointed (unanimous drop) and T2 commits."""
    c = Cluster(4, checkpoint_ticks=5, delta_old_ms=200)
    c.tick()
    t1 = make_tx("set x a", no=1, reqs={"x": version(None)}, deadline=EPOCH + 1000)
    t2 = make_tx("set x b", client="c2", no=1, reqs={"x": version(None)}, deadline=EPOCH + 5000)
    n1, n2, n3, n4 = c.ids
    # Each side sees its own transaction first: hold the cross traffic.
    c.submit(t1, to=(n1, n2))
    c.submit(t2, to=(n3, n4))
    c.net = [(s, m) for s, m in c.net if {s, m.to} <= {n1, n2} or {s, m.to} <= {n3, n4}]
    c.deliver()
    for node in c.ids:
        c.step(node, Receive(src=n1 if node in (n3, n4) else n3,
                             message=t1 if node in (n3, n4) else t2))
    c.deliver()
    assert all(c.nodes[n].core.status().pending == 2 for n in c.ids)
    c.tick(ms=200, rounds=40)
    for node in c.ids:
        st = c.nodes[node].core.status()
        assert (st.committed, st.dropped_txs, st.pending) == (1, 1, 0), st
        assert c.nodes[node].app.data == {"x": b"b"}
    assert [a.request.client_id for a in c.nodes[n1].aborted] == ["c1"]
    assert tx_id(t1) != tx_id(t2)


def test_hostile_input_is_counted_not_raised() -> None:
    c = Cluster(4)
    c.tick()
    n1 = c.ids[0]
    core = c.nodes[n1].core
    tx = make_tx("add x 1")
    forged = tx.__class__(**{**{f: getattr(tx, f) for f in tx.__dataclass_fields__},
                             "signature": b"x" * 32})
    core.step(Receive(src=NodeId("n2"), message=forged))
    unsigned = forged.__class__(**{**{f: getattr(tx, f) for f in tx.__dataclass_fields__},
                                   "signature": b""})
    core.step(Receive(src=NodeId("n2"), message=unsigned))
    core.step(Receive(src=NodeId("zz"), message=tx))
    bad = Endorsement(tx_id=tx_id(tx), endorser=NodeId("n3"), signature=b"bad")
    core.step(Receive(src=NodeId("n3"), message=bad))
    core.step(Receive(src=NodeId("n2"), message=tx))
    core.step(Receive(src=NodeId("n3"), message=tx))  # replay
    old = make_tx("add y 1", deadline=1)
    core.step(Tick(now_ms=EPOCH + 10**6))
    core.step(Receive(src=NodeId("n2"), message=old))
    ready = core.step(c.nodes[n1].core and submit_of(make_tx("add q 1", deadline=5)))
    assert ready.rejected
    assert "deadline" in ready.rejected[0].reason
    dropped = core.status().dropped
    for reason in ("bad_tx_signature", "unknown_sender", "bad_endorsement_signature",
                   "stale_tx", "submit_expired"):
        assert dropped.get(reason, 0) >= 1, (reason, dropped)
    # A replay is a benign duplicate, not a drop: `dropped` keeps the suspicious input.
    assert "duplicate_tx" not in dropped
    assert core.status().duplicate.get("duplicate_tx", 0) >= 1


def test_submit_mismatch_and_garbage_are_rejected() -> None:
    c = Cluster(4)
    core = c.nodes[c.ids[0]].core
    sub = submit_of(make_tx("add x 1"))
    bad = sub.request.__class__(client_id="other", request_no=1, command=sub.request.command)
    r1 = core.step(sub.__class__(request=bad))
    r2 = core.step(sub.__class__(request=bad.__class__(client_id="c", request_no=1,
                                                      command=b"\x00garbage")))
    assert r1.rejected
    assert r2.rejected
    assert not r1.messages
    assert core.status().dropped == {"submit_mismatch": 1, "undecodable_submit": 1}


def test_status_never_changes_the_core() -> None:
    c = Cluster(4)
    c.tick()
    c.submit(make_tx("add x 1"))
    core = c.nodes[c.ids[0]].core
    before = core.durable_state()
    assert core.status() == core.status()
    assert core.durable_state() == before


def test_a_silent_node_blocks_checkpoints_not_conflict_free_commits() -> None:
    """The documented liveness cost of the unanimity veto: with n4 silent, a split conflict
    never resolves, while a conflict-free transaction still commits."""
    c = Cluster(4, checkpoint_ticks=3, delta_old_ms=100)
    n1, n2, n3, n4 = c.ids
    c.down.add(n4)
    c.tick()
    t1 = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 5000)
    c.submit(t1, to=(n1,))
    c.submit(t2, to=(n2, n3))
    c.net = [(s, m) for s, m in c.net if not ({s, m.to} & {n1} and s != m.to
                                              and ({s, m.to} & {n2, n3}))]
    c.step(n1, Receive(src=n2, message=t2))
    c.step(n2, Receive(src=n1, message=t1))
    c.step(n3, Receive(src=n1, message=t1))
    c.deliver()
    c.submit(make_tx("add y 1", client="c3"), to=(n1,))
    c.tick(ms=100, rounds=30)
    for node in (n1, n2, n3):
        st = c.nodes[node].core.status()
        assert st.committed == 1
        assert st.pending == 2
        assert c.nodes[node].app.data == {"y": b"1"}

"""Fetching unknown transactions, rule 3 (committed-but-unapplied conflict waits), submits
of decided transactions, the pending bound."""

from __future__ import annotations

from leaderless_harness import (
    EPOCH,
    KvApp,
    endorsement,
    make_tx,
    run,
    sent_endorsements,
    solo,
    submit_of,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    FetchTransactions,
    TransactionProof,
)
from phalanx.consensus.types import NodeId

N2, N3 = NodeId("n2"), NodeId("n3")


def test_endorsement_of_unknown_tx_fetches_it_and_proof_answers() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    ready = run(core, app, Receive(src=N3, message=endorsement("n3", tx)))
    # The fetch asks for the body alone (bit n+1 = 5 of `held.py`'s bitmap at n = 4).
    assert [(s.to, s.message) for s in ready.messages] == [
        (N3, FetchTransactions(tx_ids=(tx_id(tx),), held=b"\x20"))]
    # The peer's answer: the transaction with what it knows.
    proof = TransactionProof(tx=tx, endorsements=(endorsement("n2", tx),))
    run(core, app, Receive(src=N3, message=proof))
    assert core.status().committed == 1  # n1 + n2 + buffered n3
    assert app.data == {"x": b"1"}
    ready = run(core, app, Receive(src=N2, message=FetchTransactions(tx_ids=(tx_id(tx),))))
    (send,) = ready.messages
    assert send.to == N2
    assert isinstance(send.message, TransactionProof)
    assert send.message.tx == tx
    assert len(send.message.endorsements) == 3


class _SlowApp(KvApp):
    """Applies only when told (the driver lags)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[object] = []
        self.hold = True

    def apply(self, entry):  # type: ignore[no-untyped-def]
        if self.hold:
            self.held.append(entry)
        else:
            super().apply(entry)


def test_committed_but_unapplied_conflict_waits() -> None:
    app = _SlowApp()
    core, _ = solo(app=app)
    run(core, app, Tick(now_ms=EPOCH))
    t1 = make_tx("set x a", reqs={"x": version(None)})
    run(core, app, Receive(src=N2, message=t1))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, t1)))
    assert core.status().commit_index == 1
    assert app.applied() == 0  # released, not applied yet
    t2 = make_tx("set x b", client="c2", reqs={"x": version(b"a")})
    ready = run(core, app, Receive(src=N2, message=t2))
    assert not sent_endorsements(ready)
    app.hold = False
    for entry in app.held:
        app.apply(entry)  # type: ignore[arg-type]
    ready = run(core, app, Tick(now_ms=EPOCH + 1))
    (e,) = set(sent_endorsements(ready))
    assert isinstance(e, Endorsement)
    assert e.tx_id == tx_id(t2)
    assert e.conditions == ()


def test_submit_of_a_dropped_tx_aborts_and_of_a_pending_one_is_quiet() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("set x a", reqs={"x": version(b"no")}, deadline=EPOCH + 10)
    ready = run(core, app, submit_of(tx))
    assert ready.messages  # broadcast to the peers
    again = run(core, app, submit_of(tx))
    assert not again.rejected
    assert not again.aborted
    run(core, app, Tick(now_ms=EPOCH + 20))  # refuses
    ready = run(core, app, Receive(src=N2, message=_refusal("n2", tx)))
    ready = run(core, app, Receive(src=N3, message=_refusal("n3", tx)))
    (abort,) = ready.aborted
    assert abort.request == submit_of(tx).request
    ready = run(core, app, submit_of(tx))
    assert [a.request for a in ready.aborted] == [submit_of(tx).request]


def _refusal(node: str, tx: object):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from phalanx.consensus.crypto import FastCrypto
    from phalanx.consensus.leaderless.messages import Refusal

    body = Refusal(tx_id=tx_id(tx), endorser=NodeId(node))  # type: ignore[arg-type]
    return replace(body, signature=FastCrypto(NodeId(node)).sign(body))


def test_pending_bound_drops_and_counts() -> None:
    core, app = solo(max_pending=3)
    run(core, app, Tick(now_ms=EPOCH))
    for i in range(5):
        run(core, app, Receive(src=N2, message=make_tx(f"add k{i} 1", no=i + 1)))
    assert core.status().pending == 3
    assert core.status().dropped["overloaded"] == 2


def test_far_future_deadline_is_endorsed_only_once_within_the_lead() -> None:
    core, app = solo(max_deadline_lead_ms=1000)
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1", deadline=EPOCH + 1500)
    ready = run(core, app, Receive(src=N2, message=tx))
    assert not sent_endorsements(ready)
    ready = run(core, app, Tick(now_ms=EPOCH + 600))
    assert {e.tx_id for e in sent_endorsements(ready)} == {tx_id(tx)}


def test_a_node_cut_off_for_long_catches_up_from_digests() -> None:
    from leaderless_harness import Cluster

    c = Cluster(4, rebroadcast_ticks=2)
    n4 = c.ids[3]
    c.down.add(n4)
    c.tick()
    for i in range(3):
        c.submit(make_tx(f"add x {i + 1}", no=i + 1))
    c.tick(rounds=10)  # well past the re-push window of two periods
    assert c.nodes[n4].app.data == {}
    c.down.discard(n4)
    c.tick(rounds=8)
    assert c.nodes[n4].app.data == {"x": b"6"}
    assert c.nodes[n4].core.status().committed == 3


def test_a_node_that_missed_the_refusals_gets_the_abort_certificate() -> None:
    from leaderless_harness import Cluster

    c = Cluster(4, rebroadcast_ticks=2)
    n4 = c.ids[3]
    c.tick()
    tx = make_tx("set x a", reqs={"x": version(b"no")}, deadline=EPOCH + 250)
    c.submit(tx)
    c.deliver()
    c.down.add(n4)  # n4 knows the transaction but hears no refusal
    c.tick(rounds=6)
    assert all(c.nodes[n].core.status().dropped_txs == 1 for n in c.ids[:3])
    assert c.nodes[n4].core.status().pending == 1
    c.down.discard(n4)
    c.tick(rounds=4)  # n4 asks about its overdue transaction: the certificate answers
    assert c.nodes[n4].core.status().dropped_txs == 1
    assert c.nodes[n4].core.status().pending == 0
    assert [a.request.client_id for a in c.nodes[n4].aborted] == ["c1"]

"""A node that lost its record counts its own lost signatures that come back in its peers'
messages (issue 15, `phalanx sim --protocol leaderless --seed-start 0 --seeds 1 --nodes 7
--bug no_state_transfer`): a commit certificate (or an abort certificate) whose quorum
needs the amnesiac node's own pre-loss endorsement (refusal) commits (drops) there too,
verified like a peer's. Before, the core skipped every endorsement and refusal in its own
name as "our own, echoed back", so such a transaction stayed pending there forever and
every later write of its keys waited at the version gate."""

from __future__ import annotations

from dataclasses import replace

from leaderless_harness import EPOCH, endorsement, make_tx, run, solo, tx_id, version

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import Refusal, Transaction, TransactionProof
from phalanx.consensus.types import NodeId

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def _refusal(node: NodeId, tx: Transaction, *, signer: NodeId | None = None) -> Refusal:
    body = Refusal(tx_id=tx_id(tx), endorser=node)
    return replace(body, signature=FastCrypto(signer or node).sign(body))


def test_a_certificate_needing_the_lost_own_endorsement_commits() -> None:
    """n1 endorsed `set x 1` before it lost its disk; n2 and n3 endorsed it too (Q = 3 of
    4). The restarted, fenced n1 fetches the certificate {n1, n2, n3}: it commits and
    applies it, so a later write requiring x = 1 is not held at the gate forever."""
    core, app = solo(recovering=True)
    run(core, app, Tick(now_ms=EPOCH))
    first = make_tx("set x 1", reqs={"x": version(None)}, deadline=EPOCH + 1000)
    proof = TransactionProof(tx=first, endorsements=tuple(
        endorsement(n, first) for n in ("n1", "n2", "n3")))
    run(core, app, Receive(src=N2, message=proof))
    assert app.data == {"x": b"1"}
    second = make_tx("set x 2", client="c2", reqs={"x": version(b"1")}, deadline=EPOCH + 1000)
    run(core, app, Receive(src=N2, message=TransactionProof(tx=second, endorsements=tuple(
        endorsement(n, second) for n in ("n2", "n3", "n4")))))
    assert app.data == {"x": b"2"}
    assert core.status().gated == 0


def test_a_forged_own_endorsement_does_not_count() -> None:
    """The control: an endorsement in n1's name signed by n2 is dropped as forged, and
    two honest endorsements stay below Q."""
    core, app = solo(recovering=True)
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("set x 1", reqs={"x": version(None)}, deadline=EPOCH + 1000)
    forged = replace(endorsement("n1", tx), signature=endorsement("n2", tx).signature)
    run(core, app, Receive(src=N2, message=TransactionProof(
        tx=tx, endorsements=(forged, endorsement("n2", tx), endorsement("n3", tx)))))
    assert app.data == {}
    assert core.status().committed == 0
    assert core.status().dropped.get("bad_endorsement_signature") == 1


def test_an_abort_certificate_needing_the_lost_own_refusal_drops() -> None:
    """n1 refused T before it lost its disk; with n2's and n3's refusals that is the abort
    certificate (2f+1 = 3 at n = 4): the fenced n1 drops T as the others did. A refusal in
    n1's name signed by another node is not tallied."""
    for signer, dropped in ((N1, 1), (N2, 0)):
        core, app = solo(recovering=True)
        run(core, app, Tick(now_ms=EPOCH))
        tx = make_tx("set x 1", reqs={"x": version(None)}, deadline=EPOCH + 100)
        run(core, app, Receive(src=N2, message=tx))
        run(core, app, Tick(now_ms=EPOCH + 200))
        proof = TransactionProof(tx=tx, refusals=(
            _refusal(N1, tx, signer=signer), _refusal(N2, tx), _refusal(N3, tx)))
        run(core, app, Receive(src=N2, message=proof))
        assert core.status().dropped_txs == dropped, signer

"""The leaderless hot path: re-sent input costs no signature check, a tick touches only what
came due, own signatures are re-sent at a backoff, and a commit certificate commits past an
equivocating endorser."""

from __future__ import annotations

import itertools

from leaderless_harness import EPOCH, endorsement, make_tx, run, sent_endorsements, solo, tx_id

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import TransactionProof
from phalanx.consensus.types import NodeId

N2, N3, N4 = NodeId("n2"), NodeId("n3"), NodeId("n4")


class CountingCrypto(FastCrypto):
    verifies = 0

    def verify(self, signer: NodeId, message: object, signature: bytes) -> bool:
        CountingCrypto.verifies += 1
        return super().verify(signer, message, signature)


def test_a_re_sent_endorsement_is_a_duplicate_before_any_signature_check() -> None:
    core, app = solo()
    core._crypto = CountingCrypto(NodeId("n1"))  # what the core verifies peers' input with
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    e = endorsement("n2", tx)
    run(core, app, Receive(src=N2, message=e))
    before = CountingCrypto.verifies
    for _ in range(5):
        run(core, app, Receive(src=N2, message=e))
    run(core, app, Receive(src=N3, message=TransactionProof(tx=tx, endorsements=(e,))))
    assert CountingCrypto.verifies == before
    assert core.status().duplicate["duplicate_endorsement"] == 6
    assert "bad_endorsement_signature" not in core.status().dropped


def test_an_endorsement_after_the_commit_costs_no_signature_check() -> None:
    """Q = 3 of 4: own + two peers commit; the third peer's endorsement arrives after the
    commit and changes nothing, so it is not verified (a third of the checks)."""
    core, app = solo()
    core._crypto = CountingCrypto(NodeId("n1"))
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    for node in (N2, N3):
        run(core, app, Receive(src=node, message=endorsement(node, tx)))
    assert app.data == {"x": b"1"}
    before = CountingCrypto.verifies
    run(core, app, Receive(src=N4, message=endorsement(N4, tx)))
    assert CountingCrypto.verifies == before
    assert core.status().duplicate["decided_endorsement"] == 1
    assert not core.status().dropped


def test_own_endorsements_are_re_sent_at_a_doubling_backoff_while_pending() -> None:
    core, app = solo(rebroadcast_ticks=2)
    tx = make_tx("add x 1", deadline=EPOCH + 10**5)
    run(core, app, Tick(now_ms=EPOCH))
    run(core, app, Receive(src=N2, message=tx))
    sent_at = []
    for t in range(1, 40):
        ready = run(core, app, Tick(now_ms=EPOCH + t))
        if any(e.endorser == "n1" for e in sent_endorsements(ready)):
            sent_at.append(t + 1)  # the core's tick count
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert gaps[:3] == [4, 8, 16]  # 2, 4, 8 periods of 2 ticks
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, tx)))
    assert app.data == {"x": b"1"}
    quiet = [run(core, app, Tick(now_ms=EPOCH + 100 + t)) for t in range(60)]
    assert not any(e.tx_id == tx_id(tx)
                   for r in quiet[10:] for e in sent_endorsements(r))  # committed: no more re-sends


def test_a_commit_certificate_commits_past_an_equivocating_endorser() -> None:
    """The sim's gap (docs/LEADERLESS.md, simulation): n2 sent this node an endorsement
    conditioned on an unknown id and the others an unconditional one; they committed.
    The fetched certificate commits here too."""
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    run(core, app, Receive(src=N2, message=endorsement("n2", tx, (b"\x01" * 32,))))
    run(core, app, Receive(src=N3, message=endorsement("n3", tx)))
    assert app.data == {}
    certificate = TransactionProof(tx=tx, endorsements=(
        endorsement("n2", tx), endorsement("n3", tx), endorsement("n4", tx)))
    run(core, app, Receive(src=N4, message=certificate))
    assert app.data == {"x": b"1"}
    forged = TransactionProof(tx=make_tx("add x 2", no=2), endorsements=(
        endorsement("n2", tx), endorsement("n3", tx), endorsement("n4", tx)))
    run(core, app, Receive(src=N4, message=forged))  # endorsements of another tx: no commit
    assert app.data == {"x": b"1"}

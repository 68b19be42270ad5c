"""Cheaper endorsement traffic (docs/LEADERLESS.md "Round 5"): a peer's batch whose items
are all decided here is dropped item by item before its Merkle tree is built or its
signature checked, and an own endorsement of a transaction committed here is re-pushed
as the batch it was signed in (~45 bytes an item) rather than alone with its path (~250)."""

from __future__ import annotations

import pytest
from leaderless_harness import EPOCH, make_tx, run, solo, submit_of, tx_id

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless import intake
from phalanx.consensus.leaderless.batching import SubmitBatch
from phalanx.consensus.leaderless.endorsement_batch import batch_of, sign_batch
from phalanx.consensus.leaderless.messages import EndorsementBatch, SignatureResend
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


class CountingCrypto(FastCrypto):
    def __init__(self, node: NodeId) -> None:
        super().__init__(node)
        self.verified = 0

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        self.verified += 1
        return super().verify(node, obj, signature)


def test_a_batch_of_transactions_decided_here_is_dropped_without_hashing_or_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    txs = [make_tx(f"add z{i} 1", no=i + 1) for i in range(3)]
    run(core, app, SubmitBatch(requests=tuple(submit_of(t).request for t in txs)))
    for node in (N2, N3):  # with n1's own: Q = 3, all three commit
        batch = batch_of(sign_batch(FastCrypto(node), node, [(tx_id(t), ()) for t in txs]))
        run(core, app, Receive(src=node, message=batch))
    assert core.status().committed == 3
    late = batch_of(sign_batch(FastCrypto(N4), N4, [(tx_id(t), ()) for t in txs]))
    crypto = CountingCrypto(N1)
    core._crypto = crypto

    def no_expand(batch: EndorsementBatch) -> None:
        raise AssertionError("expanded a batch with nothing new in it")

    monkeypatch.setattr(intake, "expand", no_expand)
    run(core, app, Receive(src=N4, message=late))
    assert crypto.verified == 0
    assert core.status().duplicate.get("decided_endorsement") == 3
    assert core.status().dropped == {}


def test_own_endorsements_of_committed_transactions_are_re_pushed_as_their_batch() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    txs = [make_tx(f"add w{i} 1", no=i + 1) for i in range(5)]
    ready = run(core, app, SubmitBatch(requests=tuple(submit_of(t).request for t in txs)))
    sent = [s.message for s in ready.messages if isinstance(s.message, EndorsementBatch)]
    assert len(sent) == 3
    assert len(set(sent)) == 1
    own = sent[0]
    for node in (N2, N3):
        batch = batch_of(sign_batch(FastCrypto(node), node, [(tx_id(t), ()) for t in txs]))
        run(core, app, Receive(src=node, message=batch))
    assert core.status().committed == 5
    later = []
    for t in range(1, 2 * core._config.rebroadcast_ticks + 1):
        later += run(core, app, Tick(now_ms=EPOCH + 10 * t)).messages
    pushed = [s for s in later if isinstance(s.message, EndorsementBatch)]
    assert sorted(s.to for s in pushed) == [N2, N3, N4]  # once, to every peer
    assert all(s.message == own for s in pushed)
    resent = {e.tx_id for s in later if isinstance(s.message, SignatureResend)
              for e in s.message.endorsements}
    assert not resent & {tx_id(t) for t in txs}

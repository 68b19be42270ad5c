"""Batch-signed endorsements (`endorsement_batch.py`): the Merkle format, one signature check
per batch, and hostile batches dropped and counted (forged, a transaction not in the batch,
a non-member's, malformed, replayed)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import (
    EPOCH,
    client_keys,
    endorsement,
    make_tx,
    run,
    sent_endorsements,
    solo,
    submit_of,
    tx_id,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.checks import ProofChecker
from phalanx.consensus.leaderless.endorsement_batch import (
    VerifiedRoots,
    batch_of,
    endorsement_problem,
    expand,
    sign_batch,
    sign_one,
)
from phalanx.consensus.leaderless.messages import (
    EndorsedTx,
    EndorsementBatch,
    TransactionProof,
)
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))
NODES = (N1, N2, N3, N4)
IDS = st.binary(min_size=32, max_size=32)


class CountingCrypto(FastCrypto):
    """FastCrypto that counts signature checks."""

    def __init__(self, node: NodeId) -> None:
        super().__init__(node)
        self.verified = 0

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        self.verified += 1
        return super().verify(node, obj, signature)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(IDS, st.lists(IDS, max_size=3, unique=True)), min_size=1,
                max_size=40, unique_by=lambda item: item[0]))
def test_every_item_verifies_alone_and_the_batch_expands_to_the_signed_ones(
        items: list[tuple[bytes, list[bytes]]]) -> None:
    plain = [(t, tuple(sorted(c for c in cs if c != t))) for t, cs in items]
    signed = sign_batch(FastCrypto(N2), N2, plain)
    assert len({e.signature for e in signed}) == 1  # one signature for all
    crypto, roots = CountingCrypto(N1), VerifiedRoots()
    assert all(endorsement_problem(e, NODES, crypto, roots) is None for e in signed)
    assert crypto.verified == 1  # the root, once
    expanded = expand(batch_of(signed))
    assert expanded is not None
    assert expanded[1] == signed
    # Any item moved to another position, or given other conditions, no longer verifies.
    if len(signed) > 1:
        moved = dataclasses.replace(signed[0], index=1)
        assert endorsement_problem(moved, NODES, FastCrypto(N1)) == "bad_endorsement_signature"
    other = dataclasses.replace(signed[0], conditions=(b"\xff" * 32,))
    assert endorsement_problem(other, NODES, FastCrypto(N1)) is not None


def _known(core_node: str = "n1"):  # type: ignore[no-untyped-def]
    core, app = solo(core_node)
    run(core, app, Tick(now_ms=EPOCH))
    txs = [make_tx(f"add x{i} 1", no=i + 1) for i in range(3)]
    for tx in txs:
        run(core, app, submit_of(tx))
    return core, app, txs


def test_one_batch_commits_every_item_with_one_signature_check() -> None:
    core, app, txs = _known()
    crypto = CountingCrypto(N1)
    core._crypto = crypto  # count what intake verifies
    for node in (N2, N3):
        batch = batch_of(sign_batch(FastCrypto(node), node, [(tx_id(t), ()) for t in txs]))
        run(core, app, Receive(src=node, message=batch))
    assert crypto.verified == 2  # one per batch, not one per endorsement
    assert core.status().committed == 3
    assert app.data == {"x0": b"1", "x1": b"1", "x2": b"1"}


def test_a_pass_of_submits_is_one_signature_and_one_batch_per_peer() -> None:
    from phalanx.consensus.leaderless.batching import SubmitBatch

    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    txs = [make_tx(f"add y{i} 1", no=i + 1) for i in range(5)]
    ready = run(core, app, SubmitBatch(requests=tuple(submit_of(t).request for t in txs)))
    batches = [s.message for s in ready.messages if isinstance(s.message, EndorsementBatch)]
    assert len(batches) == 3
    assert len(ready.messages) == 3
    assert {e.tx_id for e in sent_endorsements(ready)} == {tx_id(t) for t in txs}
    assert ready.must_sync
    assert ready.core_state is not None
    assert {e.tx_id for e in ready.core_state.endorsed} == {tx_id(t) for t in txs}


def test_a_forged_batch_is_dropped_once_and_changes_nothing() -> None:
    core, app, txs = _known()
    forged = batch_of(sign_batch(FastCrypto(N4), N2, [(tx_id(t), ()) for t in txs]))
    run(core, app, Receive(src=N4, message=forged))
    tampered = dataclasses.replace(
        batch_of(sign_batch(FastCrypto(N2), N2, [(tx_id(t), ()) for t in txs])),
        items=(EndorsedTx(tx_id=tx_id(txs[0]), conditions=(tx_id(txs[1]),)),
               *[EndorsedTx(tx_id=tx_id(t)) for t in txs[1:]]))
    run(core, app, Receive(src=N2, message=tampered))
    assert core.status().dropped == {"bad_endorsement_batch_signature": 2}
    assert all(sorted(core._store.get(tx_id(t)).endorsements) == [N1] for t in txs)


def test_an_endorsement_of_a_tx_not_in_the_batch_is_dropped_and_proves_nothing() -> None:
    core, app, txs = _known()
    genuine = sign_batch(FastCrypto(N2), N2, [(tx_id(t), ()) for t in txs[:2]])
    grafted = dataclasses.replace(genuine[0], tx_id=tx_id(txs[2]))  # its path, another tx
    run(core, app, Receive(src=N2, message=grafted))
    assert core.status().dropped == {"bad_endorsement_signature": 1}
    assert sorted(core._store.get(tx_id(txs[2])).endorsements) == [N1]
    check = ProofChecker(nodes=NODES, crypto=FastCrypto(N1), client_keys=client_keys(),
                         quorum_for=lambda _p: 3, tx_id=tx_id)
    tx = txs[2]
    honest = (endorsement("n1", tx), endorsement("n3", tx))
    assert check(TransactionProof(tx=tx, endorsements=(*honest, endorsement("n2", tx))))
    assert not check(TransactionProof(tx=tx, endorsements=(*honest, grafted)))


def test_a_non_members_or_malformed_batch_is_dropped_and_counted() -> None:
    core, app, txs = _known()
    outsider = NodeId("n9")
    run(core, app, Receive(src=N2, message=batch_of(
        sign_batch(FastCrypto(outsider), outsider, [(tx_id(txs[0]), ())]))))
    run(core, app, Receive(src=N2, message=EndorsementBatch(endorser=N2, items=())))
    unsorted = EndorsementBatch(endorser=N2, items=(
        EndorsedTx(tx_id=tx_id(txs[0]), conditions=(b"\x02" * 32, b"\x01" * 32)),))
    run(core, app, Receive(src=N2, message=unsorted))
    deep = dataclasses.replace(sign_one(FastCrypto(N2), N2, tx_id(txs[0])), index=1)
    run(core, app, Receive(src=N2, message=deep))  # index beyond its (empty) path
    assert core.status().dropped == {"unknown_endorser": 1, "malformed_endorsement_batch": 2,
                                     "malformed_endorsement": 1}


def test_a_replayed_batch_is_counted_as_duplicates_without_a_signature_check() -> None:
    core, app, txs = _known()
    batch = batch_of(sign_batch(FastCrypto(N2), N2, [(tx_id(t), ()) for t in txs]))
    run(core, app, Receive(src=N2, message=batch))
    crypto = CountingCrypto(N1)
    core._crypto = crypto
    before = {t: dict(core._store.get(tx_id(t)).endorsements) for t in txs}
    run(core, app, Receive(src=N3, message=batch))  # replayed by another node
    assert crypto.verified == 0
    assert core.status().duplicate == {"duplicate_endorsement": 3}
    assert core.status().dropped == {}
    assert {t: dict(core._store.get(tx_id(t)).endorsements) for t in txs} == before

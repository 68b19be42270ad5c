"""The block-certifier's durable store and its peer-input handling, without a network.

A torn or corrupt tail never loads (every cut of the last record), appends continue after
the last whole record; the store is bounded; duplicates are ignored. The service drops and
counts what peers send that is not a valid signature, and answers certificate queries."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from chain_helpers import CHAIN_ID, NODE_KEYS, NODE_SECRETS, QUORUM
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.certificate import (
    BlockCertificate,
    BlockCertifier,
    BlockSignature,
    ed25519_signer,
    sign_block,
)
from phalanx.consensus.types import Message, NodeId
from phalanx.services.block_cert_api import CertificateAnswer, CertificateQuery
from phalanx.services.block_cert_fetch import CertificateFetcher
from phalanx.services.block_cert_store import CertificateStore
from phalanx.services.block_certifier import BlockCertifierService


def cert(height: int) -> BlockCertificate:
    block = height.to_bytes(32, "big")
    return BlockCertificate(height=height, block_hash=block,
                            signatures=(("n1", bytes(64)), ("n2", bytes([height % 256]) * 64)))


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.log"))


def test_put_get_reopen_and_duplicates(tmp_path: Path) -> None:
    store = CertificateStore(tmp_path)
    assert store.put(cert(1))
    assert store.put(cert(3))
    assert not store.put(cert(1))
    store.close()
    again = CertificateStore(tmp_path)
    assert again.get(1) == cert(1)
    assert again.get(3) == cert(3)
    assert again.get(2) is None
    assert len(again) == 2
    assert again.newest == 3
    assert again.torn == 0


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(min_value=1, max_value=200), flip=st.booleans())
def test_a_torn_or_corrupt_last_record_never_loads(cut: int, flip: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        torn_last_record(Path(d), cut, flip)


def torn_last_record(directory: Path, cut: int, flip: bool) -> None:
    store = CertificateStore(directory)
    for h in (1, 2, 3):
        store.put(cert(h))
    store.close()
    path = segments(directory)[-1]
    data = path.read_bytes()
    size = len(data) // 3  # records are the same size here
    if flip:  # a flipped byte inside the last record
        i = 2 * size + (cut % size)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    else:  # the last record cut short (a torn write)
        path.write_bytes(data[:len(data) - 1 - (cut % size)])
    loaded = CertificateStore(directory)
    assert loaded.get(3) is None
    assert loaded.get(1) == cert(1)
    assert loaded.get(2) == cert(2)
    assert loaded.torn == 1
    assert path.stat().st_size == 2 * size
    assert loaded.put(cert(4))  # appends continue after the last whole record
    loaded.close()
    final = CertificateStore(directory)
    assert final.get(4) == cert(4)
    assert final.torn == 0


def test_bounded_to_keep_plus_one_segment(tmp_path: Path) -> None:
    store = CertificateStore(tmp_path, keep=10, segment_records=4)
    for h in range(1, 101):
        store.put(cert(h))
        assert len(store) <= 10 + 4
    assert store.get(100) == cert(100)
    assert store.get(1) is None
    assert len(segments(tmp_path)) <= 4
    store.close()
    assert len(CertificateStore(tmp_path, keep=10, segment_records=4)) == len(store)


def service(tmp_path: Path) -> tuple[BlockCertifierService, list[tuple[NodeId, Message]]]:
    sent: list[tuple[NodeId, Message]] = []

    def send(peer: NodeId, message: Message) -> bool:
        sent.append((peer, message))
        return True

    certifier = BlockCertifier(node="n0", sign=ed25519_signer(NODE_SECRETS["n0"]),
                               chain_id=CHAIN_ID, node_keys=NODE_KEYS, quorum=QUORUM)
    peers = tuple(NodeId(n) for n in sorted(NODE_KEYS) if n != "n0")
    fetcher = CertificateFetcher(peers=peers, node_keys=NODE_KEYS, quorum=QUORUM,
                                 chain_id=CHAIN_ID, keep=100)
    return BlockCertifierService(certifier, CertificateStore(tmp_path), peers=peers,
                                 send=send, tick_seconds=0.1, stream=None,
                                 fetcher=fetcher), sent


def test_the_service_signs_sends_certifies_and_drops_bad_peer_input(tmp_path: Path) -> None:
    svc, sent = service(tmp_path)
    block = random.Random(7).randbytes(32)
    svc.on_block(1, block)
    assert [p for p, _ in sent] == sorted(NodeId(n) for n in NODE_KEYS if n != "n0")
    assert all(isinstance(m, BlockSignature) and m.node == "n0" for _, m in sent)
    good = [sign_block(node=n, chain_id=CHAIN_ID, height=1, block_hash=block,
                       sign=ed25519_signer(NODE_SECRETS[n])) for n in ("n1", "n2")]
    forged = BlockSignature(chain_id=CHAIN_ID, height=1, block_hash=block, node="n3",
                            signature=bytes(64))
    svc.receive(NodeId("n3"), forged)
    svc.receive(NodeId("n3"), CertificateQuery(height=1))  # not a signature at all
    assert svc.store.get(1) is None
    for sig in good:
        svc.receive(NodeId(sig.node), sig)
    stored = svc.store.get(1)
    assert stored is not None
    assert [n for n, _ in stored.signatures] == ["n0", "n1", "n2"]
    counters = svc.counters()
    assert counters["dropped:bad_signature"] == 1
    assert counters["dropped:malformed"] == 1
    assert counters["stored"] == 1
    assert svc.gauges()["certificates_stored"] == 1
    answer = svc.call(CertificateQuery(height=0))
    assert isinstance(answer, CertificateAnswer)
    assert answer.height == 1
    assert answer.certificate == stored
    assert answer.quorum == QUORUM
    svc.close()
    assert CertificateStore(tmp_path).get(1) == stored


def test_a_node_that_caught_up_by_state_transfer_collects_around_its_new_height() -> None:
    """A checkpoint restore or state transfer closes no block: `reached` moves the window
    (the service calls it every tick), else peers' signatures of new blocks drop as ahead."""
    certifier = BlockCertifier(node="n0", sign=ed25519_signer(NODE_SECRETS["n0"]),
                               chain_id=CHAIN_ID, node_keys=NODE_KEYS, quorum=QUORUM,
                               window=16)
    block = bytes(range(32))
    sigs = [sign_block(node=n, chain_id=CHAIN_ID, height=300, block_hash=block,
                       sign=ed25519_signer(NODE_SECRETS[n])) for n in ("n1", "n2", "n3")]
    assert certifier.add(sigs[0]) is None
    assert certifier.dropped == {"ahead": 1}
    certifier.reached(299)
    assert certifier.add(sigs[0]) is None
    assert certifier.add(sigs[1]) is None
    cert = certifier.add(sigs[2])
    assert cert is not None
    assert [n for n, _ in cert.signatures] == ["n1", "n2", "n3"]

"""Block certificates: signing, collecting a quorum (`BlockCertifier`), verifying."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import pytest
from chain_helpers import CHAIN_ID, NODE_KEYS, NODE_SECRETS, NODES, QUORUM, certify
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.block import BlockHeader, block_hash
from phalanx.apps.chain.certificate import (
    BlockCertificate,
    BlockCertifier,
    BlockSignature,
    attach,
    byzantine_certificate_quorum,
    certificate_of,
    crash_certificate_quorum,
    decode_certificate,
    ed25519_signer,
    encode_certificate,
    sign_block,
    verify_certificate,
    verify_header,
)
from phalanx.net.wire import default_registry

OTHER_CHAIN = hashlib.sha256(b"another chain").digest()


def _header(height: int, fork: int = 0) -> BlockHeader:
    """Block `height` (fork 0) or a conflicting block at the same height (fork 1, 2...)."""
    return BlockHeader(height=height, prev_hash=bytes([height]) * 32,
                       tx_root=hashlib.sha256(bytes([height, fork])).digest(),
                       state_root=bytes(32), timestamp=height, proposer="n0")


def _sig(node: str, header: BlockHeader, *, key: str | None = None, chain: bytes = CHAIN_ID,
         height: int | None = None) -> BlockSignature:
    """`node`'s signature of `header`; `key` signs instead (a forgery), `height` relabels."""
    sig = sign_block(node=node, chain_id=chain, height=header.height,
                     block_hash=block_hash(header), sign=NODE_SECRETS[key or node].sign)
    return sig if height is None else dataclasses.replace(sig, height=height)


def _certifier(node: str = "n0", quorum: int = QUORUM, window: int = 8) -> BlockCertifier:
    return BlockCertifier(node=node, sign=ed25519_signer(NODE_SECRETS[node]), chain_id=CHAIN_ID,
                          node_keys=NODE_KEYS, quorum=quorum, window=window)


def _verifies(cert: object, header: BlockHeader, quorum: int = QUORUM) -> bool:
    return verify_certificate(cert, header, NODE_KEYS, quorum, chain_id=CHAIN_ID)


def test_quorums_follow_the_fault_model() -> None:
    assert [byzantine_certificate_quorum(n) for n in (1, 4, 5, 7)] == [1, 3, 4, 5]
    assert [crash_certificate_quorum(n) for n in (1, 3, 4, 5)] == [1, 2, 3, 3]


def test_a_quorum_of_signatures_makes_a_certificate_that_verifies() -> None:
    h = _header(1)
    c = _certifier()
    assert c.add(_sig("n3", h)) is None
    assert c.add(_sig("n1", h)) is None
    own, cert = c.local_block(1, block_hash(h))
    assert own == _sig("n0", h)
    assert cert is not None
    assert [n for n, _ in cert.signatures] == ["n0", "n1", "n3"]
    assert _verifies(cert, h)
    assert c.certificate(1) == cert
    assert c.add(_sig("n2", h)) is None  # one certificate per height
    assert c.dropped == {"late": 1}
    assert c.divergent == 0
    # it travels in the header without changing the block hash
    attached = attach(h, cert)
    assert block_hash(attached) == block_hash(h)
    assert certificate_of(attached) == cert
    assert verify_header(attached, NODE_KEYS, QUORUM, chain_id=CHAIN_ID)
    assert default_registry().decode(encode_certificate(cert)) == cert
    with pytest.raises(ValueError, match="another block"):
        attach(_header(1, fork=1), cert)


def test_bad_signatures_are_dropped_and_counted() -> None:
    h = _header(2)
    c = _certifier()
    c.local_block(1, block_hash(_header(1)))
    bad = [
        _sig("n1", h, key="n2"),                      # forged: n2's key, n1's name
        _sig("n1", h, height=3),                      # signed for 2, claims 3
        _sig("n1", h, chain=OTHER_CHAIN),             # another chain
        dataclasses.replace(_sig("n1", h), node="n9"),  # unknown node
        _sig("n1", _header(20)),                      # beyond the window (local 1 + 8)
        "not a signature",
        dataclasses.replace(_sig("n1", h), block_hash=b"short"),
    ]
    for sig in bad:
        assert c.add(sig) is None
    assert c.dropped == {"bad_signature": 2, "wrong_chain": 1, "unknown_node": 1, "ahead": 1,
                         "malformed": 2}
    assert c.add(_sig("n1", h)) is None
    assert c.add(_sig("n1", h)) is None
    assert c.add(_sig("n1", _header(2, fork=1))) is None  # n1 equivocates
    assert c.dropped["duplicate"] == 1
    assert c.dropped["equivocation"] == 1
    assert c.add(_sig("n2", h)) is None  # 2 of 3: still nothing
    cert = c.add(_sig("n3", h))
    assert cert is not None
    assert _verifies(cert, h)


def test_memory_stays_bounded_whatever_peers_send() -> None:
    c = _certifier(window=4)
    for height in range(1, 200):
        c.local_block(height, block_hash(_header(height)))
        for node in NODES[1:]:
            c.add(_sig(node, _header(height + 3)))  # in the window: kept until certified
        assert c.held <= 3 * (2 * 4 + 1) * len(NODES)  # 200 heights: ~1,400 unpruned
    assert c.certificate(199) is not None
    assert c.certificate(100) is None  # forgotten: behind the window
    assert c.add(_sig("n1", _header(100))) is None
    assert c.dropped["stale"] >= 1
    with pytest.raises(ValueError, match="again"):
        c.local_block(199, block_hash(_header(199, fork=1)))


# --- property tests --------------------------------------------------------------------

HEIGHTS = (1, 2)
FORKS = (0, 1)
_KINDS = ("valid", "forged", "relabelled", "wrong_chain")


def _message(kind: str, node: str, height: int, fork: int) -> BlockSignature:
    h = _header(height, fork)
    if kind == "valid":
        return _sig(node, h)
    if kind == "forged":
        return _sig(node, h, key=NODES[(NODES.index(node) + 1) % len(NODES)])
    if kind == "relabelled":  # a valid signature of the other height, relabelled
        other = _header(3 - height, fork)
        return dataclasses.replace(_sig(node, other), height=height)
    return _sig(node, h, chain=OTHER_CHAIN)


_MESSAGES = st.lists(st.tuples(st.sampled_from(_KINDS), st.sampled_from(NODES),
                               st.sampled_from(HEIGHTS), st.sampled_from(FORKS)), max_size=30)


@settings(max_examples=80, deadline=None)
@given(_MESSAGES)
def test_only_valid_signatures_of_distinct_nodes_ever_count(
        messages: list[tuple[str, str, int, int]]) -> None:
    c = _certifier(node="n0")
    first_valid: dict[tuple[int, str], int] = {}  # (height, node) -> the fork it signed first
    for kind, node, height, fork in messages:
        cert = c.add(_message(kind, node, height, fork))
        if kind == "valid":
            first_valid.setdefault((height, node), fork)
        if cert is not None:
            assert _verifies(cert, _header(height, fork))
            assert not _verifies(cert, _header(height, 1 - fork))
            signers = {n for n, _ in cert.signatures}
            assert len(signers) == QUORUM
            assert all(first_valid.get((height, n)) == fork for n in signers)
    for height in HEIGHTS:
        cert = c.certificate(height)
        if cert is None:  # no quorum of first valid signatures for either fork
            assert all(sum(first_valid.get((height, n)) == f for n in NODES) < QUORUM
                       for f in FORKS)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(NODES[1:]), max_size=12), st.randoms(use_true_random=False))
def test_one_byzantine_node_signing_both_forks_never_certifies_the_fork(
        honest: list[str], rng: random.Random) -> None:
    """n0 is Byzantine and signs both blocks at height 1; honest nodes sign block 0 only."""
    msgs = [_sig("n0", _header(1, 1)), _sig("n0", _header(1, 0))]
    msgs += [_sig(n, _header(1, 0)) for n in honest]
    msgs += [_sig("n0", _header(1, 1), key=n) for n in NODES[1:]]  # n0 forges the others
    rng.shuffle(msgs)
    c = _certifier(node="n1")
    for m in msgs:
        cert = c.add(m)
        assert cert is None or cert.block_hash == block_hash(_header(1, 0))


def _full_cert(header: BlockHeader) -> BlockCertificate:
    cert = certificate_of(certify(header, NODES))
    assert cert is not None
    return cert


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["drop", "duplicate", "forge", "unsort", "height", "hash", "unknown",
                        "chain", "swap"]),
       st.integers(0, 3), st.integers(1, 4))
def test_a_tampered_or_short_certificate_never_verifies(
        how: str, index: int, quorum: int) -> None:
    header = _header(2)
    cert = _full_cert(header)
    assert _verifies(cert, header, quorum)
    sigs = list(cert.signatures)
    node, sig = sigs[index]
    chain = CHAIN_ID
    target = header
    if how == "drop":  # below quorum
        sigs = sigs[:quorum - 1]
    elif how == "duplicate":  # one node twice, to reach the quorum
        sigs = sorted([*sigs[:max(quorum - 1, 1)], sigs[0]])
    elif how == "forge":
        sigs[index] = (node, bytes([sig[0] ^ 1]) + sig[1:])
    elif how == "unsort":
        sigs.reverse()
    elif how == "height":  # a valid certificate of height 2, claimed for height 1
        target = _header(1)
        cert = dataclasses.replace(cert, height=1, block_hash=block_hash(target))
    elif how == "hash":  # a certificate of another block at the same height
        target = _header(2, fork=1)
    elif how == "unknown":
        sigs[index] = ("n9", sig)
        sigs.sort()
    elif how == "chain":
        chain = OTHER_CHAIN
    else:  # signatures from the other height's certificate
        target = _header(1)
        cert = dataclasses.replace(_full_cert(target), signatures=cert.signatures)
    tampered = dataclasses.replace(cert, signatures=tuple(sigs))
    assert not verify_certificate(tampered, target, NODE_KEYS, quorum, chain_id=chain)


@given(st.binary(max_size=200))
def test_decoding_junk_never_raises(data: bytes) -> None:
    cert = decode_certificate(data)
    assert cert is None or not _verifies(cert, _header(1))
    header = dataclasses.replace(_header(1), consensus_proof=data)
    assert not verify_header(header, NODE_KEYS, QUORUM, chain_id=CHAIN_ID)


def test_a_meaningless_quorum_is_our_misuse() -> None:
    cert = _full_cert(_header(1))
    for quorum in (0, 5):
        with pytest.raises(ValueError, match="quorum"):
            verify_certificate(cert, _header(1), NODE_KEYS, quorum, chain_id=CHAIN_ID)
        with pytest.raises(ValueError, match="quorum"):
            _certifier(quorum=quorum)
    assert not verify_certificate("junk", _header(1), NODE_KEYS, 1, chain_id=CHAIN_ID)
    assert not verify_certificate(cert, "junk", NODE_KEYS, 1, chain_id=CHAIN_ID)

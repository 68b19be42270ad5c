"""Ed25519Crypto and FastCrypto: round trips, forgery and mutation rejection; a PBFT round
with real keys and the codec's canonical bytes."""

from __future__ import annotations

import dataclasses

import pytest
from pbft_harness import Cluster, req

from phalanx.consensus.crypto import FastCrypto, digest_of, repr_encoding
from phalanx.consensus.pbft.core import PbftCore
from phalanx.consensus.pbft.messages import Commit, Prepare, signed_part
from phalanx.consensus.pbft.view_change import check_prepared_proof
from phalanx.consensus.types import NodeId
from phalanx.net.crypto import ed25519_cluster

NODES = (NodeId("n0"), NodeId("n1"), NodeId("n2"), NodeId("n3"))


def _cryptos(kind: str) -> dict[NodeId, object]:
    if kind == "fast":
        return {n: FastCrypto(n) for n in NODES}
    if kind == "ed25519-repr":
        return dict(ed25519_cluster(NODES, seed=b"t", encode=repr_encoding))
    return dict(ed25519_cluster(NODES, seed=b"t"))


@pytest.mark.parametrize("kind", ["fast", "ed25519-repr", "ed25519-codec"])
def test_sign_verify_round_trip_and_forgeries_fail(kind: str) -> None:
    cs = _cryptos(kind)
    a, b = cs[NODES[0]], cs[NODES[1]]
    msg = Prepare(view=1, seq=2, digest=b"d" * 32, replica=NODES[0])
    sig = a.sign(msg)  # type: ignore[attr-defined]
    signed = dataclasses.replace(msg, signature=sig)
    assert b.verify(NODES[0], signed, sig)  # type: ignore[attr-defined]
    assert b.verify(NODES[0], msg, sig)  # the signature field is not covered
    assert not b.verify(NODES[1], msg, sig)  # type: ignore[attr-defined]  wrong signer
    assert not b.verify(NODES[0], dataclasses.replace(msg, seq=3), sig)  # type: ignore[attr-defined]
    assert not b.verify(NODES[0], msg, bytes(len(sig)))  # type: ignore[attr-defined]
    assert not b.verify(NODES[0], msg, b"short")  # type: ignore[attr-defined]
    assert not b.verify(NodeId("stranger"), msg, sig) or kind == "fast"  # type: ignore[attr-defined]
    commit = Commit(view=0, seq=1, digest=b"x", replica=NODES[0])
    tag = a.mac(NODES[1], commit)  # type: ignore[attr-defined]
    assert b.verify_mac(NODES[0], commit, tag)  # type: ignore[attr-defined]
    assert not cs[NODES[2]].verify_mac(NODES[0], commit, tag)  # type: ignore[attr-defined]
    assert not b.verify_mac(NODES[0], dataclasses.replace(commit, seq=2), tag)  # type: ignore[attr-defined]


def test_libsodium_signatures_are_the_rfc8032_signatures_cryptography_makes() -> None:
    """Signing runs in libsodium (PyNaCl) while keys come from `cryptography`: Ed25519 is
    deterministic, so both must give the same bytes, and each must accept the other's."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.net.crypto import Ed25519Crypto, _codec_signed_bytes

    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    ours = Ed25519Crypto(NODES[0], private_key=key, public_keys={NODES[0]: key.public_key()},
                         mac_keys={})
    for seq in range(5):
        msg = Prepare(view=seq, seq=seq * 7 + 1, digest=bytes([seq]) * 32, replica=NODES[0])
        sig = ours.sign(msg)
        assert sig == key.sign(_codec_signed_bytes(msg))
        key.public_key().verify(sig, _codec_signed_bytes(msg))  # raises if not valid
        assert ours.verify(NODES[0], msg, sig)
        flipped = bytes([sig[0] ^ 1]) + sig[1:]
        assert not ours.verify(NODES[0], msg, flipped)
        with pytest.raises(InvalidSignature):
            key.public_key().verify(flipped, _codec_signed_bytes(msg))
    # Malformed signatures are refused, never raised (Byzantine input is normal input).
    for bad in (b"", sig + b"\x00", sig[:63], bytearray(sig), "x" * 64, None, 7):
        assert not ours.verify(NODES[0], msg, bad)  # type: ignore[arg-type]


def test_pbft_round_with_real_keys_and_codec() -> None:
    c = Cluster(4, batch_size=1)
    real = ed25519_cluster(c.ids, seed=b"cluster")
    for i in c.ids:
        c.crypto[i] = real[i]  # type: ignore[assignment]
        c.cores[i] = PbftCore(c.config(i), crypto=real[i])
    for no in range(3):
        c.submit(c.ids[0], req("a", no))
    c.deliver()
    for i in c.ids:
        assert [e.index for e in c.entries[i]] == [1, 2, 3]
        assert c.dropped(i) == {}


def test_a_pre_prepare_signature_covers_its_header_and_the_digest_binds_the_batch() -> None:
    """Castro-Liskov §4.2: <PRE-PREPARE, v, n, d> is signed and m travels alongside, so a
    relay that swaps m in a certificate is caught by d, and one that also fixes d by the
    signature."""
    c = Cluster(4, batch_size=1)
    real = ed25519_cluster(c.ids, seed=b"cluster")
    for i in c.ids:
        c.crypto[i] = real[i]  # type: ignore[assignment]
        c.cores[i] = PbftCore(c.config(i), crypto=real[i])
    c.submit(c.ids[0], req("a", 0))
    c.deliver()
    (proof,) = c.cores[c.ids[1]].durable_state().prepared
    pp = proof.pre_prepare
    checker = real[c.ids[2]]
    config = c.config(c.ids[2])
    assert checker.verify(pp.replica, signed_part(pp), pp.signature)
    assert not checker.verify(pp.replica, signed_part(dataclasses.replace(pp, seq=2)),
                              pp.signature)
    assert check_prepared_proof(config, checker, proof, new_view=1, low=0) is None
    other = (req("evil", 1),)
    swapped = dataclasses.replace(pp, batch=other)
    assert check_prepared_proof(config, checker, dataclasses.replace(proof, pre_prepare=swapped),
                                new_view=1, low=0) == "bad_prepared_proof"
    fixed = dataclasses.replace(swapped, digest=digest_of(checker, other))
    assert check_prepared_proof(config, checker, dataclasses.replace(proof, pre_prepare=fixed),
                                new_view=1, low=0) in ("bad_prepared_proof", "bad_signature")
    assert not checker.verify(pp.replica, signed_part(fixed), pp.signature)


def test_mac_bytes_are_reused_only_for_the_same_object() -> None:
    cs = ed25519_cluster(NODES, seed=b"t")
    a, b = cs[NODES[0]], cs[NODES[1]]
    first = Commit(view=0, seq=1, digest=b"x", replica=NODES[0])
    second = Commit(view=0, seq=2, digest=b"x", replica=NODES[0])
    t1, t2 = a.mac(NODES[1], first), a.mac(NODES[1], second)
    assert t1 != t2
    assert a.mac(NODES[1], dataclasses.replace(first)) == t1  # equal message, equal tag
    assert b.verify_mac(NODES[0], second, t2)
    assert not b.verify_mac(NODES[0], second, t1)
    assert b.verify_mac(NODES[0], dataclasses.replace(first, auth=t1), t1)

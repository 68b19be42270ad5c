"""Client signing keys (`phalanx.ops.signing_keys`): a `TransactionSigner`'s signature is
accepted by `client_verifier` over the keyring and by a node's `Ed25519Crypto` holding the
client's public key (one definition of the signed bytes); anything else is refused, never
raised."""

from __future__ import annotations

import dataclasses
import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.leaderless.messages import Requirement, Transaction
from phalanx.consensus.types import NodeId
from phalanx.net.crypto import Ed25519Crypto
from phalanx.ops.signing_keys import (
    SigningKeyError,
    TransactionSigner,
    client_verifier,
    generate_client_key,
)


def _seed(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def _tx(**changes: object) -> Transaction:
    tx = Transaction(client="alice", client_id="c-1", request_no=7, deadline_ms=1_700_000_000_000,
                     requirements=(Requirement(key="k", version=b"\x01" * 8),),
                     command=b"\x93\x01\x02\x03")
    return dataclasses.replace(tx, **changes)  # type: ignore[arg-type]


ALICE = TransactionSigner("alice", _seed("alice"))
BOB = TransactionSigner("bob", _seed("bob"))
KEYRING = {"alice": ALICE.public_key, "bob": BOB.public_key}


def test_the_verifier_accepts_the_signers_signature() -> None:
    tx = ALICE.sign(_tx())
    assert tx.client == "alice"
    assert len(tx.signature) == 64
    assert client_verifier(KEYRING).verify(NodeId("alice"), tx, tx.signature)


def test_sign_names_the_signer_and_signs_the_named_transaction() -> None:
    tx = BOB.sign(_tx())
    assert tx.client == "bob"
    assert client_verifier(KEYRING).verify(NodeId("bob"), tx, tx.signature)


def test_a_node_crypto_holding_the_client_key_agrees() -> None:
    """The node side's Ed25519Crypto (codec encoding) covers the same bytes."""
    tx = ALICE.sign(_tx())
    node = Ed25519Crypto(
        NodeId("n1"), private_key=Ed25519PrivateKey.from_private_bytes(_seed("n1")),
        public_keys={NodeId("alice"): Ed25519PublicKey.from_public_bytes(ALICE.public_key)},
        mac_keys={})
    assert node.verify(NodeId("alice"), tx, tx.signature)


@pytest.mark.parametrize("forge", [
    lambda tx: (NodeId("bob"), tx, tx.signature),                          # another key's name
    lambda tx: (NodeId("carol"), tx, tx.signature),                        # not in the keyring
    lambda tx: (NodeId("alice"), dataclasses.replace(tx, request_no=8), tx.signature),
    lambda tx: (NodeId("alice"), dataclasses.replace(tx, requirements=()), tx.signature),
    lambda tx: (NodeId("alice"), dataclasses.replace(tx, deadline_ms=tx.deadline_ms + 1),
                tx.signature),
    lambda tx: (NodeId("alice"), tx, BOB.signature(tx)),                   # bob signs as alice
    lambda tx: (NodeId("alice"), tx, b""),
    lambda tx: (NodeId("alice"), tx, tx.signature[:-1]),
    lambda tx: (NodeId("alice"), tx, bytes(64)),
    lambda tx: (NodeId("alice"), tx, "not bytes"),
    lambda tx: (NodeId("alice"), object(), tx.signature),                  # not encodable
])
def test_forged_or_other_key_signatures_are_refused(forge: object) -> None:
    tx = ALICE.sign(_tx())
    node, obj, signature = forge(tx)  # type: ignore[operator]
    assert client_verifier(KEYRING).verify(node, obj, signature) is False


def test_a_malformed_keyring_entry_verifies_nothing() -> None:
    tx = ALICE.sign(_tx())
    assert not client_verifier({"alice": b"short"}).verify(NodeId("alice"), tx, tx.signature)


@settings(max_examples=50, deadline=None)
@given(flip=st.integers(min_value=0, max_value=64 * 8 - 1))
def test_any_bit_flip_in_the_signature_is_refused(flip: int) -> None:
    tx = ALICE.sign(_tx())
    sig = bytearray(tx.signature)
    sig[flip // 8] ^= 1 << (flip % 8)
    assert not client_verifier(KEYRING).verify(NodeId("alice"), tx, bytes(sig))


def test_key_files_are_owner_only_and_load_under_their_name(tmp_path: Path) -> None:
    path = tmp_path / "carol.signing.key"
    public = generate_client_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    signer = TransactionSigner.from_file(path)
    assert signer.name == "carol"
    assert signer.public_key == public
    tx = signer.sign(_tx())
    assert client_verifier({"carol": public}).verify(NodeId("carol"), tx, tx.signature)
    with pytest.raises(FileExistsError):
        generate_client_key(path)
    (tmp_path / "bad.signing.key").write_text("zz\n")
    with pytest.raises(SigningKeyError, match="not hex"):
        TransactionSigner.from_file(tmp_path / "bad.signing.key")

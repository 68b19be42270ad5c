"""Shared fixtures for the chain app tests: deterministic keys and a small genesis."""

from __future__ import annotations

import dataclasses

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.block import BlockHeader, block_hash, chain_id
from phalanx.apps.chain.certificate import BlockCertificate, encode_certificate, sign_block
from phalanx.apps.chain.tx import TxBody, public_key, sign
from phalanx.apps.chain.types import Genesis

KEYS = [Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i in range(6)]
ACCOUNTS = [public_key(k) for k in KEYS]
MINTER = 0
START = 1_000


def genesis() -> Genesis:
    """Accounts 1..3 start with `START` each; account 0 is the minter (no balance)."""
    return Genesis(minter=ACCOUNTS[MINTER],
                   balances=tuple(sorted((ACCOUNTS[i], START) for i in (1, 2, 3))))


CHAIN_ID = chain_id(genesis())


def tx(sender: int, nonce: int, method: str = "transfer", *args: int | bytes | str,
       chain: bytes = CHAIN_ID) -> bytes:
    return sign(KEYS[sender], TxBody(chain_id=chain, sender=ACCOUNTS[sender], nonce=nonce,
                                     method=method, args=args)).raw


def transfer(sender: int, nonce: int, to: int, amount: int, *, chain: bytes = CHAIN_ID
             ) -> bytes:
    return tx(sender, nonce, "transfer", ACCOUNTS[to], amount, chain=chain)


# --- a 4-node cluster's node signing keys (block certificates) -------------------------

NODES = ("n0", "n1", "n2", "n3")
NODE_SECRETS = {n: Ed25519PrivateKey.from_private_bytes(bytes([0x40 + i]) * 32)
                for i, n in enumerate(NODES)}
NODE_KEYS = {n: public_key(k) for n, k in NODE_SECRETS.items()}
"""Node id -> raw Ed25519 public key (what `verify_certificate` takes)."""
QUORUM = 3
"""Byzantine quorum of 4 nodes (f = 1)."""


def certify(header: BlockHeader, signers: tuple[str, ...] = NODES[:QUORUM],
            chain: bytes = CHAIN_ID, forger: str | None = None) -> BlockHeader:
    """`header` with a certificate signed by `signers` (by `forger`'s key in their names,
    when given: what a Byzantine node can make)."""
    sigs = [sign_block(node=n, chain_id=chain, height=header.height,
                       block_hash=block_hash(header), sign=NODE_SECRETS[forger or n].sign)
            for n in signers]
    cert = BlockCertificate(height=header.height, block_hash=block_hash(header),
                            signatures=tuple(sorted((s.node, s.signature) for s in sigs)))
    return dataclasses.replace(header, consensus_proof=encode_certificate(cert))

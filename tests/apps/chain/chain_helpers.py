"""Shared fixtures for the chain app tests: deterministic keys and a small genesis."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.block import chain_id
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

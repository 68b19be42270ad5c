"""Block headers, their hash, and the Merkle root over a block's transaction ids.

Owns: `BlockHeader` (Sawtooth/BlockRaFT fields: height, previous hash, tx root, state root,
timestamp and proposer from consensus, and an opaque consensus proof), `block_hash`,
`genesis_hash`, `chain_id`, `tx_root`, and the header's codec type id (470).

Must not import: consensus cores, storage, trio, clocks.

Invariants:
- `block_hash` covers every header field EXCEPT `consensus_proof`: the proof (a PBFT commit
  certificate, Raft's term and index with signatures, ...) attests the hash, so it is
  attached after the block is built and cannot be part of what it signs.
- Block 1's `prev_hash` is `genesis_hash(genesis)`, tying the chain to its configuration.
- `tx_root` is a binary Merkle tree over the tx ids in block order with domain separation
  (``leaf = SHA-256(0x00 || tx_id)``, ``inner = SHA-256(0x01 || left || right)``); an odd
  node is promoted unchanged to the next level (never duplicated, so no two different lists
  share a root, unlike Bitcoin's CVE-2012-2459); the empty block's root is 32 zero bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.apps.chain.types import Genesis
from phalanx.net.codec import DecodeError
from phalanx.net.wire import default_registry, register_all

EMPTY_TX_ROOT = bytes(32)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockHeader:
    height: int
    prev_hash: bytes
    tx_root: bytes
    state_root: bytes
    timestamp: int
    """Milliseconds, as consensus supplied it (never below the previous block's)."""
    proposer: str
    consensus_proof: bytes = b""

    def __str__(self) -> str:
        return (f"block {self.height} {block_hash(self).hex()[:12]} "
                f"state={self.state_root.hex()[:12]} txs={self.tx_root.hex()[:12]}")


_REGISTRY = default_registry()
register_all({470: BlockHeader})


def encode_header(header: BlockHeader) -> bytes:
    return _REGISTRY.encode(header)


def decode_header(data: bytes) -> BlockHeader:
    """Raises `DecodeError` when `data` is not one canonical header."""
    header = _REGISTRY.decode(data, expected=BlockHeader)
    if not isinstance(header, BlockHeader):  # `expected` guarantees it; keeps mypy honest
        raise DecodeError("not a BlockHeader")
    return header


def block_hash(header: BlockHeader) -> bytes:
    return hashlib.sha256(
        _REGISTRY.canonical_bytes(header, omit=("consensus_proof",))).digest()


def genesis_hash(genesis: Genesis) -> bytes:
    return hashlib.sha256(_REGISTRY.encode(genesis)).digest()


def chain_id(genesis: Genesis) -> bytes:
    """The id every transaction of this chain names (`TxBody.chain_id`): the genesis hash."""
    return genesis_hash(genesis)


def tx_root(tx_ids: Sequence[bytes]) -> bytes:
    if not tx_ids:
        return EMPTY_TX_ROOT
    level = [hashlib.sha256(b"\x00" + t).digest() for t in tx_ids]
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]

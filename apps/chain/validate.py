"""Chain validation: check an exported chain by linking its headers and re-executing it.

Owns: `validate_chain` and its typed verdicts (`ChainValid`, `ChainInvalid`).

Must not import: consensus cores, storage, trio, clocks.

What is checked, block by block from the genesis (any node's export validates the same way):
heights are 1, 2, 3, ... (a second block at a height, i.e. a fork, is refused); each
`prev_hash` is the previous header's `block_hash` (block 1's: `genesis_hash`); timestamps
never decrease; the consensus proof is accepted by the caller's `trust` callback, or, given
`node_keys` and `quorum`, is a block certificate of that quorum
(`light.trust_by_certificate`; neither skips it; with `require_proof=False` a block without
a proof passes unchecked, as in an export from a node that holds no certificate of some
blocks, and one WITH a proof must still verify: `ChainValid.certified` counts the blocks
whose proof verified); the tx root recomputed from the block's transactions matches; every
transaction executes successfully (blocks hold only those: a replayed nonce or an overdraft
is refused); and re-executing the block gives exactly its state root. The first failure is
returned; nothing raises on any input.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from phalanx.apps.chain.block import BlockHeader, block_hash, chain_id, decode_header, tx_root
from phalanx.apps.chain.light import trust_by_certificate
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import decode_tx
from phalanx.apps.chain.types import BlockData, ChainError, Genesis, TxApplied, decode_result
from phalanx.apps.interface import BatchInfo
from phalanx.net.codec import DecodeError


class Failure(enum.Enum):
    MALFORMED = "malformed"
    HEIGHT = "height"
    PREV_HASH = "prev_hash"
    TIMESTAMP = "timestamp"
    CONSENSUS_PROOF = "consensus_proof"
    TX_ROOT = "tx_root"
    TX_REFUSED = "tx_refused"
    STATE_ROOT = "state_root"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainValid:
    height: int
    head_hash: bytes
    state_root: bytes
    certified: int = 0
    """Blocks whose consensus proof the check accepted (0 when none was checked)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainInvalid:
    height: int
    """The height of the offending block (its position in the list, counting from 1)."""
    failure: Failure
    detail: str = ""

    def __str__(self) -> str:
        return f"block {self.height}: {self.failure.value}: {self.detail}"


Block = tuple[BlockHeader, Sequence[bytes]]
TrustFn = Callable[[BlockHeader], bool]


def validate_chain(genesis: Genesis, blocks: Sequence[Block], *,
                   trust: TrustFn | None = None, node_keys: Mapping[str, bytes] | None = None,
                   quorum: int | None = None, require_proof: bool = True
                   ) -> ChainValid | ChainInvalid:
    """Validate `blocks` (headers with their raw transactions, from height 1) against the
    genesis. See the module docstring for the checks. `node_keys` (node id -> raw Ed25519
    public key) and `quorum` check every header's block certificate; raises ValueError when
    given with `trust`, or one without the other (our misuse). `require_proof=False`: a
    header with an empty consensus proof is not checked (and not counted as certified)."""
    if (node_keys is None) != (quorum is None) or (node_keys is not None and trust is not None):
        raise ValueError("give node_keys with quorum, or trust, not both")
    if node_keys is not None and quorum is not None:
        trust = trust_by_certificate(node_keys, quorum, chain_id=chain_id(genesis))
    machine = ChainStateMachine(genesis)
    last_timestamp = certified = 0
    for position, (header, txs) in enumerate(blocks, start=1):
        def invalid(failure: Failure, detail: str = "", _h: int = position) -> ChainInvalid:
            return ChainInvalid(height=_h, failure=failure, detail=detail)

        if header.height != position:
            return invalid(Failure.HEIGHT, f"expected {position}, got {header.height}")
        if header.prev_hash != machine.head_hash:
            return invalid(Failure.PREV_HASH, "does not link to the previous block")
        if header.timestamp < last_timestamp:
            return invalid(Failure.TIMESTAMP, f"{header.timestamp} < {last_timestamp}")
        if trust is not None and (require_proof or header.consensus_proof):
            if not trust(header):
                return invalid(Failure.CONSENSUS_PROOF, "the consensus proof does not verify")
            certified += 1
        ids: list[bytes] = []
        for raw in txs:
            tx = decode_tx(raw)
            if isinstance(tx, ChainError):
                return invalid(Failure.MALFORMED, f"transaction {len(ids)}: {tx}")
            ids.append(tx.tx_id)
        if tx_root(ids) != header.tx_root:
            return invalid(Failure.TX_ROOT, "recomputed tx root differs")
        machine.begin_batch(BatchInfo(index=position, timestamp=header.timestamp,
                                      proposer=header.proposer))
        for i, raw in enumerate(txs):
            result = decode_result(machine.apply(raw))
            if not isinstance(result, TxApplied):
                return invalid(Failure.TX_REFUSED, f"transaction {i}: {result}")
        if machine.end_batch() != header.state_root:
            return invalid(Failure.STATE_ROOT, "re-execution gives another state root")
        if machine.head_hash != block_hash(header):  # every field above matched: paranoia
            return invalid(Failure.MALFORMED, "re-built header hashes differently")
        last_timestamp = header.timestamp
    return ChainValid(height=machine.height, head_hash=machine.head_hash,
                      state_root=machine.state_root, certified=certified)


def decode_blocks(blocks: Sequence[BlockData]) -> list[Block] | ChainInvalid:
    """`BlockData`s (what `GetBlock` returns) as (header, txs) pairs for `validate_chain`."""
    out: list[Block] = []
    for position, block in enumerate(blocks, start=1):
        try:
            out.append((decode_header(block.header), block.txs))
        except DecodeError as exc:
            return ChainInvalid(height=position, failure=Failure.MALFORMED, detail=str(exc))
    return out

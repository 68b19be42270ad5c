"""Chain validation over an exported chain: links, tx roots, re-execution, forks, replays."""

from __future__ import annotations

import dataclasses

import pytest
from chain_helpers import ACCOUNTS, NODE_KEYS, QUORUM, certify, genesis, transfer, tx

from phalanx.apps.chain.block import BlockHeader, block_hash, tx_root
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import decode_tx
from phalanx.apps.chain.types import BlockData
from phalanx.apps.chain.validate import (
    Block,
    ChainInvalid,
    ChainValid,
    Failure,
    decode_blocks,
    validate_chain,
)
from phalanx.apps.interface import BatchInfo

BATCHES = [
    [transfer(1, 1, 4, 100), transfer(2, 1, 4, 50)],
    [tx(0, 1, "mint", ACCOUNTS[5], 10), transfer(4, 1, 5, 20)],
    [],
    [transfer(3, 7, 1, 1)],
]


def _chain() -> tuple[ChainStateMachine, list[Block]]:
    m = ChainStateMachine(genesis())
    for i, batch in enumerate(BATCHES):
        m.begin_batch(BatchInfo(index=10 * i, timestamp=1000 * i, proposer=f"n{i % 3}"))
        for raw in batch:
            m.apply(raw)
        m.end_batch()
    exported = [m.block(h) for h in range(1, m.height + 1)]
    blocks = decode_blocks([b for b in exported if b is not None])
    assert not isinstance(blocks, ChainInvalid)
    return m, blocks


def _failure(result: ChainValid | ChainInvalid) -> tuple[int, Failure]:
    assert isinstance(result, ChainInvalid), result
    return result.height, result.failure


def test_an_exported_chain_validates() -> None:
    m, blocks = _chain()
    assert validate_chain(genesis(), blocks) == ChainValid(
        height=4, head_hash=m.head_hash, state_root=m.state_root)
    seen: list[int] = []
    assert isinstance(validate_chain(genesis(), blocks,
                                     trust=lambda h: seen.append(h.height) is None), ChainValid)
    assert seen == [1, 2, 3, 4]
    assert _failure(validate_chain(genesis(), blocks, trust=lambda h: h.height != 3)) == (
        3, Failure.CONSENSUS_PROOF)


def test_a_tampered_transaction_gives_a_tx_root_mismatch() -> None:
    _, blocks = _chain()
    header, txs = blocks[1]
    tampered = [transfer(4, 1, 5, 21), *txs[1:]]  # validly signed, but not what was ordered
    blocks[1] = (header, [txs[1], txs[0]])  # reordering is tampering too
    assert _failure(validate_chain(genesis(), blocks)) == (2, Failure.TX_ROOT)
    blocks[1] = (header, tampered)
    assert _failure(validate_chain(genesis(), blocks)) == (2, Failure.TX_ROOT)
    blocks[1] = (header, [*txs, b"junk"])
    assert _failure(validate_chain(genesis(), blocks)) == (2, Failure.MALFORMED)


def test_tampered_state_gives_a_state_root_mismatch() -> None:
    _, blocks = _chain()
    header, txs = blocks[0]
    blocks[0] = (dataclasses.replace(header, state_root=bytes(32)), txs)
    assert _failure(validate_chain(genesis(), blocks)) == (1, Failure.STATE_ROOT)


def test_links_heights_and_timestamps() -> None:
    _, blocks = _chain()
    assert _failure(validate_chain(genesis(), blocks[1:])) == (1, Failure.HEIGHT)
    header, txs = blocks[2]
    relinked = list(blocks)
    relinked[2] = (dataclasses.replace(header, prev_hash=bytes(32)), txs)
    assert _failure(validate_chain(genesis(), relinked)) == (3, Failure.PREV_HASH)
    earlier = list(blocks)
    earlier[3] = (dataclasses.replace(blocks[3][0], timestamp=1), blocks[3][1])
    assert _failure(validate_chain(genesis(), earlier)) == (4, Failure.TIMESTAMP)


def _fork_at_3(blocks: list[Block]) -> Block:
    """A second block 3 on the same parent as `blocks[2]`, with other (valid) contents."""
    fork_m = ChainStateMachine(genesis())
    for header, txs in blocks[:2]:
        fork_m.begin_batch(BatchInfo(index=0, timestamp=header.timestamp,
                                     proposer=header.proposer))
        for raw in txs:
            fork_m.apply(raw)
        fork_m.end_batch()
    fork_m.begin_batch(BatchInfo(index=0, timestamp=5000, proposer="evil"))
    fork_m.apply(transfer(1, 2, 5, 1))
    fork_m.end_batch()
    fork = fork_m.block(3)
    assert fork is not None
    fork_blocks = decode_blocks([fork])
    assert not isinstance(fork_blocks, ChainInvalid)
    return fork_blocks[0]


def test_a_fork_at_the_same_height_is_rejected() -> None:
    _, blocks = _chain()
    fork = _fork_at_3(blocks)
    assert fork[0].prev_hash == block_hash(blocks[1][0])
    assert isinstance(validate_chain(genesis(), [*blocks[:2], fork]), ChainValid)
    both = [*blocks[:3], fork]
    assert _failure(validate_chain(genesis(), both)) == (4, Failure.HEIGHT)


def _certified(blocks: list[Block]) -> list[Block]:
    return [(certify(header, ("n0", "n1", "n2")), txs) for header, txs in blocks]


def test_with_node_keys_every_header_needs_a_quorum_certificate() -> None:
    m, blocks = _chain()
    certified = _certified(blocks)
    assert validate_chain(genesis(), certified, node_keys=NODE_KEYS, quorum=QUORUM) == (
        ChainValid(height=4, head_hash=m.head_hash, state_root=m.state_root, certified=4))
    assert _failure(validate_chain(genesis(), blocks, node_keys=NODE_KEYS, quorum=QUORUM)) == (
        1, Failure.CONSENSUS_PROOF)
    short = list(certified)
    short[1] = (certify(blocks[1][0], ("n0", "n3")), blocks[1][1])
    assert _failure(validate_chain(genesis(), short, node_keys=NODE_KEYS, quorum=QUORUM)) == (
        2, Failure.CONSENSUS_PROOF)
    assert isinstance(validate_chain(genesis(), short, node_keys=NODE_KEYS, quorum=2),
                      ChainValid)  # a crash-fault quorum of 4 would accept it
    with pytest.raises(ValueError, match="not both"):
        validate_chain(genesis(), certified, node_keys=NODE_KEYS)
    with pytest.raises(ValueError, match="not both"):
        validate_chain(genesis(), certified, node_keys=NODE_KEYS, quorum=QUORUM,
                       trust=lambda h: True)


def test_without_require_proof_bare_blocks_pass_and_carried_certificates_must_verify() -> None:
    """An export from a node that holds certificates of some blocks only."""
    m, blocks = _chain()
    some = [_certified(blocks)[0], blocks[1], _certified(blocks)[2], blocks[3]]
    assert validate_chain(genesis(), some, node_keys=NODE_KEYS, quorum=QUORUM,
                          require_proof=False) == ChainValid(
        height=4, head_hash=m.head_hash, state_root=m.state_root, certified=2)
    some[2] = (certify(blocks[2][0], ("n0", "n3")), blocks[2][1])  # short of the quorum
    assert _failure(validate_chain(genesis(), some, node_keys=NODE_KEYS, quorum=QUORUM,
                                   require_proof=False)) == (3, Failure.CONSENSUS_PROOF)
    assert validate_chain(genesis(), blocks).certified == 0  # type: ignore[union-attr]


def test_a_fork_at_the_same_height_with_a_forged_certificate_is_rejected() -> None:
    """A Byzantine node (n3) exports a chain whose block 3 is its own fork: valid links,
    roots and transactions, but it can only sign for itself."""
    _, blocks = _chain()
    honest = _certified(blocks)
    fork_header, fork_txs = _fork_at_3(blocks)
    for proof in (
        certify(fork_header, ("n0", "n1", "n3"), forger="n3").consensus_proof,
        certify(fork_header, ("n3",)).consensus_proof,
        honest[2][0].consensus_proof,  # the honest block 3's certificate
    ):
        forked = [*honest[:2], (dataclasses.replace(fork_header, consensus_proof=proof),
                                fork_txs)]
        assert _failure(validate_chain(genesis(), forked, node_keys=NODE_KEYS,
                                       quorum=QUORUM)) == (3, Failure.CONSENSUS_PROOF)


def test_a_replayed_nonce_is_rejected() -> None:
    m, blocks = _chain()
    replay = blocks[0][1][0]  # account 1's nonce-1 transfer, already in block 1
    # A forged block 5 carrying the replay, with the root its double application would give.
    prev = blocks[-1][0]
    ids = [decode_tx(replay).tx_id]  # type: ignore[union-attr]
    forged = BlockHeader(height=5, prev_hash=block_hash(prev), tx_root=tx_root(ids),
                         state_root=m.state_root, timestamp=prev.timestamp, proposer="evil")
    result = validate_chain(genesis(), [*blocks, (forged, [replay])])
    assert _failure(result) == (5, Failure.TX_REFUSED)
    assert "stale_nonce" in str(result)


def test_decode_blocks_refuses_junk_headers() -> None:
    result = decode_blocks([BlockData(header=b"junk", txs=())])
    assert isinstance(result, ChainInvalid)
    assert result.failure is Failure.MALFORMED

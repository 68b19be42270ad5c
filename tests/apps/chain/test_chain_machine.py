"""ChainStateMachine: transfers, the mint contract, nonces, blocks, queries, checkpoints."""

from __future__ import annotations

import pytest
from chain_helpers import ACCOUNTS, START, genesis, transfer, tx
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.block import block_hash, decode_header, genesis_hash, tx_root
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.smt import verify_proof
from phalanx.apps.chain.state import encode_account
from phalanx.apps.chain.tx import decode_tx
from phalanx.apps.chain.types import (
    AccountProof,
    Balance,
    ChainError,
    ChainErrorCode,
    Genesis,
    GetAccountProof,
    GetBalance,
    GetBlock,
    GetHead,
    GetNonce,
    Head,
    Nonce,
    TxApplied,
    decode_result,
    encode,
)
from phalanx.apps.interface import BatchHooks, BatchInfo, SnapshotFormatError, StateMachine


def _apply(m: ChainStateMachine, raw: bytes) -> object:
    return decode_result(m.apply(raw))


def _code(result: object) -> ChainErrorCode:
    assert isinstance(result, ChainError), result
    return result.code


def _checkpoint(m: ChainStateMachine) -> bytes:
    return b"".join(m.snapshot().chunks())


def test_it_implements_the_interfaces() -> None:
    m: StateMachine = ChainStateMachine(genesis())
    assert isinstance(m, BatchHooks)


def test_transfers_move_balances_and_refusals_change_nothing() -> None:
    m = ChainStateMachine(genesis())
    assert isinstance(_apply(m, transfer(1, 1, 4, 300)), TxApplied)
    assert (m.balance(ACCOUNTS[1]), m.balance(ACCOUNTS[4])) == (START - 300, 300)
    root, height = m.state_root, m.height
    refusals = {
        transfer(1, 1, 4, 1): ChainErrorCode.STALE_NONCE,  # replay of nonce 1
        transfer(1, 2, 4, START): ChainErrorCode.INSUFFICIENT_BALANCE,
        transfer(5, 1, 4, 1): ChainErrorCode.INSUFFICIENT_BALANCE,  # unknown sender
        tx(1, 2, "vote", ACCOUNTS[4], 1): ChainErrorCode.UNKNOWN_METHOD,
        tx(1, 2, "transfer", ACCOUNTS[4]): ChainErrorCode.MALFORMED,
        tx(1, 2, "transfer", ACCOUNTS[4], 0): ChainErrorCode.MALFORMED,
        tx(1, 2, "transfer", b"short", 1): ChainErrorCode.MALFORMED,
        tx(1, 2, "mint", ACCOUNTS[1], 5): ChainErrorCode.NOT_MINTER,
        tx(0, 1, "mint", ACCOUNTS[1], (1 << 63) - 1): ChainErrorCode.OVERFLOW,
        b"\x92garbage": ChainErrorCode.MALFORMED,
    }
    for raw, code in refusals.items():
        assert _code(_apply(m, raw)) is code
    assert (m.state_root, m.height) == (root, height)
    assert m.refused[ChainErrorCode.STALE_NONCE.value] == 1
    # nonces may skip, but never go back
    assert isinstance(_apply(m, transfer(1, 5, 4, 1)), TxApplied)
    assert _code(_apply(m, transfer(1, 4, 4, 1))) is ChainErrorCode.STALE_NONCE


def test_the_minter_mints_and_supply_follows() -> None:
    m = ChainStateMachine(genesis())
    assert m.supply == 3 * START
    assert isinstance(_apply(m, tx(0, 1, "mint", ACCOUNTS[5], 77)), TxApplied)
    assert m.balance(ACCOUNTS[5]) == 77
    assert m.supply == 3 * START + 77
    nonce = decode_result(m.query(encode(GetNonce(account=ACCOUNTS[0]))))
    assert nonce == Nonce(account=ACCOUNTS[0], nonce=1)


def test_without_hooks_each_successful_transaction_is_its_own_block() -> None:
    m = ChainStateMachine(genesis())
    raws = [transfer(1, 1, 4, 5), transfer(2, 1, 4, 5)]
    prev = genesis_hash(genesis())
    for height, raw in enumerate(raws, start=1):
        result = _apply(m, raw)
        assert isinstance(result, TxApplied)
        assert result.height == height
        block = m.block(height)
        assert block is not None
        header = decode_header(block.header)
        assert header.prev_hash == prev
        assert header.tx_root == tx_root([result.tx_id])
        assert header.state_root == m.state_root
        assert block.txs == (raw,)
        prev = block_hash(header)
    assert m.head_hash == prev
    _apply(m, transfer(1, 1, 4, 5))  # refused: no block
    assert m.height == 2


def test_a_batch_is_one_block_and_proofs_see_only_finished_blocks() -> None:
    m = ChainStateMachine(genesis())
    before = m.state_root
    m.begin_batch(BatchInfo(index=10, timestamp=5_000, proposer="n2"))
    ok = [transfer(1, 1, 4, 5), transfer(4, 1, 5, 2), transfer(1, 2, 5, 1)]
    for raw in ok:
        assert isinstance(_apply(m, raw), TxApplied)
    assert _code(_apply(m, transfer(1, 2, 5, 1))) is ChainErrorCode.STALE_NONCE
    # mid-batch: balances are current, the committed root and proofs are the last block's
    assert m.balance(ACCOUNTS[5]) == 3
    proof = decode_result(m.query(encode(GetAccountProof(account=ACCOUNTS[5]))))
    assert isinstance(proof, AccountProof)
    assert proof.value is None
    assert proof.state_root == before
    with pytest.raises(RuntimeError, match="already open"):
        m.begin_batch(BatchInfo(index=11, timestamp=0, proposer="n2"))
    root = m.end_batch()
    with pytest.raises(RuntimeError, match="no batch"):
        m.end_batch()
    block = m.block(1)
    assert block is not None
    header = decode_header(block.header)
    assert (header.height, header.timestamp, header.proposer) == (1, 5_000, "n2")
    assert header.state_root == root == m.state_root
    assert header.tx_root == tx_root([decode_tx(r).tx_id for r in ok])  # type: ignore[union-attr]
    assert block.txs == tuple(ok)
    proof = decode_result(m.query(encode(GetAccountProof(account=ACCOUNTS[5]))))
    assert isinstance(proof, AccountProof)
    assert proof.value == encode_account(3, 0)
    assert verify_proof(root, ACCOUNTS[5], proof.value, proof.proof)
    head = decode_result(m.query(encode(GetHead())))
    assert head == Head(height=1, block_hash=m.head_hash, state_root=root)
    # an empty batch is an empty block; timestamps never go back
    m.begin_batch(BatchInfo(index=12, timestamp=10, proposer="n3"))
    m.end_batch()
    block2 = m.block(2)
    assert block2 is not None
    assert decode_header(block2.header).timestamp == 5_000
    assert block2.txs == ()


def test_queries_and_bad_queries() -> None:
    m = ChainStateMachine(genesis())
    assert decode_result(m.query(encode(GetBalance(account=ACCOUNTS[2])))) == Balance(
        account=ACCOUNTS[2], balance=START)
    assert _code(decode_result(m.query(encode(GetBlock(height=1))))) is ChainErrorCode.NOT_FOUND
    assert _code(decode_result(m.query(b"junk"))) is ChainErrorCode.MALFORMED
    assert _code(decode_result(m.query(transfer(1, 1, 2, 3)))) is ChainErrorCode.MALFORMED
    assert _code(decode_result(m.query(b"x" * 1000))) is ChainErrorCode.TOO_LARGE
    assert m.admit(encode(GetHead()), read_only=True) is None
    assert m.admit(b"junk", read_only=True) is not None


def _run(m: ChainStateMachine, ops: list[tuple[int, int, int, int]], cut: int) -> None:
    """Apply transfers, in a batch for the first `cut` and then one block each."""
    m.begin_batch(BatchInfo(index=1, timestamp=1, proposer="a"))
    for i, (sender, nonce, to, amount) in enumerate(ops):
        if i == cut:
            m.end_batch()
        m.apply(transfer(sender, nonce, to, amount))
    if m._batch is not None:  # the test drives both modes
        m.end_batch()


ops_strategy = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(0, 5),
                                  st.integers(1, 700)), max_size=25)


@settings(max_examples=40, deadline=None)
@given(ops_strategy, st.integers(0, 25))
def test_replicas_agree_supply_is_conserved_and_checkpoints_restore_anywhere(
        ops: list[tuple[int, int, int, int]], cut: int) -> None:
    a, b = ChainStateMachine(genesis()), ChainStateMachine(genesis())
    _run(a, ops, cut)
    _run(b, ops, cut)
    assert (a.state_root, a.head_hash, a.height) == (b.state_root, b.head_hash, b.height)
    assert sum(a.balance(x) for x in ACCOUNTS) == a.supply == 3 * START
    assert all(a.balance(x) >= 0 for x in ACCOUNTS)
    # checkpoint mid-batch, keep going on both: the restored copy stays identical
    a.begin_batch(BatchInfo(index=99, timestamp=9, proposer="z"))
    a.apply(transfer(2, 50, 3, 1))
    data = _checkpoint(a)
    c = ChainStateMachine(genesis())
    c.restore(data)
    assert _checkpoint(c) == data
    assert a.end_batch() == c.end_batch()
    assert a.head_hash == c.head_hash
    assert c.block(c.height) == a.block(a.height)


def test_a_snapshot_never_changes_after_more_applies() -> None:
    m = ChainStateMachine(genesis())
    m.apply(transfer(1, 1, 4, 5))
    snap = m.snapshot()
    before = b"".join(m.snapshot().chunks())
    m.begin_batch(BatchInfo(index=2, timestamp=2, proposer="x"))
    m.apply(transfer(1, 2, 4, 5))
    m.end_batch()
    assert b"".join(snap.chunks()) == before


def test_restore_refuses_bad_data_and_keeps_the_state() -> None:
    m = ChainStateMachine(genesis())
    m.apply(transfer(1, 1, 4, 5))
    good = _checkpoint(m)
    fresh = ChainStateMachine(genesis())
    root = fresh.state_root
    corrupt = [b"", b"junk", good[:-3], good + b"\xc0",
               good.replace(b"phalanx.chain", b"phalanx.chaim")]
    # flip one byte of an account value: the leaves no longer hash to the state root
    i = good.index(encode_account(START - 5, 1))
    corrupt.append(good[:i] + encode_account(START - 4, 1) + good[i + 16:])
    for data in corrupt:
        with pytest.raises(SnapshotFormatError):
            fresh.restore(data)
        assert fresh.state_root == root
        assert fresh.height == 0
    other = ChainStateMachine(Genesis(minter=ACCOUNTS[1]))
    with pytest.raises(SnapshotFormatError, match="another chain"):
        other.restore(good)
    fresh.restore(good)
    assert fresh.state_root == m.state_root


def test_checkpoints_split_into_many_chunks_restore_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.apps.chain import checkpoint

    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 1)
    monkeypatch.setattr(checkpoint, "LEAVES_PER_CHUNK", 1)
    m = ChainStateMachine(genesis())
    for nonce in range(1, 4):
        m.apply(transfer(1, nonce, 4, 5))
    chunks = list(m.snapshot().chunks())
    assert len(chunks) >= 1 + 4 + 1 + 3 + 1  # header, leaves, dirty, blocks, end
    c = ChainStateMachine(genesis())
    c.restore(b"".join(chunks))
    assert (c.state_root, c.head_hash, c.height) == (m.state_root, m.head_hash, 3)
    assert c.block(2) == m.block(2)

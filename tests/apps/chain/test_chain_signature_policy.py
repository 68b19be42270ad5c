"""The chain id and the signature-verification policy of `ChainStateMachine.apply`.

A Byzantine PBFT primary can order bytes no replica admitted: under the default policy every
such transaction is verified in `apply`, and results never depend on what a node admitted.
"""

from __future__ import annotations

import hashlib

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
import pytest
from chain_helpers import ACCOUNTS, CHAIN_ID, KEYS, START, genesis, transfer
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.block import chain_id
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import TxBody
from phalanx.apps.chain.types import (
    ChainError,
    ChainErrorCode,
    Genesis,
    TxApplied,
    decode_result,
)


def _apply(m: ChainStateMachine, raw: bytes) -> object:
    return decode_result(m.apply(raw))


def _code(result: object) -> ChainErrorCode:
    assert isinstance(result, ChainError), result
    return result.code


def _resigned(raw: bytes, signature: bytes) -> bytes:
    """`raw`'s body under another signature (same tx id)."""
    body, _ = msgpack.unpackb(raw)
    return bytes(msgpack.packb([body, signature], use_bin_type=True))


def _flipped(raw: bytes) -> bytes:
    _, sig = msgpack.unpackb(raw)
    return _resigned(raw, bytes([sig[0] ^ 1]) + sig[1:])


def _signed_by_wrong_key(sender: int, nonce: int, to: int, amount: int) -> bytes:
    body = TxBody(chain_id=CHAIN_ID, sender=ACCOUNTS[sender], nonce=nonce, method="transfer",
                  args=(ACCOUNTS[to], amount)).encode()
    sig = KEYS[(sender + 1) % len(KEYS)].sign(hashlib.sha256(body).digest())
    return bytes(msgpack.packb([body, sig], use_bin_type=True))


def test_the_chain_id_is_the_genesis_hash_and_a_name_separates_equal_allocations() -> None:
    assert ChainStateMachine(genesis()).chain_id == CHAIN_ID == chain_id(genesis())
    named = Genesis(minter=genesis().minter, balances=genesis().balances, name="testnet")
    assert chain_id(named) != CHAIN_ID
    with pytest.raises(ValueError, match="name"):
        Genesis(minter=genesis().minter, name="x" * 65)


@pytest.mark.parametrize("trust", [False, True])
def test_a_transaction_for_another_chain_is_refused_and_counted(trust: bool) -> None:
    m = ChainStateMachine(genesis(), trust_leader_admission=trust)
    other = chain_id(Genesis(minter=genesis().minter, balances=genesis().balances, name="b"))
    raw = transfer(1, 1, 4, 10, chain=other)
    assert m.admit(raw, read_only=False) is not None
    root = m.state_root
    assert _code(_apply(m, raw)) is ChainErrorCode.WRONG_CHAIN
    assert m.refused == {"wrong_chain": 1}
    assert (m.height, m.state_root, m.balance(ACCOUNTS[1])) == (0, root, START)
    # the sender's nonce was not consumed: the same transfer for this chain executes
    assert isinstance(_apply(m, transfer(1, 1, 4, 10)), TxApplied)
    # the other chain's machine accepts it
    assert isinstance(_apply(ChainStateMachine(Genesis(
        minter=genesis().minter, balances=genesis().balances, name="b")), raw), TxApplied)


def test_apply_skips_only_the_signatures_its_own_admit_verified() -> None:
    m = ChainStateMachine(genesis())
    admitted, unseen = transfer(1, 1, 4, 10), transfer(2, 1, 4, 10)
    assert m.admit(admitted, read_only=False) is None
    assert isinstance(_apply(m, admitted), TxApplied)
    assert isinstance(_apply(m, unseen), TxApplied)
    assert m.signature_checks == {"verified": 1, "admitted": 1, "trusted": 0}
    # the cache entry was consumed: the same bytes ordered again are verified (then stale)
    assert _code(_apply(m, admitted)) is ChainErrorCode.STALE_NONCE
    assert m.signature_checks["verified"] == 2


def test_a_forged_transaction_ordered_by_a_byzantine_primary_is_refused_at_apply() -> None:
    valid = transfer(1, 1, 4, 10)
    forged = [
        _flipped(transfer(2, 1, 4, 10)),            # nobody admitted it
        _flipped(valid),                            # an admitted body under a bad signature
        _resigned(valid, bytes(64)),
        _signed_by_wrong_key(3, 1, 4, 10),          # the body names 3, key 4 signed it
    ]
    admitted_all = ChainStateMachine(genesis())
    for raw in [valid, *forged]:
        admitted_all.admit(raw, read_only=False)   # refuses the forged ones
    no_cache = ChainStateMachine(genesis(), admitted_cache_size=0)
    for m in (admitted_all, no_cache):
        for raw in forged:
            assert _code(_apply(m, raw)) is ChainErrorCode.BAD_SIGNATURE
        assert isinstance(_apply(m, valid), TxApplied)
        assert m.refused == {"bad_signature": len(forged)}
    assert admitted_all.state_root == no_cache.state_root
    assert admitted_all.signature_checks["admitted"] == 1


def test_trusting_the_leaders_admission_skips_apply_checks_crash_faults_only() -> None:
    m = ChainStateMachine(genesis(), trust_leader_admission=True)
    forged = _flipped(transfer(1, 1, 4, 10))
    assert m.admit(forged, read_only=False) is not None  # the leader's check refuses it
    # ... but a follower trusts whatever the leader ordered: why this is for crash faults only
    assert isinstance(_apply(m, forged), TxApplied)
    assert m.signature_checks == {"verified": 0, "admitted": 0, "trusted": 1}


def test_the_admitted_cache_is_bounded_and_evicts_the_oldest() -> None:
    m = ChainStateMachine(genesis(), admitted_cache_size=2)
    raws = [transfer(1, n, 4, 1) for n in (1, 2, 3)]
    for raw in raws:
        assert m.admit(raw, read_only=False) is None
    for raw in raws:
        assert isinstance(_apply(m, raw), TxApplied)
    assert m.signature_checks == {"verified": 1, "admitted": 2, "trusted": 0}
    with pytest.raises(ValueError, match="admitted_cache_size"):
        ChainStateMachine(genesis(), admitted_cache_size=-1)


_TXS = [transfer(s, n, 4, 7) for s in (1, 2, 3) for n in (1, 2)]
_CANDIDATES = _TXS + [_flipped(t) for t in _TXS] + [_resigned(t, bytes(64)) for t in _TXS[:2]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(_CANDIDATES))), max_size=14),
       st.lists(st.sampled_from(range(len(_CANDIDATES))), max_size=14),
       st.integers(0, 4))
def test_results_never_depend_on_what_a_node_admitted(
        ordered: list[int], admitted: list[int], cache: int) -> None:
    reference = ChainStateMachine(genesis(), admitted_cache_size=0)
    node = ChainStateMachine(genesis(), admitted_cache_size=cache)
    for i in admitted:
        node.admit(_CANDIDATES[i], read_only=False)
    for i in ordered:
        assert node.apply(_CANDIDATES[i]) == reference.apply(_CANDIDATES[i])
    assert node.state_root == reference.state_root
    assert node.refused == reference.refused

"""Signed transactions: canonical bytes, stateless verification, strict decoding."""

from __future__ import annotations

import hashlib

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
import pytest
from chain_helpers import ACCOUNTS, CHAIN_ID, KEYS, transfer
from hypothesis import given
from hypothesis import strategies as st

from phalanx.apps.chain.tx import (
    MAX_TX_BYTES,
    SignedTransaction,
    TxBody,
    decode_tx,
    sign,
    verify_stateless,
)
from phalanx.apps.chain.types import ChainError, ChainErrorCode


def _code(result: object) -> ChainErrorCode:
    assert isinstance(result, ChainError), result
    return result.code


def test_sign_then_verify_gives_the_same_transaction() -> None:
    body = TxBody(chain_id=CHAIN_ID, sender=ACCOUNTS[1], nonce=7, method="transfer",
                  args=(ACCOUNTS[2], 5))
    signed = sign(KEYS[1], body)
    assert signed.tx_id == hashlib.sha256(body.encode()).digest()
    again = verify_stateless(signed.raw, chain_id=CHAIN_ID)
    assert again == signed
    assert isinstance(again, SignedTransaction)
    assert again.body == body


def test_a_bad_signature_or_another_sender_is_refused() -> None:
    raw = transfer(1, 1, 2, 5)
    body_bytes, sig = msgpack.unpackb(raw)
    flipped = msgpack.packb([body_bytes, bytes([sig[0] ^ 1]) + sig[1:]], use_bin_type=True)
    assert _code(verify_stateless(flipped, chain_id=CHAIN_ID)) is ChainErrorCode.BAD_SIGNATURE
    assert isinstance(decode_tx(flipped), SignedTransaction)  # format alone is fine
    # the body names account 2 but account 1 signed it
    body = TxBody(chain_id=CHAIN_ID, sender=ACCOUNTS[2], nonce=1, method="transfer",
                  args=(ACCOUNTS[3], 1))
    forged = msgpack.packb([body.encode(), KEYS[1].sign(hashlib.sha256(body.encode()).digest())],
                           use_bin_type=True)
    assert _code(verify_stateless(forged, chain_id=CHAIN_ID)) is ChainErrorCode.BAD_SIGNATURE


def test_non_canonical_and_wrong_shapes_are_malformed() -> None:
    body = [1, CHAIN_ID, ACCOUNTS[1], 1, "transfer", [ACCOUNTS[2], 5]]
    sig = bytes(64)
    # the nonce 1 as a uint64 instead of a fixint: same value, not the canonical bytes
    packer = msgpack.Packer(use_bin_type=True)
    nonc = bytes([0x96]) + b"".join(packer.pack(x) for x in body[:3]) + b"\xcf" + \
        (1).to_bytes(8, "big") + packer.pack("transfer") + packer.pack([ACCOUNTS[2], 5])
    assert msgpack.unpackb(nonc) == body
    assert _code(decode_tx(msgpack.packb([nonc, sig], use_bin_type=True))) \
        is ChainErrorCode.MALFORMED
    c, a = CHAIN_ID, ACCOUNTS[1]
    for bad in ([2, *body[1:]], [1, c, a[:31], 1, "t", []], [1, c, a, -1, "t", []],
                [1, c, a, 1, "", []], [1, c, a, 1, "t", [1.5]], [1, c[:31], a, 1, "t", []],
                [1, a, 1, "t", []], [1, c, a, 1, "t", [[1]]], [1, c, a, 1, "t", list(range(9))]):
        raw = msgpack.packb([msgpack.packb(bad, use_bin_type=True), sig], use_bin_type=True)
        assert _code(decode_tx(raw)) is ChainErrorCode.MALFORMED, bad
    assert _code(decode_tx(b"\x00" * (MAX_TX_BYTES + 1))) is ChainErrorCode.TOO_LARGE


@given(st.binary(max_size=300))
def test_decoding_never_raises(junk: bytes) -> None:
    result = verify_stateless(junk, chain_id=CHAIN_ID)
    assert isinstance(result, ChainError | SignedTransaction)


def test_a_transaction_for_another_chain_is_refused_even_when_well_signed() -> None:
    other = hashlib.sha256(b"another chain").digest()
    raw = transfer(1, 1, 2, 5, chain=other)
    decoded = decode_tx(raw)
    assert isinstance(decoded, SignedTransaction)
    assert decoded.chain_id == other
    assert _code(verify_stateless(raw, chain_id=CHAIN_ID)) is ChainErrorCode.WRONG_CHAIN
    assert isinstance(verify_stateless(raw, chain_id=other), SignedTransaction)
    # the chain id is signed: re-labelling a transaction for this chain breaks its signature
    body_bytes, sig = msgpack.unpackb(raw)
    body = msgpack.unpackb(body_bytes)
    body[1] = CHAIN_ID
    relabelled = msgpack.packb([msgpack.packb(body, use_bin_type=True), sig], use_bin_type=True)
    assert _code(verify_stateless(relabelled, chain_id=CHAIN_ID)) is ChainErrorCode.BAD_SIGNATURE


def test_signing_with_the_wrong_key_or_oversize_is_our_misuse() -> None:
    body = TxBody(chain_id=CHAIN_ID, sender=ACCOUNTS[1], nonce=1, method="transfer",
                  args=(ACCOUNTS[2], 5))
    with pytest.raises(ValueError, match="does not belong"):
        sign(KEYS[2], body)
    with pytest.raises(ValueError, match="sender"):
        TxBody(chain_id=CHAIN_ID, sender=b"short", nonce=1, method="transfer")
    with pytest.raises(ValueError, match="chain_id"):
        TxBody(chain_id=b"", sender=ACCOUNTS[1], nonce=1, method="transfer")
    big = TxBody(chain_id=CHAIN_ID, sender=ACCOUNTS[1], nonce=1, method="transfer",
                 args=(b"x" * 1000,))
    with pytest.raises(ValueError, match="exceeds"):
        sign(KEYS[1], big)

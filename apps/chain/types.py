"""The chain app's typed errors, queries and results, registered in the project codec.

Owns: `ChainErrorCode`/`ChainError` (every refusal is one of these, as a RESULT), the query
types a client sends to `ChainStateMachine.query`, the result types `apply`/`query` return,
`Genesis`, and their stable codec type ids (`CHAIN_TYPE_IDS`, in the apps range 450-479 of
`phalanx.net.wire`).

Must not import: consensus cores, storage, trio, clocks. Pure data.

Invariants: type ids and field order are the wire format (never renumber); accounts are raw
32-byte Ed25519 public keys; every encoding is the codec's canonical one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from phalanx.net.codec import DecodeError
from phalanx.net.wire import default_registry, register_all

MAX_AMOUNT = (1 << 63) - 1
"""Largest amount, balance and total supply (so every balance fits a signed 64-bit int)."""


class ChainErrorCode(enum.Enum):
    MALFORMED = "malformed"
    """Bytes that are not one well-formed transaction or query, or bad arguments."""
    TOO_LARGE = "too_large"
    BAD_SIGNATURE = "bad_signature"
    STALE_NONCE = "stale_nonce"
    """The nonce is not above the sender's last one (a replay or a reordered transaction)."""
    INSUFFICIENT_BALANCE = "insufficient_balance"
    UNKNOWN_METHOD = "unknown_method"
    NOT_MINTER = "not_minter"
    """`mint` sent by someone other than the genesis minter."""
    WRONG_CHAIN = "wrong_chain"
    """A transaction whose chain id is not this chain's (signed for another chain)."""
    OVERFLOW = "overflow"
    """A mint would push the total supply past `MAX_AMOUNT`."""
    NOT_FOUND = "not_found"
    """A query for a block that does not exist."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainError:
    code: ChainErrorCode
    message: str = ""

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}" if self.message else self.code.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Genesis:
    """The chain's fixed configuration: who may mint, the initial balances (sorted by
    account, unique) and a name (so two chains with the same allocation differ). Its hash is
    block 1's previous hash and the chain id every transaction names."""

    minter: bytes
    balances: tuple[tuple[bytes, int], ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        if len(self.minter) != 32:
            raise ValueError("Genesis.minter must be a 32-byte Ed25519 public key")
        accounts = [a for a, _ in self.balances]
        if accounts != sorted(set(accounts)) or any(len(a) != 32 for a in accounts):
            raise ValueError("Genesis.balances must be sorted unique 32-byte accounts")
        if any(not 0 < b <= MAX_AMOUNT for _, b in self.balances) or sum(
                b for _, b in self.balances) > MAX_AMOUNT:
            raise ValueError(f"Genesis balances must be positive and total <= {MAX_AMOUNT}")
        if len(self.name.encode()) > 64:
            raise ValueError("Genesis.name is at most 64 bytes")


# --- queries ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class GetBalance:
    account: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GetNonce:
    account: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GetAccountProof:
    """The account's committed value with an SMT proof against the last block's state root."""

    account: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GetHead:
    """The last block's height, hash and state root."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetBlock:
    height: int


ChainQuery: TypeAlias = GetBalance | GetNonce | GetAccountProof | GetHead | GetBlock


# --- results ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class TxApplied:
    """A transaction executed; `height` is the block it is in (pending until that block
    ends when the replica uses `BatchHooks`)."""

    tx_id: bytes
    height: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Balance:
    account: bytes
    balance: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Nonce:
    account: bytes
    nonce: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountProof:
    """`value` is the account's SMT value (`state.encode_account`) or None when absent;
    `proof` an `smt` proof of it against `state_root`, the root of block `height`."""

    account: bytes
    value: bytes | None
    proof: bytes
    state_root: bytes
    height: int
    block_hash: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    height: int
    block_hash: bytes
    state_root: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockData:
    """One block as stored: `header` is the encoded `block.BlockHeader`, `txs` the raw
    signed transactions in order."""

    header: bytes
    txs: tuple[bytes, ...]


ChainResult: TypeAlias = (
    TxApplied | Balance | Nonce | AccountProof | Head | BlockData | ChainError
)

CHAIN_TYPE_IDS: dict[int, type] = {
    450: ChainError,
    451: Genesis,
    452: GetBalance,
    453: GetNonce,
    454: GetAccountProof,
    455: GetHead,
    456: GetBlock,
    460: TxApplied,
    461: Balance,
    462: Nonce,
    463: AccountProof,
    464: Head,
    465: BlockData,
}
"""Stable codec type ids (466-479 are free for the chain app; 470 is `block.BlockHeader`)."""

REGISTRY = default_registry()
register_all(CHAIN_TYPE_IDS)

_QUERIES = (GetBalance, GetNonce, GetAccountProof, GetHead, GetBlock)
_RESULTS = (TxApplied, Balance, Nonce, AccountProof, Head, BlockData, ChainError)


def encode(obj: ChainQuery | ChainResult | Genesis) -> bytes:
    return REGISTRY.encode(obj)


def decode_query(data: bytes) -> ChainQuery | ChainError:
    """The query `data` encodes, or `ChainError(MALFORMED)`; never raises."""
    try:
        obj = REGISTRY.decode(data)
    except DecodeError as exc:
        return ChainError(code=ChainErrorCode.MALFORMED, message=f"undecodable query: {exc}")
    if not isinstance(obj, _QUERIES):
        return ChainError(code=ChainErrorCode.MALFORMED,
                          message=f"{type(obj).__name__} is not a chain query")
    return obj


def decode_result(data: bytes) -> ChainResult:
    """The result `data` encodes. Raises `DecodeError` (a faulty replica's reply is input)."""
    obj = REGISTRY.decode(data)
    if not isinstance(obj, _RESULTS):
        raise DecodeError(f"{type(obj).__name__} is not a chain result")
    return obj


def decode_genesis(data: bytes) -> Genesis:
    """Raises `DecodeError` when `data` is not one canonical `Genesis`."""
    return REGISTRY.decode(data, expected=Genesis)

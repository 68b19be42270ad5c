"""Typed chain helpers of the client library: `ChainClient` over a `phalanx.client.Client`.

Owns: `ChainClient` (transfer/mint signed with an account key at the right nonce, balance,
nonce, head, block N, account proof) and the typed errors of refused chain transactions:
`ChainCommandError` and one subclass per `ChainErrorCode` (`error_for`). A refused
transaction had no effect (not even on the sender's nonce). A reply that is not a chain
result of the expected type raises `ProtocolViolation` (a buggy or faulty server).

Nonces: a transfer without an explicit nonce reads the sender's last accepted nonce
(linearizable) and uses the next one; two concurrent senders of one account may then
collide, and the later one fails with `StaleNonce` (retry it: it had no effect).

Must not import: trio, the runtime, consensus cores. Talks to nodes only through `Client.call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from phalanx.apps.chain.block import BlockHeader, decode_header
from phalanx.apps.chain.tx import TxBody, public_key, sign
from phalanx.apps.chain.types import (
    AccountProof,
    Balance,
    BlockData,
    ChainError,
    ChainErrorCode,
    ChainResult,
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
from phalanx.client.errors import ProtocolViolation, RequestRejected
from phalanx.net.client_protocol import ReadConsistency
from phalanx.net.codec import DecodeError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.apps.chain.types import ChainQuery
    from phalanx.client.async_client import Client

_R = TypeVar("_R", TxApplied, Balance, Nonce, AccountProof, Head, BlockData)


class ChainCommandError(RequestRejected):
    """The chain refused the transaction or query (a `ChainError` result): no effect."""

    code: ChainErrorCode = ChainErrorCode.MALFORMED

    def __init__(self, error: ChainError) -> None:
        super().__init__(str(error))
        self.code = error.code
        self.error = error


class Malformed(ChainCommandError):
    """Not one well-formed transaction or query (or bad arguments)."""


class TooLarge(ChainCommandError):
    """Over the transaction or query size limit."""


class BadSignature(ChainCommandError):
    """The signature does not verify against the sender's key."""


class StaleNonce(ChainCommandError):
    """The nonce is not above the sender's last accepted one (a replay, or a race)."""


class InsufficientBalance(ChainCommandError):
    """The sender's balance is below the amount."""


class UnknownMethod(ChainCommandError):
    """No such method."""


class NotMinter(ChainCommandError):
    """Only the genesis minter may mint."""


class Overflow(ChainCommandError):
    """The mint would push the total supply over its limit."""


class NotFound(ChainCommandError):
    """No block at that height (yet)."""


class WrongChain(ChainCommandError):
    """The transaction names another chain (its chain id is not this genesis' hash)."""


ERRORS: dict[ChainErrorCode, type[ChainCommandError]] = {
    ChainErrorCode.MALFORMED: Malformed,
    ChainErrorCode.TOO_LARGE: TooLarge,
    ChainErrorCode.BAD_SIGNATURE: BadSignature,
    ChainErrorCode.STALE_NONCE: StaleNonce,
    ChainErrorCode.INSUFFICIENT_BALANCE: InsufficientBalance,
    ChainErrorCode.UNKNOWN_METHOD: UnknownMethod,
    ChainErrorCode.NOT_MINTER: NotMinter,
    ChainErrorCode.OVERFLOW: Overflow,
    ChainErrorCode.NOT_FOUND: NotFound,
    ChainErrorCode.WRONG_CHAIN: WrongChain,
}
"""Every `ChainErrorCode` -> the exception a refusal with it raises."""


def error_for(error: ChainError) -> ChainCommandError:
    """The typed exception of a refusal."""
    return ERRORS.get(error.code, ChainCommandError)(error)


def expect(raw: bytes, kind: type[_R]) -> _R:
    """`raw` decoded as a `kind` result; a `ChainError` raises its typed error, anything
    else `ProtocolViolation`."""
    try:
        result: ChainResult = decode_result(raw)
    except DecodeError as e:
        raise ProtocolViolation(f"undecodable chain result: {e}") from None
    if isinstance(result, ChainError):
        raise error_for(result)
    if not isinstance(result, kind):
        raise ProtocolViolation(f"expected {kind.__name__}, got {type(result).__name__}")
    return result


class ChainClient:
    """Chain calls over `client` (any protocol that orders every command; see `AppSpec`).

    Reads are linearizable unless ``stale=True`` (one node's applied state). Signing
    (`send`, `transfer`, `mint`) needs `chain_id` (`phalanx.apps.chain.block.chain_id` of
    the cluster's genesis): every transaction names its chain."""

    def __init__(self, client: Client, chain_id: bytes | None = None) -> None:
        self.client = client
        self.chain_id = chain_id

    async def query(self, query: ChainQuery, kind: type[_R], *, stale: bool = False) -> _R:
        consistency = ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE
        raw = await self.client.call(encode(query), read_only=True, consistency=consistency)
        return expect(raw, kind)

    async def submit(self, raw: bytes) -> TxApplied:
        """Order one signed transaction; its `TxApplied` (block height) or a typed error."""
        return expect(await self.client.call(raw), TxApplied)

    async def balance(self, account: bytes, *, stale: bool = False) -> int:
        reply = await self.query(GetBalance(account=account), Balance, stale=stale)
        return int(reply.balance)

    async def nonce(self, account: bytes, *, stale: bool = False) -> int:
        """The account's last accepted nonce (0: none yet)."""
        reply = await self.query(GetNonce(account=account), Nonce, stale=stale)
        return int(reply.nonce)

    async def head(self, *, stale: bool = False) -> Head:
        return await self.query(GetHead(), Head, stale=stale)

    async def block(self, height: int, *, stale: bool = False
                    ) -> tuple[BlockHeader, tuple[bytes, ...]]:
        """Block `height`'s header and raw transactions (`NotFound` past the head)."""
        data = await self.query(GetBlock(height=height), BlockData, stale=stale)
        try:
            return decode_header(data.header), data.txs
        except (DecodeError, ValueError) as e:
            raise ProtocolViolation(f"block {height}: undecodable header: {e}") from None

    async def proof(self, account: bytes, *, stale: bool = False) -> AccountProof:
        """The account's value and SMT proof against the last block's state root."""
        return await self.query(GetAccountProof(account=account), AccountProof, stale=stale)

    async def send(self, key: Ed25519PrivateKey, method: str, *args: int | bytes | str,
                   nonce: int | None = None) -> TxApplied:
        """Sign `method(args)` with `key` at `nonce` (default: the last accepted + 1) and
        order it. Raises ValueError when the transaction cannot be built (our misuse)."""
        if self.chain_id is None:
            raise ValueError("ChainClient(client, chain_id=...) is needed to sign: pass "
                             "phalanx.apps.chain.block.chain_id(genesis)")
        sender = public_key(key)
        if nonce is None:
            nonce = await self.nonce(sender) + 1
        tx = sign(key, TxBody(chain_id=self.chain_id, sender=sender, nonce=nonce,
                              method=method, args=args))
        return await self.submit(tx.raw)

    async def transfer(self, key: Ed25519PrivateKey, to: bytes, amount: int, *,
                       nonce: int | None = None, precheck: bool = False) -> TxApplied:
        """Transfer `amount` to `to`. `precheck`: first read the sender's balance and last
        nonce and refuse locally (the same typed errors, nothing sent) when the transfer
        would certainly be refused now; a concurrent transaction can still make the
        chain refuse it."""
        if precheck:
            sender = public_key(key)
            last = await self.nonce(sender)
            if nonce is not None and nonce <= last:
                raise StaleNonce(ChainError(code=ChainErrorCode.STALE_NONCE,
                                            message=f"nonce {nonce} <= last {last}; not sent"))
            have = await self.balance(sender)
            if have < amount:
                raise InsufficientBalance(ChainError(
                    code=ChainErrorCode.INSUFFICIENT_BALANCE,
                    message=f"balance {have} < {amount}; not sent"))
            nonce = last + 1 if nonce is None else nonce
        return await self.send(key, "transfer", to, amount, nonce=nonce)

    async def mint(self, key: Ed25519PrivateKey, to: bytes, amount: int, *,
                   nonce: int | None = None) -> TxApplied:
        return await self.send(key, "mint", to, amount, nonce=nonce)

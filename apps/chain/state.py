"""Accounts, and the execution of one verified transaction against them.

Owns: the account value format (`encode_account`/`decode_account`), the methods a
transaction may call (`METHODS`) and `execute`, a pure function from (accounts, supply,
genesis, transaction) to the changed accounts or a typed `ChainError`.

Must not import: consensus cores, storage, trio, clocks.

Methods:
- ``transfer(to: bytes32, amount: int)``: move `amount` (1..MAX_AMOUNT) from the sender to
  `to` (created on first receipt). Refused with `insufficient_balance` when the sender has
  less.
- ``mint(to: bytes32, amount: int)``: the token contract: only the genesis `minter` may
  create `amount` new units for `to` (`not_minter` otherwise); the total supply never
  exceeds `MAX_AMOUNT` (`overflow`).
Every method first checks the nonce: it must be strictly above the sender's last accepted
nonce (`stale_nonce` otherwise: a replay, or a transaction overtaken by a later one). Gaps are
allowed. A refused transaction changes nothing, not even the nonce.

Invariants:
- The state an account has in the state root is `encode_account(balance, nonce)`: 16 bytes,
  balance then last nonce, each an unsigned 64-bit big-endian int. Accounts are never
  deleted (a zero balance keeps its nonce, so replays stay refused).
- The sum of all balances equals the total supply (transfers conserve it, mints add to both).
- `execute` is deterministic and never raises on a well-formed transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.apps.chain.tx import SignedTransaction
from phalanx.apps.chain.types import MAX_AMOUNT, ChainError, ChainErrorCode, Genesis

METHODS = ("mint", "transfer")
ACCOUNT_BYTES = 16
_ZERO = bytes(ACCOUNT_BYTES)


def encode_account(balance: int, nonce: int) -> bytes:
    return balance.to_bytes(8, "big") + nonce.to_bytes(8, "big")


def decode_account(value: bytes | None) -> tuple[int, int]:
    """(balance, last nonce) of an account value; (0, 0) for an absent account. Raises
    ValueError on a value that is not 16 bytes (only checkpoint data can hold one; restore
    checks first)."""
    if value is None:
        return 0, 0
    if len(value) != ACCOUNT_BYTES:
        raise ValueError(f"an account value is {ACCOUNT_BYTES} bytes, got {len(value)}")
    return int.from_bytes(value[:8], "big"), int.from_bytes(value[8:], "big")


Changes = dict[bytes, bytes]
"""Account -> its new value."""


def execute(accounts: Mapping[bytes, bytes], supply: int, genesis: Genesis,
            tx: SignedTransaction) -> tuple[Changes, int] | ChainError:
    """The account changes `tx` makes and the new total supply, or why it is refused.

    `tx` must be well-formed (`tx.decode_tx`); its signature is the caller's business."""
    if tx.method not in METHODS:
        return ChainError(code=ChainErrorCode.UNKNOWN_METHOD, message=tx.method[:32])
    args = tx.args
    to = args[0] if len(args) == 2 else None
    amount = args[1] if len(args) == 2 else None
    if not (isinstance(to, bytes) and len(to) == 32 and type(amount) is int
            and 0 < amount <= MAX_AMOUNT):
        return ChainError(code=ChainErrorCode.MALFORMED,
                          message=f"{tx.method} takes (to: 32-byte account, amount: "
                                  f"1..{MAX_AMOUNT})")
    balance, last_nonce = decode_account(accounts.get(tx.sender))
    if tx.nonce <= last_nonce:
        return ChainError(code=ChainErrorCode.STALE_NONCE,
                          message=f"nonce {tx.nonce} <= last {last_nonce}")
    if tx.method == "mint":
        if tx.sender != genesis.minter:
            return ChainError(code=ChainErrorCode.NOT_MINTER, message=tx.sender.hex()[:16])
        if supply + amount > MAX_AMOUNT:
            return ChainError(code=ChainErrorCode.OVERFLOW,
                              message=f"supply {supply} + {amount} > {MAX_AMOUNT}")
        changes = {tx.sender: encode_account(balance, tx.nonce)}
        to_balance, to_nonce = decode_account(changes.get(to) or accounts.get(to))
        changes[to] = encode_account(to_balance + amount, to_nonce)
        return changes, supply + amount
    if balance < amount:
        return ChainError(code=ChainErrorCode.INSUFFICIENT_BALANCE,
                          message=f"balance {balance} < {amount}")
    changes = {tx.sender: encode_account(balance - amount, tx.nonce)}
    to_balance, to_nonce = decode_account(changes.get(to) or accounts.get(to))
    changes[to] = encode_account(to_balance + amount, to_nonce)
    return changes, supply

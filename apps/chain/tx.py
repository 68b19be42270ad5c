"""Signed transactions: canonical bytes, ids, signing, and the stateless checks.

Owns: `TxBody` (what a sender signs), `SignedTransaction` (a decoded, well-formed transaction),
`sign`, `decode_tx` (format only) and `verify_stateless` (format, sizes, chain id and
signature: the checks that need no state, so a node runs them when a transaction arrives,
before ordering and off the apply path).

Must not import: consensus cores, storage, trio, clocks.

Wire format (strict msgpack; no maps, floats or ext types; shortest encodings only, enforced
by re-encoding what was decoded and comparing bytes):
    tx   = [body: bin, signature: bin(64)]
    body = [1, chain_id: bin(32), sender: bin(32), nonce: uint64, method: str,
            args: [int | bin | str, ...]]
``tx_id = SHA-256(body)`` and ``signature = Ed25519(sender, tx_id)``. The leading 1 is the
format version; it also keeps a body from ever parsing as another signed structure.
`chain_id` names the chain the sender meant (`block.chain_id(genesis)`, the genesis hash): a
transaction signed for one chain is refused (`wrong_chain`) by every other.

Invariants:
- `decode_tx` and `verify_stateless` never raise on any bytes: they return a `ChainError`.
- Equal transactions are equal bytes (canonical), so `tx_id` identifies the transaction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeAlias

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nacl import bindings as sodium
from nacl.exceptions import BadSignatureError, CryptoError

from phalanx.apps.chain.types import ChainError, ChainErrorCode

MAX_TX_BYTES = 1024
"""Largest encoded transaction."""
MAX_ARGS = 8
MAX_METHOD_BYTES = 32
MAX_NONCE = (1 << 64) - 1
_VERSION = 1
Arg: TypeAlias = int | bytes | str


@dataclass(frozen=True, slots=True, kw_only=True)
class TxBody:
    """What the sender signs. Raises ValueError on values no valid transaction carries
    (our own misuse: peers' bytes go through `decode_tx`)."""

    chain_id: bytes
    """The chain this transaction is for: `block.chain_id(genesis)`."""
    sender: bytes
    nonce: int
    method: str
    args: tuple[Arg, ...] = ()

    def __post_init__(self) -> None:
        problem = _body_problem(self.chain_id, self.sender, self.nonce, self.method, self.args)
        if problem:
            raise ValueError(problem)

    def encode(self) -> bytes:
        return _pack([_VERSION, self.chain_id, self.sender, self.nonce, self.method,
                      list(self.args)])


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedTransaction:
    """A well-formed transaction: `raw` is its exact wire bytes, `tx_id` the hash of its body.
    Built by `sign` or `decode_tx` only (they keep the fields consistent)."""

    chain_id: bytes
    sender: bytes
    nonce: int
    method: str
    args: tuple[Arg, ...]
    signature: bytes
    tx_id: bytes
    raw: bytes

    @property
    def body(self) -> TxBody:
        return TxBody(chain_id=self.chain_id, sender=self.sender, nonce=self.nonce,
                      method=self.method, args=self.args)


def public_key(private_key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key: an account's address."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign(private_key: Ed25519PrivateKey, body: TxBody) -> SignedTransaction:
    """Sign `body` with the sender's key. Raises ValueError when the key is not the sender's
    or the transaction would exceed `MAX_TX_BYTES`."""
    if public_key(private_key) != body.sender:
        raise ValueError("the private key does not belong to body.sender")
    body_bytes = body.encode()
    tx_id = hashlib.sha256(body_bytes).digest()
    signature = private_key.sign(tx_id)
    raw = _pack([body_bytes, signature])
    if len(raw) > MAX_TX_BYTES:
        raise ValueError(f"transaction of {len(raw)} bytes exceeds {MAX_TX_BYTES}")
    return SignedTransaction(chain_id=body.chain_id, sender=body.sender, nonce=body.nonce,
                             method=body.method, args=body.args, signature=signature,
                             tx_id=tx_id, raw=raw)


def decode_tx(raw: bytes) -> SignedTransaction | ChainError:
    """The transaction `raw` encodes, checking format and sizes but NOT the signature."""
    if type(raw) is not bytes:
        return _malformed("a transaction is bytes")
    if len(raw) > MAX_TX_BYTES:
        return ChainError(code=ChainErrorCode.TOO_LARGE,
                          message=f"{len(raw)} bytes > {MAX_TX_BYTES}")
    outer = _unpack(raw)
    if not (type(outer) is list and len(outer) == 2 and type(outer[0]) is bytes
            and type(outer[1]) is bytes and len(outer[1]) == 64):
        return _malformed("a transaction is [body, 64-byte signature]")
    body_bytes, signature = outer
    body = _unpack(body_bytes)
    if not (type(body) is list and len(body) == 6 and type(body[0]) is int
            and body[0] == _VERSION and type(body[5]) is list):
        return _malformed(f"a body is [{_VERSION}, chain_id, sender, nonce, method, args]")
    _, chain, sender, nonce, method, args_list = body
    args = tuple(args_list)
    problem = _body_problem(chain, sender, nonce, method, args)
    if problem:
        return _malformed(problem)
    if _pack(outer) != raw or _pack(body) != body_bytes:
        return _malformed("not the canonical encoding")
    return SignedTransaction(chain_id=chain, sender=sender, nonce=nonce, method=method, args=args,
                             signature=signature, tx_id=hashlib.sha256(body_bytes).digest(),
                             raw=raw)


def verify_signature(tx: SignedTransaction) -> bool:
    """Whether `tx.signature` is the sender's Ed25519 signature of `tx.tx_id`."""
    try:
        sodium.crypto_sign_open(tx.signature + tx.tx_id, tx.sender)
    except (BadSignatureError, CryptoError, ValueError, TypeError):
        return False
    return True


def verify_stateless(raw: bytes, *, chain_id: bytes) -> SignedTransaction | ChainError:
    """Every check that needs no state: format, sizes, the chain id (`wrong_chain` unless it
    is `chain_id`) and the signature. A node runs it when a transaction arrives, before
    ordering (`ChainStateMachine.admit`); see the machine's signature policy for when `apply`
    can then skip the signature."""
    tx = decode_tx(raw)
    if isinstance(tx, ChainError):
        return tx
    if tx.chain_id != chain_id:
        return wrong_chain(tx)
    if not verify_signature(tx):
        return ChainError(code=ChainErrorCode.BAD_SIGNATURE, message=tx.tx_id.hex()[:16])
    return tx


def wrong_chain(tx: SignedTransaction) -> ChainError:
    return ChainError(code=ChainErrorCode.WRONG_CHAIN,
                      message=f"transaction for chain {tx.chain_id.hex()[:16]}")


def _body_problem(chain_id: object, sender: object, nonce: object, method: object,
                  args: tuple[object, ...]) -> str | None:
    if type(chain_id) is not bytes or len(chain_id) != 32:
        return "chain_id must be 32 bytes (the genesis hash)"
    if type(sender) is not bytes or len(sender) != 32:
        return "sender must be a 32-byte Ed25519 public key"
    if type(nonce) is not int or not 0 <= nonce <= MAX_NONCE:
        return "nonce must be an unsigned 64-bit int"
    if type(method) is not str or not 0 < len(method.encode()) <= MAX_METHOD_BYTES:
        return f"method must be a str of 1..{MAX_METHOD_BYTES} bytes"
    if len(args) > MAX_ARGS:
        return f"at most {MAX_ARGS} args"
    for arg in args:
        if type(arg) is int:
            if not -(1 << 63) <= arg <= MAX_NONCE:
                return "int args must fit 64 bits"
        elif type(arg) not in (bytes, str):
            return "args are ints, bytes or strs"
    return None


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _unpack(data: bytes) -> object:
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True,
                               max_map_len=0, max_ext_len=0, max_array_len=16)
    except Exception:  # any malformed bytes: the caller reports MALFORMED
        return None


def _malformed(message: str) -> ChainError:
    return ChainError(code=ChainErrorCode.MALFORMED, message=message)

"""Bytes <-> typed KV commands and results, through the strict codec (`phalanx.net.codec`).

Owns: the registration of the KV types in the default registry, and the four conversion
functions that clients and the KV state machine use.

Must not import: consensus cores, storage, trio, clocks.

Invariants:
- `decode_command` never raises: any bytes that are not exactly one registered KV command
  become a `KvError(MALFORMED)` value, so `KvStateMachine.apply` never raises on input.
- Encodings are canonical (the codec's guarantee), so equal results are equal bytes on every
  replica.
"""

from __future__ import annotations

from phalanx.apps.kv_types import (
    KV_TYPE_IDS,
    CasResult,
    CompareAndSet,
    Delete,
    Deleted,
    Done,
    Get,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Txn,
    TxnResult,
    Value,
)
from phalanx.net.codec import DecodeError, Registry
from phalanx.net.wire import default_registry, register_all

_COMMANDS = (Put, Get, Delete, CompareAndSet, Scan, Txn)
_RESULTS = (Done, Value, Deleted, CasResult, ScanResult, TxnResult, KvError)

REGISTRY: Registry = default_registry()
"""The project's default registry; the KV types live in the apps range (400-499, see
`kv_types.KV_TYPE_IDS`)."""
register_all(KV_TYPE_IDS)


def encode_command(command: KvCommand) -> bytes:
    """The canonical bytes of a command (what a client puts in `ClientRequest.command`)."""
    return REGISTRY.encode(command)


def decode_command(data: bytes) -> KvCommand | KvError:
    """The command `data` encodes, or a `KvError(MALFORMED)` describing why it is not one."""
    try:
        obj = REGISTRY.decode(data)
    except DecodeError as exc:
        return KvError(code=KvErrorCode.MALFORMED, message=f"undecodable KV command: {exc}")
    if not isinstance(obj, _COMMANDS):
        return KvError(
            code=KvErrorCode.MALFORMED, message=f"{type(obj).__name__} is not a KV command"
        )
    return obj


def encode_result(result: KvResult) -> bytes:
    return REGISTRY.encode(result)


def decode_result(data: bytes) -> KvResult:
    """The result `data` encodes. Raises `DecodeError` (a faulty replica's reply is input)."""
    obj = REGISTRY.decode(data)
    if not isinstance(obj, _RESULTS):
        raise DecodeError(f"{type(obj).__name__} is not a KV result")
    return obj

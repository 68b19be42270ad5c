"""Bytes <-> typed KV commands and results, through the strict codec (`phalanx.net.codec`).

Owns: the registration of the KV types in the default registry, and the four conversion
functions that clients and the KV state machine use.

Must not import: consensus cores, storage, trio, clocks.

Invariants:
- `decode_command` never raises: any bytes that are not exactly one registered KV command
  become a `KvError(MALFORMED)` value, so `KvStateMachine.apply` never raises on input.
- Encodings are canonical (the codec's guarantee), so equal results are equal bytes on every
  replica.
- The fast paths (`Put` decoding, `Done` encoding) are exact shortcuts of the registry: a
  `Put` frame is accepted by the fast path only in the one shape the codec accepts, and any
  other bytes fall through to `REGISTRY.decode`, so both paths give equal results and equal
  errors (tested against each other). They exist because replaying a WAL decodes one command
  per entry: the generic decoder costs ~6 us, the shortcut ~1.5 us.
"""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps.kv_types import (
    KV_TYPE_IDS,
    READ_COMMANDS,
    UPDATE_COMMANDS,
    CasResult,
    CompareAndSet,
    CsCompact,
    CsDeliver,
    CsPrune,
    Delete,
    Deleted,
    Done,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    ScanResult,
    Txn,
    TxnResult,
    Value,
    VersionedValue,
    VersionResult,
)
from phalanx.net.codec import DecodeError, Registry
from phalanx.net.wire import default_registry, register_all

_COMMANDS = (Put, Delete, CompareAndSet, Txn, CsDeliver, CsCompact, CsPrune, *READ_COMMANDS,
             *UPDATE_COMMANDS)
_RESULTS = (Done, Value, Deleted, CasResult, ScanResult, TxnResult, KvError, VersionResult,
            VersionedValue)

REGISTRY: Registry = default_registry()
"""The project's default registry; the KV types live in the apps range (400-499, see
`kv_types.KV_TYPE_IDS`)."""
register_all(KV_TYPE_IDS)

_PUT_ID = REGISTRY.type_id(Put)
_DONE_BYTES = REGISTRY.encode(Done())
"""`Done` has no fields, so its canonical encoding is one constant."""


def encode_command(command: KvCommand) -> bytes:
    """The canonical bytes of a command (what a client puts in `ClientRequest.command`)."""
    return REGISTRY.encode(command)


def decode_command(data: bytes) -> KvCommand | KvError:
    """The command `data` encodes, or a `KvError(MALFORMED)` describing why it is not one."""
    put = _decode_put(data)
    if put is not None:
        return put
    try:
        obj = REGISTRY.decode(data)
    except DecodeError as exc:
        return KvError(code=KvErrorCode.MALFORMED, message=f"undecodable KV command: {exc}")
    if not isinstance(obj, _COMMANDS):
        return KvError(
            code=KvErrorCode.MALFORMED, message=f"{type(obj).__name__} is not a KV command"
        )
    return obj


def _decode_put(data: bytes) -> Put | None:
    """`Put` if `data` is exactly a canonical-shape `Put` frame, else None (the caller then runs
    the full decoder, which accepts or rejects it with the precise error)."""
    if len(data) > REGISTRY.max_size:
        return None
    try:
        raw = msgpack.unpackb(data, raw=False, max_map_len=0, max_ext_len=0)
    except Exception:  # malformed: the full decoder names the problem
        return None
    if (
        type(raw) is list
        and len(raw) == 3
        and type(raw[0]) is int
        and raw[0] == _PUT_ID
        and type(raw[1]) is str
        and type(raw[2]) is bytes
    ):
        return Put(key=raw[1], value=raw[2])
    return None


def encode_result(result: KvResult) -> bytes:
    if type(result) is Done:
        return _DONE_BYTES
    return REGISTRY.encode(result)


def decode_result(data: bytes) -> KvResult:
    """The result `data` encodes. Raises `DecodeError` (a faulty replica's reply is input)."""
    obj = REGISTRY.decode(data)
    if not isinstance(obj, _RESULTS):
        raise DecodeError(f"{type(obj).__name__} is not a KV result")
    return obj

"""The KV store's command checks: the size and range limits every command passes before it
runs (`validate`), state-independent, so `admit` can refuse on arrival what `apply` would.

Owns: `validate`, `key_too_large`. Must not import: consensus cores, storage, trio, clocks.
Invariant: a pure function of the command; never raises on a decoded command.
"""

from __future__ import annotations

from phalanx.apps import kv_ops
from phalanx.apps.kv_types import (
    MAX_KEY_BYTES,
    MAX_SCAN_LIMIT,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Add,
    CompareAndSet,
    Concat,
    CsCompact,
    CsDeliver,
    CsPrune,
    KvCommand,
    KvError,
    KvErrorCode,
    Mul,
    Put,
    SAdd,
    Scan,
    SRem,
    Txn,
)


def key_too_large(key: str) -> bool:
    # A code point takes at most 4 bytes of UTF-8: skip the encode for short keys.
    if len(key) * 4 <= MAX_KEY_BYTES:
        return False
    return len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES


def _validate_txn(txn: Txn) -> KvError | None:
    if len(txn.compares) > MAX_TXN_OPS or max(len(txn.success), len(txn.failure)) > MAX_TXN_OPS:
        return KvError(
            code=KvErrorCode.TXN_TOO_LARGE,
            message=f"a txn holds at most {MAX_TXN_OPS} compares and {MAX_TXN_OPS} writes "
            "per branch",
        )
    for compare in txn.compares:
        if key_too_large(compare.key):
            return KvError(
                code=KvErrorCode.KEY_TOO_LARGE, message=f"key exceeds {MAX_KEY_BYTES} bytes"
            )
    for branch in (txn.success, txn.failure):
        seen: set[str] = set()
        for write in branch:
            problem = validate(write)
            if problem is not None:
                return problem
            if write.key in seen:
                return KvError(
                    code=KvErrorCode.DUPLICATE_KEY,
                    message=f"txn branch writes key {write.key!r} twice",
                )
            seen.add(write.key)
    return None


def _validate_delivery(cmd: CsDeliver) -> KvError | None:
    if key_too_large(f"cs/in/{cmd.src_cluster}/{cmd.seq:010d}"):
        return KvError(code=KvErrorCode.KEY_TOO_LARGE, message=f"key exceeds {MAX_KEY_BYTES} bytes")
    if len(cmd.value) > MAX_VALUE_BYTES:
        return KvError(
            code=KvErrorCode.VALUE_TOO_LARGE, message=f"value exceeds {MAX_VALUE_BYTES} bytes"
        )
    return None


def validate(cmd: KvCommand) -> KvError | None:
    """The size and range checks every command passes before it runs (state-independent)."""
    if isinstance(cmd, Txn):
        return _validate_txn(cmd)
    if isinstance(cmd, CsDeliver):
        return _validate_delivery(cmd)
    if isinstance(cmd, (CsCompact, CsPrune)):
        cluster = cmd.dst_cluster if isinstance(cmd, CsCompact) else cmd.src_cluster
        if key_too_large(f"cs/mark/out/{cluster}/{0:010d}"):
            return KvError(code=KvErrorCode.KEY_TOO_LARGE,
                           message=f"key exceeds {MAX_KEY_BYTES} bytes")
        return None
    key = cmd.prefix if isinstance(cmd, Scan) else cmd.key
    if key_too_large(key):
        return KvError(code=KvErrorCode.KEY_TOO_LARGE, message=f"key exceeds {MAX_KEY_BYTES} bytes")
    value = b""
    match cmd:
        case Put(value=value) | CompareAndSet(new=value) | Concat(suffix=value):
            pass
        case SAdd(member=value) | SRem(member=value):
            pass
        case Add(amount=n) | Mul(factor=n) if not kv_ops.INT64_MIN <= n <= kv_ops.INT64_MAX:
            return KvError(
                code=KvErrorCode.INVALID_ARGUMENT,
                message=f"{type(cmd).__name__}: {n} is outside the signed 64-bit range",
            )
    if len(value) > MAX_VALUE_BYTES:
        return KvError(
            code=KvErrorCode.VALUE_TOO_LARGE, message=f"value exceeds {MAX_VALUE_BYTES} bytes"
        )
    if isinstance(cmd, Scan) and not 1 <= cmd.limit <= MAX_SCAN_LIMIT:
        return KvError(
            code=KvErrorCode.INVALID_LIMIT,
            message=f"scan limit must be in 1..{MAX_SCAN_LIMIT}, got {cmd.limit}",
        )
    return None

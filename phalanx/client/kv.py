"""Typed KV helpers of the client library: `put`, `get`, `delete`, `cas`, `scan`, `txn`,
the versions (`version`, `get_versioned`) and the commuting updates (`add`, `mul`, `sadd`,
`srem`, `concat`, and `smembers` to read a set back; see `phalanx.apps.kv_ops`).

Owns: `KvHelpers`, the mixin `phalanx.client.Client` inherits. Each helper encodes one
`phalanx.apps.kv_types` command, sends it through the client's `call` (leader discovery,
retries, PBFT reply matching all happen there) and checks the reply's result type: a
`KvError` result raises `KvCommandError` (no effect), a result of the wrong type raises
`ProtocolViolation` (a buggy or faulty server).
Must not import: trio, the connection pool, consensus cores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TypeVar

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv_types import (
    Add,
    CasResult,
    Compare,
    CompareAndSet,
    Concat,
    Delete,
    Deleted,
    Done,
    Get,
    GetVersion,
    GetVersioned,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Mul,
    Put,
    SAdd,
    Scan,
    ScanResult,
    SRem,
    Txn,
    TxnResult,
    TxnWrite,
    Value,
    VersionedValue,
    VersionResult,
)
from phalanx.client.errors import KvCommandError, ProtocolViolation
from phalanx.net.client_protocol import ReadConsistency
from phalanx.net.codec import DecodeError

_K = TypeVar("_K", Done, Value, Deleted, CasResult, ScanResult, TxnResult, VersionResult,
             VersionedValue)


class KvHelpers(ABC):
    """Typed KV calls over `call`, which `phalanx.client.Client` implements."""

    @abstractmethod
    async def call(
        self,
        command: bytes,
        *,
        read_only: bool = False,
        consistency: ReadConsistency = ReadConsistency.LINEARIZABLE,
    ) -> bytes:
        """Submit one encoded command and return its encoded result (see `Client.call`)."""

    async def _kv(
        self,
        command: KvCommand,
        expected: type[_K],
        *,
        read_only: bool = False,
        stale: bool = False,
    ) -> _K:
        consistency = ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE
        raw = await self.call(
            kv_wire.encode_command(command),
            read_only=read_only,
            consistency=consistency,
        )
        try:
            result: KvResult = kv_wire.decode_result(raw)
        except DecodeError as exc:
            raise ProtocolViolation(f"undecodable KV result: {exc}") from None
        if isinstance(result, KvError):
            raise KvCommandError(result)
        if not isinstance(result, expected):
            raise ProtocolViolation(
                f"{type(command).__name__} answered with {type(result).__name__}"
            )
        return result

    async def put(self, key: str, value: bytes) -> None:
        """Set `key` to `value`."""
        await self._kv(Put(key=key, value=value), Done)

    async def get(
        self, key: str, *, stale: bool = False
    ) -> bytes | None:
        """The value of `key`, or None if absent. Linearizable unless `stale`."""
        result = await self._kv(Get(key=key), Value, read_only=True, stale=stale)
        return result.value

    async def delete(self, key: str) -> bool:
        """Remove `key`; True if it existed."""
        result = await self._kv(Delete(key=key), Deleted)
        return result.existed

    async def cas_result(
        self, key: str, expected: bytes | None, new: bytes
    ) -> CasResult:
        """Compare-and-set with details: whether it swapped and the value afterwards."""
        command = CompareAndSet(key=key, expected=expected, new=new)
        return await self._kv(command, CasResult)

    async def cas(
        self, key: str, expected: bytes | None, new: bytes
    ) -> bool:
        """Set `key` to `new` iff its value is `expected` (None: absent). True if it swapped."""
        return (await self.cas_result(key, expected, new)).succeeded

    async def scan(
        self,
        prefix: str,
        *,
        limit: int = 1000,
        stale: bool = False,
    ) -> list[tuple[str, bytes]]:
        """Up to `limit` (key, value) pairs whose key starts with `prefix`, in key order."""
        result = await self._kv(
            Scan(prefix=prefix, limit=limit), ScanResult, read_only=True, stale=stale,
        )
        return list(result.items)

    async def txn_result(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
    ) -> TxnResult:
        """An atomic transaction with details: whether the compares held, and the compared
        keys' values when evaluated. See `phalanx.apps.kv_types.Txn`."""
        command = Txn(compares=tuple(compares), success=tuple(success), failure=tuple(failure))
        return await self._kv(command, TxnResult)

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
    ) -> bool:
        """Atomically: if every compare holds run `success`, else `failure`. True if they held."""
        return (await self.txn_result(compares, success, failure)).succeeded

    # ------------------------------------------------------------ versions and updates

    async def version(self, key: str, *, stale: bool = False) -> bytes:
        """The version of `key`: SHA-512 of its value, b"" when absent."""
        result = await self._kv(GetVersion(key=key), VersionResult, read_only=True, stale=stale)
        return result.version

    async def get_versioned(
        self, key: str, *, stale: bool = False
    ) -> tuple[bytes | None, bytes]:
        """The value of `key` (None if absent) and its version, read together."""
        result = await self._kv(GetVersioned(key=key), VersionedValue, read_only=True,
                                stale=stale)
        return result.value, result.version

    async def add(self, key: str, amount: int) -> None:
        """Add `amount` to the integer at `key` (absent: 0), wrapping at 64 bits. Raises
        `KvCommandError` (WRONG_TYPE) if the value is not a decimal integer."""
        await self._kv(Add(key=key, amount=amount), Done)

    async def mul(self, key: str, factor: int) -> None:
        """Multiply the integer at `key` (absent: 0) by `factor`, wrapping at 64 bits."""
        await self._kv(Mul(key=key, factor=factor), Done)

    async def sadd(self, key: str, member: bytes) -> None:
        """Add `member` to the set at `key` (absent: empty)."""
        await self._kv(SAdd(key=key, member=member), Done)

    async def srem(self, key: str, member: bytes) -> None:
        """Remove `member` from the set at `key`."""
        await self._kv(SRem(key=key, member=member), Done)

    async def concat(self, key: str, suffix: bytes) -> None:
        """Append `suffix` to the value at `key` (absent: empty)."""
        await self._kv(Concat(key=key, suffix=suffix), Done)

    async def smembers(self, key: str, *, stale: bool = False) -> list[bytes]:
        """The members of the set at `key`, ascending (absent: none). Raises
        `KvCommandError` (WRONG_TYPE) if the value is not a set."""
        value = await self.get(key, stale=stale)
        members = kv_ops.decode_set(value)
        if members is None:
            raise KvCommandError(KvError(code=KvErrorCode.WRONG_TYPE,
                                         message=f"the value of {key!r} is not a set"))
        return members

"""Typed KV helpers of the client library: `put`, `get`, `delete`, `cas`, `scan`, `txn`.

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

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import (
    CasResult,
    Compare,
    CompareAndSet,
    Delete,
    Deleted,
    Done,
    Get,
    KvCommand,
    KvError,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Txn,
    TxnResult,
    TxnWrite,
    Value,
)
from phalanx.client.errors import KvCommandError, ProtocolViolation
from phalanx.net.client_protocol import ReadConsistency
from phalanx.net.codec import DecodeError

_K = TypeVar("_K", Done, Value, Deleted, CasResult, ScanResult, TxnResult)


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

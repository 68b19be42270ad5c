"""Typed KV helpers of the client library: `put`, `get`, `delete`, `cas`, `scan`, `txn`,
the versions (`version`, `get_versioned`) and the commuting updates (`add`, `mul`, `sadd`,
`srem`, `concat`, and `smembers` to read a set back; see `phalanx.apps.kv_ops`).

Owns: `KvHelpers`, the mixin `phalanx.client.Client` inherits. Each helper encodes one
`phalanx.apps.kv_types` command, sends it through the client's `call` (leader discovery,
retries, PBFT reply matching all happen there) and checks the reply's result type: a
`KvError` result raises `KvCommandError` (no effect), a result of the wrong type raises
`ProtocolViolation` (a buggy or faulty server).
Must not import: trio, the connection pool, consensus cores.

Protocols whose clients sign transactions (ENDORSEMENT, the leaderless core; PnyxDB's
"checks on versions"): a command that reads a key, or overwrites it by an update that does
not commute (`put`, `delete`, `cas`, `concat`, `txn`), must carry a requirement on each
such key's version (`requirements={key: version}`, b"" for an absent key), else no correct
node endorses it. When the caller gives none, these helpers read the versions first (f+1
matching STALE `version` reads, `matching_read`) and require them: the write then commits
only if nobody changed the key meanwhile, and otherwise raises `TransactionAborted` (or,
with ``retry_aborted=True``, reads again and tries a new transaction until `timeout` has
passed). `add`, `mul`, `sadd` and `srem` commute with the other updates of their key's run:
when the caller gives no requirement they require the key's BASE version f+1 nodes report
(`BaseVersion`, `agreed_base_version`), so they are ordered after every overwrite their
endorsers applied; an update that switches the run (an add after muls, the srem of a member
added on this base) is refused on a base requirement and aborts: with ``retry_aborted=True``
the helper then requires the FULL version (docs/LEADERLESS.md "Mixing update kinds on one
key"). Linearizable reads (`get`, `version`, `get_versioned`, `smembers`) are
read-only transactions requiring the version f+1 nodes report (retried on abort); `stale`
reads ask one node. A linearizable `scan` is not available there (a prefix has no version).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TypeVar

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv_types import (
    Add,
    CasResult,
    Compare,
    CompareAndSet,
    Concat,
    CsCompact,
    CsDeliver,
    CsPrune,
    Delete,
    Deleted,
    Done,
    Get,
    GetBaseVersion,
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
from phalanx.client.errors import (
    InvalidArgument,
    KvCommandError,
    ProtocolViolation,
    TransactionAborted,
)
from phalanx.net.client_protocol import ReadConsistency
from phalanx.net.codec import DecodeError, EncodeError

_K = TypeVar("_K", Done, Value, Deleted, CasResult, ScanResult, TxnResult, VersionResult,
             VersionedValue)


Requirements = Mapping[str, bytes]
"""Key -> the version it must have where a transaction commits (b"": never written); a
`BaseVersion` value requires the key's base version instead."""


class BaseVersion(bytes):
    """A requirement on a key's BASE version (`Requirement(base=True)`): what a commuting
    update requires, e.g. ``requirements={"hits": BaseVersion(v)}``."""

    __slots__ = ()


def required_keys(command: KvCommand) -> tuple[str, ...]:
    """The keys a transaction of `command` must carry requirements on (ENDORSEMENT): those
    it reads or overwrites by an update that does not commute, sorted (the KV app's
    `needs_requirements`). Raises ValueError for a scan (a prefix has no version)."""
    match command:
        case Add() | Mul() | SAdd() | SRem():
            return ()  # a base requirement (`needs_base`), not a full one
        case Put(key=key) | Delete(key=key) | CompareAndSet(key=key) | Concat(key=key):
            return (key,)
        case (Get(key=key) | GetVersion(key=key) | GetVersioned(key=key)
              | GetBaseVersion(key=key)):
            return (key,)
        case Txn(compares=compares, success=success, failure=failure):
            return tuple(sorted({c.key for c in compares}
                                | {w.key for w in (*success, *failure)}))
        case Scan():
            raise ValueError("a linearizable scan needs versions of a whole prefix, which the "
                             "leaderless protocol does not have: use a stale scan")
        case CsDeliver() | CsCompact() | CsPrune():
            raise ValueError("cluster-sending commands are submitted by the clustersend "
                             "service, which does not run on the leaderless protocol")


class KvHelpers(ABC):
    """Typed KV calls over `call`, which `phalanx.client.Client` implements."""

    signs_transactions: bool = False
    timeout: float

    @abstractmethod
    async def call(
        self,
        command: bytes,
        *,
        read_only: bool = False,
        consistency: ReadConsistency = ReadConsistency.LINEARIZABLE,
        requirements: Mapping[str, bytes] | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """Submit one encoded command and return its encoded result (see `Client.call`)."""

    @abstractmethod
    async def matching_read(self, command: bytes, *, deadline: float | None = None) -> bytes:
        """The result of read-only `command` on which f+1 nodes agree (ENDORSEMENT)."""

    async def _kv(
        self,
        command: KvCommand,
        expected: type[_K],
        *,
        read_only: bool = False,
        stale: bool = False,
        requirements: Requirements | None = None,
    ) -> _K:
        consistency = ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE
        raw = await self.call(
            _encode(command),
            read_only=read_only,
            consistency=consistency,
            requirements=requirements,
        )
        return self._result(command, raw, expected)

    @staticmethod
    def _result(command: KvCommand, raw: bytes, expected: type[_K]) -> _K:
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

    # ------------------------------------------------------------ versions (ENDORSEMENT)

    async def agreed_version(self, key: str) -> bytes:
        """The version of `key` f+1 nodes report from their applied states (ENDORSEMENT):
        one a correct node holds, maybe not the newest."""
        command = GetVersion(key=key)
        raw = await self.matching_read(_encode(command))
        return self._result(command, raw, VersionResult).version

    async def agreed_base_version(self, key: str) -> BaseVersion:
        """The base version of `key` f+1 nodes report (ENDORSEMENT; `GetBaseVersion`)."""
        command = GetBaseVersion(key=key)
        raw = await self.matching_read(_encode(command))
        return BaseVersion(self._result(command, raw, VersionResult).version)

    async def update(self, command: Add | Mul | SAdd | SRem, *,
                     requirements: Requirements | None = None,
                     retry_aborted: bool = False) -> None:
        """Run the commuting update `command` (as `add`/`mul`/`sadd`/`srem` do: on a
        leaderless cluster, with the base version f+1 nodes report unless `requirements`
        are given)."""
        await self._update(command, command.key, requirements, retry_aborted)

    async def _update(self, command: KvCommand, key: str, requirements: Requirements | None,
                      retry_aborted: bool) -> None:
        """A commuting update: the caller's requirements, or (ENDORSEMENT) the base version
        f+1 nodes report; after an abort (a switch of the run is refused on a base
        requirement) the full version, while `retry_aborted` and `timeout` allow."""
        if requirements is not None or not self.signs_transactions:
            await self._kv(command, Done, requirements=requirements)
            return
        encoded = _encode(command)
        give_up = time.monotonic() + self.timeout
        base = True
        while True:
            version = (await self.agreed_base_version(key) if base
                       else await self.agreed_version(key))
            try:
                raw = await self.call(encoded, requirements={key: version})
            except TransactionAborted:
                if not retry_aborted or time.monotonic() >= give_up:
                    raise
                base = False
                continue
            self._result(command, raw, Done)
            return

    async def call_versioned(
        self, command: bytes, keys: Sequence[str], *, read_only: bool = False,
        requirements: Requirements | None = None, retry_aborted: bool = False,
    ) -> bytes:
        """`call` with requirements on `keys`: the caller's `requirements`, or (ENDORSEMENT)
        the versions f+1 nodes report, read again after an abort while `retry_aborted`
        (always for a read: it has no effect) and `timeout` allows."""
        if requirements is not None or not self.signs_transactions or not keys:
            return await self.call(command, read_only=read_only, requirements=requirements)
        give_up = time.monotonic() + self.timeout
        while True:
            versions = {key: await self.agreed_version(key) for key in sorted(set(keys))}
            try:
                return await self.call(command, read_only=read_only, requirements=versions)
            except TransactionAborted:
                if not (retry_aborted or read_only) or time.monotonic() >= give_up:
                    raise

    async def _versioned(
        self, command: KvCommand, expected: type[_K], keys: Sequence[str],
        requirements: Requirements | None, retry_aborted: bool, *, read_only: bool = False,
    ) -> _K:
        raw = await self.call_versioned(_encode(command), keys,
                                        read_only=read_only, requirements=requirements,
                                        retry_aborted=retry_aborted)
        return self._result(command, raw, expected)

    async def _read(self, command: KvCommand, expected: type[_K], key: str, *, stale: bool,
                    requirements: Requirements | None) -> _K:
        if stale:
            return await self._kv(command, expected, read_only=True, stale=True)
        return await self._versioned(command, expected, (key,), requirements, True,
                                     read_only=True)

    # ------------------------------------------------------------ commands

    async def put(self, key: str, value: bytes, *, requirements: Requirements | None = None,
                  retry_aborted: bool = False) -> None:
        """Set `key` to `value`. ENDORSEMENT: requires `key`'s version (see the module)."""
        await self._versioned(Put(key=key, value=value), Done, (key,), requirements,
                              retry_aborted)

    async def get(
        self, key: str, *, stale: bool = False, requirements: Requirements | None = None,
    ) -> bytes | None:
        """The value of `key`, or None if absent. Linearizable unless `stale`."""
        result = await self._read(Get(key=key), Value, key, stale=stale,
                                  requirements=requirements)
        return result.value

    async def delete(self, key: str, *, requirements: Requirements | None = None,
                     retry_aborted: bool = False) -> bool:
        """Remove `key`; True if it existed. ENDORSEMENT: requires `key`'s version."""
        result = await self._versioned(Delete(key=key), Deleted, (key,), requirements,
                                       retry_aborted)
        return result.existed

    async def cas_result(
        self, key: str, expected: bytes | None, new: bytes, *,
        requirements: Requirements | None = None, retry_aborted: bool = False,
    ) -> CasResult:
        """Compare-and-set with details: whether it swapped and the value afterwards."""
        command = CompareAndSet(key=key, expected=expected, new=new)
        return await self._versioned(command, CasResult, (key,), requirements, retry_aborted)

    async def cas(
        self, key: str, expected: bytes | None, new: bytes, *,
        requirements: Requirements | None = None, retry_aborted: bool = False,
    ) -> bool:
        """Set `key` to `new` iff its value is `expected` (None: absent). True if it swapped."""
        return (await self.cas_result(key, expected, new, requirements=requirements,
                                      retry_aborted=retry_aborted)).succeeded

    async def scan(
        self,
        prefix: str,
        *,
        limit: int = 1000,
        stale: bool = False,
    ) -> list[tuple[str, bytes]]:
        """Up to `limit` (key, value) pairs whose key starts with `prefix`, in key order."""
        if self.signs_transactions and not stale:
            required_keys(Scan(prefix=prefix, limit=limit))  # raises: no linearizable scan there
        result = await self._kv(
            Scan(prefix=prefix, limit=limit), ScanResult, read_only=True, stale=stale,
        )
        return list(result.items)

    async def txn_result(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
        *,
        requirements: Requirements | None = None,
        retry_aborted: bool = False,
    ) -> TxnResult:
        """An atomic transaction with details: whether the compares held, and the compared
        keys' values when evaluated. See `phalanx.apps.kv_types.Txn`. ENDORSEMENT: requires
        the version of every key it compares or writes."""
        command = Txn(compares=tuple(compares), success=tuple(success), failure=tuple(failure))
        keys = [c.key for c in compares] + [w.key for w in (*success, *failure)]
        return await self._versioned(command, TxnResult, keys, requirements, retry_aborted)

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
        *,
        requirements: Requirements | None = None,
        retry_aborted: bool = False,
    ) -> bool:
        """Atomically: if every compare holds run `success`, else `failure`. True if they held."""
        return (await self.txn_result(compares, success, failure, requirements=requirements,
                                      retry_aborted=retry_aborted)).succeeded

    # ------------------------------------------------------------ versions and updates

    async def version(self, key: str, *, stale: bool = False,
                      requirements: Requirements | None = None) -> bytes:
        """The version of `key`: SHA-512 of its value, b"" when absent."""
        result = await self._read(GetVersion(key=key), VersionResult, key, stale=stale,
                                  requirements=requirements)
        return result.version

    async def get_versioned(
        self, key: str, *, stale: bool = False, requirements: Requirements | None = None,
    ) -> tuple[bytes | None, bytes]:
        """The value of `key` (None if absent) and its version, read together."""
        result = await self._read(GetVersioned(key=key), VersionedValue, key, stale=stale,
                                  requirements=requirements)
        return result.value, result.version

    async def add(self, key: str, amount: int, *, requirements: Requirements | None = None,
                  retry_aborted: bool = False) -> None:
        """Add `amount` to the integer at `key` (absent: 0), wrapping at 64 bits. Raises
        `KvCommandError` (WRONG_TYPE) if the value is not a decimal integer."""
        await self._update(Add(key=key, amount=amount), key, requirements, retry_aborted)

    async def mul(self, key: str, factor: int, *, requirements: Requirements | None = None,
                  retry_aborted: bool = False) -> None:
        """Multiply the integer at `key` (absent: 0) by `factor`, wrapping at 64 bits."""
        await self._update(Mul(key=key, factor=factor), key, requirements, retry_aborted)

    async def sadd(self, key: str, member: bytes, *, requirements: Requirements | None = None,
                   retry_aborted: bool = False) -> None:
        """Add `member` to the set at `key` (absent: empty)."""
        await self._update(SAdd(key=key, member=member), key, requirements, retry_aborted)

    async def srem(self, key: str, member: bytes, *, requirements: Requirements | None = None,
                   retry_aborted: bool = False) -> None:
        """Remove `member` from the set at `key`."""
        await self._update(SRem(key=key, member=member), key, requirements, retry_aborted)

    async def concat(self, key: str, suffix: bytes, *,
                     requirements: Requirements | None = None,
                     retry_aborted: bool = False) -> None:
        """Append `suffix` to the value at `key` (absent: empty). ENDORSEMENT: requires
        `key`'s version (concatenations do not commute)."""
        await self._versioned(Concat(key=key, suffix=suffix), Done, (key,), requirements,
                              retry_aborted)

    async def smembers(self, key: str, *, stale: bool = False,
                       requirements: Requirements | None = None) -> list[bytes]:
        """The members of the set at `key`, ascending (absent: none). Raises
        `KvCommandError` (WRONG_TYPE) if the value is not a set."""
        value = await self.get(key, stale=stale, requirements=requirements)
        members = kv_ops.decode_set(value)
        if members is None:
            raise KvCommandError(KvError(code=KvErrorCode.WRONG_TYPE,
                                         message=f"the value of {key!r} is not a set"))
        return members


def _encode(command: KvCommand) -> bytes:
    """`command`'s wire bytes; a field of the wrong type is `InvalidArgument` (a client
    error, one line), not the codec's internal `EncodeError`."""
    try:
        return kv_wire.encode_command(command)
    except EncodeError as e:
        raise InvalidArgument(f"{type(command).__name__}: {e}") from None

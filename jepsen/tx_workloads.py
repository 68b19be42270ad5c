"""How the workloads of `phalanx.jepsen.workloads` run on a protocol whose clients sign
transactions (`CallStrategy.ENDORSEMENT`, the leaderless core): `WorkloadConfig.transactions`.

Owns: `TxKvClient` (the slice of `phalanx.client.Client` this path uses) and one executor per
workload: `register`, `bank_read`, `bank_transfer`, `set_add`, `set_read`.

The protocol is linearizable only for transactions that carry requirements on every key they
touch (docs/LEADERLESS.md, "Model"). So every operation a checker reads as linearizable
carries them, and the checkers stay unchanged:
- register: `get` is a read-only transaction requiring the version f+1 nodes report (the
  client retries it on abort); `put` and `cas` require the key's version and, on an abort (a
  newer version committed meanwhile), read again and send a NEW transaction
  (``retry_aborted``: each earlier one aborted definitely, f+1 nodes said so).
- bank: a read of all accounts is one transaction that compares every account and writes
  nothing, with a requirement on every account's version (a consistent snapshot: it commits
  only where all of them hold; `TxnResult.observed` are the balances). A transfer reads both
  balances and versions (f+1 matching `GetVersioned`), then one transaction with requirements
  on both versions that compares both balances and writes both; an abort retries with fresh
  reads (`MAX_RETRIES`), each attempt a new transaction.
- set: `sadd` commutes with itself and needs no requirement (each element applied exactly
  once per transaction id); reads are `smembers`, a read-only transaction requiring the set's
  version.

Outcomes follow `phalanx.jepsen.workloads` (`TransactionAborted` is a `RequestRejected`:
``fail``, it certainly had no effect). Must not import the runtime or consensus cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol, runtime_checkable

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import (
    CasResult,
    Compare,
    GetVersioned,
    KvError,
    Put,
    TxnResult,
    TxnWrite,
    VersionedValue,
)
from phalanx.client.async_client import ClientError, TransactionAborted

MAX_RETRIES: Final = 8
"""Aborted attempts a transfer retries (fresh reads each time) before it gives up."""

Requirements = Mapping[str, bytes]


@runtime_checkable
class TxKvClient(Protocol):
    """What the transaction path calls (all of it `phalanx.client.Client`'s public API)."""

    async def get(self, key: str, *, stale: bool = False,
                  requirements: Requirements | None = None) -> bytes | None: ...
    async def put(self, key: str, value: bytes, *, requirements: Requirements | None = None,
                  retry_aborted: bool = False) -> None: ...
    async def cas_result(self, key: str, expected: bytes | None, new: bytes, *,
                         requirements: Requirements | None = None,
                         retry_aborted: bool = False) -> CasResult: ...
    async def txn_result(self, compares: Sequence[Compare], success: Sequence[TxnWrite],
                         failure: Sequence[TxnWrite] = (), *,
                         requirements: Requirements | None = None,
                         retry_aborted: bool = False) -> TxnResult: ...
    async def sadd(self, key: str, member: bytes, *,
                   requirements: Requirements | None = None) -> None: ...
    async def smembers(self, key: str, *, stale: bool = False,
                       requirements: Requirements | None = None) -> list[bytes]: ...
    async def matching_read(self, command: bytes, *, deadline: float | None = None) -> bytes: ...


def tx_client(client: object) -> TxKvClient:
    """`client` as a `TxKvClient` (TypeError if it lacks the calls: a test double)."""
    if not isinstance(client, TxKvClient):
        raise TypeError(f"{type(client).__name__} cannot sign transactions (the workload's "
                        "config says the protocol needs them)")
    return client


class Contention(Exception):
    """Every attempt aborted: the operation certainly had no effect."""


async def register_write(client: TxKvClient, key: str, value: bytes) -> None:
    await client.put(key, value, retry_aborted=True)


async def register_cas(client: TxKvClient, key: str, expected: bytes | None,
                       new: bytes) -> CasResult:
    return await client.cas_result(key, expected, new, retry_aborted=True)


async def bank_read(client: TxKvClient, keys: Sequence[str]) -> dict[str, bytes | None]:
    """Every key's value from one transaction requiring every key's version."""
    result = await client.txn_result([Compare(key=k, expected=None) for k in keys], [],
                                      retry_aborted=True)
    return dict(zip(keys, result.observed, strict=True))


async def versioned(client: TxKvClient, key: str) -> tuple[bytes | None, bytes]:
    """`key`'s value and version as f+1 nodes report them (a state a correct node held)."""
    raw = await client.matching_read(kv_wire.encode_command(GetVersioned(key=key)))
    result = kv_wire.decode_result(raw)
    if isinstance(result, KvError) or not isinstance(result, VersionedValue):
        raise ValueError(f"GetVersioned({key!r}) answered {result!r}")
    return result.value, result.version


async def bank_transfer(client: TxKvClient, src: str, dst: str, amount: int,
                        parse: _Parse) -> str | None:
    """Move `amount` from `src` to `dst` (keys); None when done, else why it certainly did
    not happen ("insufficient funds", "account missing"). Raises `Contention` after
    `MAX_RETRIES` aborted attempts, `ClientError` as the client does (an error before the
    first transaction was sent is a `NotSent`)."""
    sent = False
    for _ in range(MAX_RETRIES):
        try:
            (a, va), (b, vb) = await versioned(client, src), await versioned(client, dst)
        except ClientError as exc:
            if not sent:
                raise NotSent(exc) from exc
            raise
        if a is None or b is None:
            return "account missing"
        have, other = parse(a), parse(b)
        if have < amount:
            return "insufficient funds"
        sent = True
        try:
            result = await client.txn_result(
                [Compare(key=src, expected=a), Compare(key=dst, expected=b)],
                [Put(key=src, value=str(have - amount).encode()),
                 Put(key=dst, value=str(other + amount).encode())],
                requirements={src: va, dst: vb})
        except TransactionAborted:
            continue  # a newer version of either account committed: read again
        if result.succeeded:
            return None
    raise Contention(f"contention: {MAX_RETRIES} attempts aborted")


class NotSent(Exception):
    """A client error before any transaction was sent: certainly no effect."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(str(error))
        self.error = error


async def set_add(client: TxKvClient, key: str, element: int) -> None:
    await client.sadd(key, str(element).encode())


async def set_read(client: TxKvClient, key: str) -> tuple[int, ...]:
    return tuple(sorted(int(m) for m in await client.smembers(key)))


class _Parse(Protocol):
    def __call__(self, raw: bytes) -> int: ...

"""`SyncClient`: the `phalanx.client.Client` API for programs that are not async.

Owns: one background thread running a trio loop with one `Client` in it, and blocking
methods that run the client's coroutines there (`trio.from_thread.run`).

Must not import: consensus cores, storage, the runtime. Never pickles.

Rules:
- Thread-safe: any number of caller threads may call at once; their calls are pipelined by
  the one `Client` exactly as concurrent trio tasks would be (each write on its own lane).
- Errors are the async client's (`ClientTimeout`, `RequestRejected`, ...), raised in the
  calling thread. After `close()`, every call raises `ClientClosed`.
- `close()` cancels calls still in flight (they raise `ClientClosed`) and joins the thread;
  it is idempotent. Use the client as a context manager so it always runs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar, Unpack

import trio

from phalanx.apps.kv_types import CasResult, Compare, TxnResult, TxnWrite
from phalanx.client.async_client import (
    Client,
    ClientClosed,
    ClientOptions,
    ClientStatistics,
    NodeAddress,
    open_client,
)
from phalanx.client.kv import Requirements
from phalanx.client.latency import LatencySnapshot
from phalanx.net.client_protocol import ReadConsistency, StatusReply
from phalanx.ops.node_config import ClusterConfig

__all__ = ["SyncClient"]

_T = TypeVar("_T")


class SyncClient:
    """A blocking client on a background trio thread. Same arguments as `open_client`.

    Usage::

        with SyncClient("cluster-dir") as client:
            client.put("k", b"v")
            assert client.get("k") == b"v"

    Raises (from the constructor): whatever `open_client` raises for bad arguments or an
    invalid cluster directory.
    """

    def __init__(
        self,
        cluster: ClusterConfig | str | Path | Sequence[NodeAddress],
        **options: Unpack[ClientOptions],
    ) -> None:
        self._client: Client | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._errors: list[BaseException] = []  # at most one: why opening failed
        self._ready = threading.Event()
        self._closed = False
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, cluster, options), name="phalanx-client",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._errors:
            self._thread.join()
            raise self._errors[0]

    @classmethod
    def connect(
        cluster: type[SyncClient],
        where: ClusterConfig | str | Path | Sequence[NodeAddress],
        **options: Unpack[ClientOptions],
    ) -> SyncClient:
        """``with SyncClient.connect(cluster_dir) as client:`` — the same as the constructor."""
        return cluster(where, **options)

    async def _main(
        self, cluster: ClusterConfig | str | Path | Sequence[NodeAddress], options: ClientOptions
    ) -> None:
        try:
            async with open_client(cluster, **options) as client:
                self._client = client
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # reported to the constructor's thread, not lost
            if self._ready.is_set():
                raise
            self._errors.append(exc)
            self._ready.set()

    def _run(self, fn: Callable[..., Awaitable[_T]], *args: object, **kwargs: object) -> _T:
        if self._closed or self._token is None:
            raise ClientClosed("client is closed")
        try:
            return trio.from_thread.run(functools.partial(fn, *args, **kwargs),
                                        trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosed("client is closed") from None

    @property
    def client(self) -> Client:
        """The underlying async client (for its attributes; call it only via this wrapper)."""
        if self._client is None:
            raise ClientClosed("client is closed")
        return self._client

    def close(self) -> None:
        """Stop the background loop; calls in flight raise `ClientClosed`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):  # the loop already ended
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the client's API

    def call(
        self,
        command: bytes,
        *,
        read_only: bool = False,
        consistency: ReadConsistency = ReadConsistency.LINEARIZABLE,
        requirements: Requirements | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """See `Client.call`."""
        return self._run(self.client.call, command, read_only=read_only,
                         consistency=consistency, requirements=requirements, deadline=deadline)

    def put(self, key: str, value: bytes,
            *, requirements: Requirements | None = None, retry_aborted: bool = False) -> None:
        self._run(self.client.put, key, value, requirements=requirements,
                         retry_aborted=retry_aborted)

    def get(self, key: str, *, stale: bool = False,
            requirements: Requirements | None = None) -> bytes | None:
        return self._run(self.client.get, key, stale=stale, requirements=requirements)

    def delete(self, key: str,
            *, requirements: Requirements | None = None, retry_aborted: bool = False) -> bool:
        return self._run(self.client.delete, key, requirements=requirements,
                         retry_aborted=retry_aborted)

    def cas(self, key: str, expected: bytes | None, new: bytes,
            *, requirements: Requirements | None = None, retry_aborted: bool = False) -> bool:
        return self._run(self.client.cas, key, expected, new, requirements=requirements,
                         retry_aborted=retry_aborted)

    def cas_result(self, key: str, expected: bytes | None, new: bytes,
            *, requirements: Requirements | None = None, retry_aborted: bool = False) -> CasResult:
        return self._run(self.client.cas_result, key, expected, new, requirements=requirements,
                         retry_aborted=retry_aborted)

    def scan(
        self, prefix: str, *, limit: int = 1000, stale: bool = False
    ) -> list[tuple[str, bytes]]:
        return self._run(self.client.scan, prefix, limit=limit, stale=stale)

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
        *, requirements: Requirements | None = None, retry_aborted: bool = False,
    ) -> bool:
        return self._run(self.client.txn, compares, success, failure,
                         requirements=requirements, retry_aborted=retry_aborted)

    def txn_result(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
        *, requirements: Requirements | None = None, retry_aborted: bool = False,
    ) -> TxnResult:
        return self._run(self.client.txn_result, compares, success, failure,
                         requirements=requirements, retry_aborted=retry_aborted)

    def version(self, key: str, *, stale: bool = False,
            requirements: Requirements | None = None) -> bytes:
        return self._run(self.client.version, key, stale=stale, requirements=requirements)

    def get_versioned(self, key: str, *, stale: bool = False,
            requirements: Requirements | None = None) -> tuple[bytes | None, bytes]:
        return self._run(self.client.get_versioned, key, stale=stale, requirements=requirements)

    def add(self, key: str, amount: int, *, requirements: Requirements | None = None,
            retry_aborted: bool = False) -> None:
        self._run(self.client.add, key, amount, requirements=requirements,
                  retry_aborted=retry_aborted)

    def mul(self, key: str, factor: int, *, requirements: Requirements | None = None,
            retry_aborted: bool = False) -> None:
        self._run(self.client.mul, key, factor, requirements=requirements,
                  retry_aborted=retry_aborted)

    def sadd(self, key: str, member: bytes, *, requirements: Requirements | None = None,
            retry_aborted: bool = False) -> None:
        self._run(self.client.sadd, key, member, requirements=requirements,
                  retry_aborted=retry_aborted)

    def srem(self, key: str, member: bytes, *, requirements: Requirements | None = None,
            retry_aborted: bool = False) -> None:
        self._run(self.client.srem, key, member, requirements=requirements,
                  retry_aborted=retry_aborted)

    def concat(self, key: str, suffix: bytes,
            *, requirements: Requirements | None = None, retry_aborted: bool = False) -> None:
        self._run(self.client.concat, key, suffix, requirements=requirements,
                         retry_aborted=retry_aborted)

    def smembers(self, key: str, *, stale: bool = False,
            requirements: Requirements | None = None) -> list[bytes]:
        return self._run(self.client.smembers, key, stale=stale, requirements=requirements)

    def status(self, node: str) -> StatusReply:
        return self._run(self.client.status, node)

    def statistics(self) -> ClientStatistics:
        return self.client.statistics()

    def latency(self) -> Mapping[tuple[str, str], LatencySnapshot]:
        """Call latencies by (kind, outcome) (`Client.latency`)."""
        return self.client.latency()

    @property
    def leader(self) -> str:
        return self.client.leader

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.client.nodes

"""Where the driver persists a batch of Readys: on a worker thread or on the core task.

Owns: `PersistPipeline`, the part of `phalanx.runtime.driver.Driver` (a base class of it) that takes
the Readys queued in step order (`_pending`) and carries out step 1 of the `Ready` ordering
rule for them as one batch through the `GroupCommitter`: on a worker thread
(`trio.to_thread.run_sync`, the loop keeps stepping meanwhile; the result comes back as a
`_BatchDone` item of the input channel), or on the core task (`persist_inline` with fsync
off, or `idle_inline` for a small batch while no input waits). Readys at the head of a batch
that write nothing durable complete at once. Then `Driver._complete` (`driver_apply`)
carries out steps 2-5. Before any write starts (`_before_write`), the replies handed out so
far and the early messages the driver holds are released, so neither waits behind a write.

Must not import: sockets, TLS, prometheus, any consensus core, `phalanx.runtime.driver`.

Invariants: at most one batch is on the worker thread (`_inflight`); while it is, the
replica and the WAL are not touched by the core task and nothing else is persisted; a
batch is completed only after it is durable, strictly in step order.

Storage failures (disk full, EIO: `StorageError`/`OSError` from a write or fsync) never stop
the node. The failed batch stays `_inflight` (nothing after it persists; none of its
messages leave, so a follower acknowledges nothing it could not persist) and the driver is
*storage-unavailable* (`_storage_error`, see `phalanx.runtime.driver`): the core is no longer
stepped (to its peers the node looks paused: a leader stops heartbeating and the others
elect a new one), client writes and linearizable reads are answered
`ReplyStatus.UNAVAILABLE` ("storage unavailable: No space left on device"), stale reads are
still served. Every `STORAGE_RETRY_TICKS` the batch is tried again on the worker thread
(`GroupCommitter.retry`: WAL rewound to its last durable record, batch rewritten, synced);
once that succeeds, the batch completes and the node carries on where it stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from phalanx.consensus.core import Ready, snapshot_bytes
from phalanx.consensus.types import NodeId
from phalanx.runtime.driver_stats import DriverObserver, DriverStatistics
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.phase_trace import PhaseTrace
from phalanx.runtime.piece_manifest import is_manifest
from phalanx.runtime.piece_transfer import PieceTransfer
from phalanx.storage.interface import StorageError

logger = logging.getLogger(__name__)

IDLE_INLINE_READYS = 8
"""The largest batch `idle_inline` persists on the core task."""

EARLY_WRITE_CHECKPOINTS = 3
"""Scheduling points the core loop yields, after handing out messages or replies, before it
may block on an inline write. A woken link or client-port writer task reaches its socket
write in one step (`phalanx.net.tls_stream.TlsStream` takes no lock and does not checkpoint
before writing), and the tasks of one scheduler batch run in either order, so two yields let
it write; one more is margin (each costs a pass of trio's run loop)."""


STORAGE_RETRY_TICKS = 100
"""Ticks between attempts to persist a batch after a storage failure (1 s at 10 ms ticks)."""


def storage_error_text(error: BaseException) -> str:
    """`error` for a client: the OS's own words where an `OSError` caused it ("No space
    left on device"), else the error's message."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__
    return str(error)


def is_storage_failure(error: BaseException) -> bool:
    """Whether persisting failed on the storage itself (not a bug of ours)."""
    return isinstance(error, StorageError | OSError)


@dataclass(frozen=True, slots=True)
class _BatchDone:
    batch: Sequence[Ready]
    error: BaseException | None
    retry: bool = False


class PersistPipeline:
    """Step 1 for `Driver`, which provides the state and helpers declared here.

    Shard-level state transfer (`fetch_pieces_with`): a batch whose Ready installs a
    snapshot that is a piece manifest (`phalanx.runtime.piece_manifest`) goes to the worker
    thread only after `PieceTransfer.resolve` fetched the pieces it names (meanwhile it is
    `_inflight`: nothing after it persists, client writes are answered RETRY as during any
    snapshot install)."""

    _pieces: PieceTransfer | None = None

    def fetch_pieces_with(self, pieces: PieceTransfer) -> None:
        """Resolve piece manifests through `pieces` before installing them."""
        self._pieces = pieces

    def _manifests(self, batch: Sequence[Ready]) -> list[bytes]:
        if self._pieces is None:
            return []
        found = []
        for ready in batch:
            if ready.snapshot is not None:
                data = snapshot_bytes(ready.snapshot.data)
                if is_manifest(data):
                    found.append(data)
        return found

    async def _fetch_then_persist(self, batch: Sequence[Ready], manifests: list[bytes],
                                  flush_commit: bool, retry: bool = False) -> None:
        """`_persist_batch` once the pieces of `manifests` are fetched (a storage failure
        reading our own store is reported like a failed write: held and retried)."""
        assert self._pieces is not None  # our own misuse: `_manifests` found them
        for data in manifests:
            start = time.perf_counter()
            try:
                await self._pieces.resolve(data)
            except Exception as exc:  # storage failure: reported to the core loop
                await self._post(_BatchDone(batch, exc, retry))
                return
            stats = self._pieces.stats
            logger.info("%s: fetched checkpoint pieces in %.2f s (%d fetched, %d bytes; %d "
                        "own)", self.node_id, time.perf_counter() - start,
                        stats.fetched_pieces, stats.fetched_bytes, stats.reused_pieces)
        await self._persist_batch(batch, flush_commit, retry)

    committer: GroupCommitter
    stats: DriverStatistics
    _observer: DriverObserver | None
    _trace: PhaseTrace | None
    _queued_inputs: Callable[[], int]
    _post: Callable[[_BatchDone], Awaitable[None]]
    _pending: list[Ready]
    _inflight: Sequence[Ready] | None
    _inflight_snapshot: bool
    _persist_inline: bool
    _idle_inline: bool
    _unsent_output: bool
    """Messages or client replies were handed out since the core loop last yielded for the
    tasks that write them (`EARLY_WRITE_CHECKPOINTS`)."""
    _output_pending: Callable[[], bool]
    _after_pass: Callable[[], None]
    _release_early: Callable[[], None]
    """Hands the early messages held so far to the transport (`Driver._release_early`)."""
    _flush_sends: Callable[[], None]
    """Writes what the transport held (one write per peer)."""
    _just_yielded: bool
    _flush_again: bool
    node_id: NodeId
    _nursery: trio.Nursery | None
    _complete: Callable[[Sequence[Ready]], None]
    _fail_waiters: Callable[[str], None]
    _ticks: int
    _storage_error: str | None
    """Set while storage is unavailable: what clients are told (module docstring)."""
    _retry_at: int
    _retrying: bool

    async def _persist_batch(self, batch: Sequence[Ready], flush_commit: bool,
                             retry: bool = False) -> None:
        committer = self.committer

        spent = [0.0]

        def work() -> bool:
            begin = time.perf_counter()
            synced = committer.retry(batch) if retry else committer.persist(batch)
            if flush_commit and not retry:
                committer.flush_commit()
            spent[0] = time.perf_counter() - begin
            return synced

        error: BaseException | None = None
        start = time.perf_counter()
        try:
            synced = await trio.to_thread.run_sync(work)
        except Exception as exc:  # storage failure: reported to the core loop, which stops
            error = exc
            synced = False
        if self._trace is not None:
            self._trace.mark("io_work", f"{spent[0] * 1e6:.0f}us {'sync' if synced else 'nosync'}")
        if synced:
            self.stats.fsyncs += 1
            if self._observer is not None:
                self._observer.on_fsync(time.perf_counter() - start, len(batch))
        await self._post(_BatchDone(batch, error, retry))

    def _storage_failed(self, batch: Sequence[Ready], error: BaseException) -> None:
        """`batch` could not be made durable: hold it and become storage-unavailable."""
        first = self._storage_error is None
        self._storage_error = f"storage unavailable: {storage_error_text(error)}"
        self._inflight = batch
        self._retrying = False
        self._retry_at = self._ticks + STORAGE_RETRY_TICKS
        self.stats.storage_failures += 1
        if first:
            logger.critical("%s: persisting failed (%s); refusing writes and retrying every "
                            "%d ticks", self.node_id, error, STORAGE_RETRY_TICKS)
            self._fail_waiters(self._storage_error)

    def _storage_tick(self) -> None:
        """A tick while storage is unavailable: retry the held batch when due."""
        if self._retrying or self._ticks < self._retry_at or self._inflight is None:
            return
        assert self._nursery is not None, "Driver.run is not running"  # our own misuse
        self._retrying = True
        manifests = self._manifests(self._inflight)
        if manifests:
            self._nursery.start_soon(self._fetch_then_persist, self._inflight, manifests,
                                     False, True)
            return
        self._nursery.start_soon(self._persist_batch, self._inflight, False, True)

    def _flush(self) -> None:
        while self._inflight is None and self._pending:
            batch = self._pending
            if self._idle_inline and self._inline_now(batch):
                needs_io = self.committer.needs_io(batch)
                if needs_io:
                    self._before_write()
                    if (self._unsent_output and not self._just_yielded
                            and self._output_pending()):
                        # Messages or replies this task handed out are not written yet
                        # (the transport and client connections write from their own
                        # tasks): let them go before the fsync blocks the event loop. The
                        # core loop yields, then flushes again (at least one batch per
                        # yield: no starvation).
                        self._flush_again = True
                        if self._trace is not None:
                            self._trace.mark("yield_for_output")
                        break
                self._pending = []
                self._just_yielded = False
                if needs_io:
                    if not self._persist_here(batch):
                        break
                else:  # only deferrable hard states (commit notices): nothing to write
                    self.committer.note_deferred(batch)
                self._complete(batch)
                continue
            self._pending = []
            if self._persist_inline and not self._manifests(batch):
                self._before_write()
                if not self._persist_here(batch):
                    break
                self._complete(batch)
                continue
            # Readys at the head that write nothing durable (commit notices, heartbeat
            # answers, applies) complete now instead of waiting behind the next fsync.
            head = 0
            committer = self.committer
            while head < len(batch) and not committer.needs_io(batch[head: head + 1]):
                head += 1
            if head:
                done, batch = batch[:head], batch[head:]
                committer.note_deferred(done)
                self._complete(done)
                self._pending[:0] = batch  # Readys the completion stepped stay behind them
                continue
            self._start_io(batch, flush_commit=False)
        self.stats.pending_readys = len(self._pending)

    def _before_write(self) -> None:
        """Before a write starts: the pass's replies so far, then its early messages (a
        leader's AppendEntries), leave; they never wait behind the write."""
        self._after_pass()
        self._release_early()
        self._flush_sends()

    def _inline_now(self, batch: Sequence[Ready]) -> bool:
        """Whether to persist `batch` on the core task: it is small, installs no snapshot,
        and no input waits (so there is nothing to step while the fsync runs, and the two
        thread hand-offs, each of which can wait out a GIL switch interval, are saved)."""
        if len(batch) > IDLE_INLINE_READYS or self._queued_inputs():
            return False
        return all(r.snapshot is None for r in batch)

    def _persist_here(self, batch: Sequence[Ready]) -> bool:
        """Step 1 on the core task (blocking it for the write and fsync); False when the
        storage failed (the batch is held: `_storage_failed`)."""
        start = time.perf_counter()
        if self._trace is not None:
            self._trace.mark("io_inline", str(len(batch)))
        try:
            synced = self.committer.persist(batch)
        except Exception as exc:
            if not is_storage_failure(exc):
                raise
            self._storage_failed(batch, exc)
            return False
        if self._trace is not None:
            self._trace.mark("io_work", f"{(time.perf_counter() - start) * 1e6:.0f}us "
                             f"{'sync' if synced else 'nosync'}")
        if synced:
            self.stats.fsyncs += 1
            if self._observer is not None:
                self._observer.on_fsync(time.perf_counter() - start, len(batch))
        return True

    def _start_io(self, batch: Sequence[Ready], *, flush_commit: bool) -> None:
        assert self._nursery is not None, "Driver.run is not running"  # our own misuse
        self._before_write()
        self._inflight = batch
        if self._trace is not None:
            self._trace.mark("io_start", str(len(batch)))
        self._inflight_snapshot = any(r.snapshot is not None for r in batch)
        self.stats.io_batches += 1
        manifests = self._manifests(batch) if self._inflight_snapshot else []
        if manifests:
            self._nursery.start_soon(self._fetch_then_persist, batch, manifests, flush_commit)
            return
        self._nursery.start_soon(self._persist_batch, batch, flush_commit)

"""Group commit: step 1 of the `Ready` ordering rule for a batch of Readys, with one fsync.

Owns: `GroupCommitter`, the synchronous half of the runtime's persistence. The trio driver
(`phalanx.runtime.driver`) collects the Readys a core returns while the previous batch is being made
durable, then hands the whole batch to `GroupCommitter.persist` on a worker thread; this
module decides what the batch needs and carries it out through the shared
`phalanx.runtime.persistence.ReadyPersister` (the same code the simulator persists with).

Must not import: trio, sockets, clocks, any consensus core. Callable from any one thread at a
time (the driver guarantees no other storage access runs concurrently).

Rules and invariants:
- A batch is persisted in Ready order: snapshots, truncations and entries of each Ready go to
  the WAL exactly as `ReadyPersister.persist` writes them (`persist_log`, the same code), but
  no Ready syncs on its own; the batch ends with one `wal.sync()` when any of its Readys
  `must_sync`.
- Hard states replace each other, so only the LAST hard state of a batch is written; so do
  core states (`Ready.core_state`, PBFT): only the last one of a batch is written. A hard
  state that differs from the last one written only in `commit` is *deferred*: restoring
  `commit` is an optimisation, never a safety requirement (`HardState` docstring), and writing
  it costs two fsyncs (temp file + directory). It is written with the next term or vote change,
  or when the driver asks (`flush_commit`, e.g. periodically and at clean shutdown).
- After a storage failure (disk full, EIO) nothing of the failed batch is trusted:
  `retry(batch)` rewinds the WAL to its last durable record and writes the batch again,
  hard state included, then syncs (`phalanx.runtime.driver` retries until it succeeds).
- `needs_io(batch)` is False exactly when persisting the batch would write nothing durable
  (only deferrable hard states): the driver then skips the worker thread altogether.
- Two fsyncs at once (`overlap_wal_sync`, set by `phalanx.runtime.node`, whose core-state
  journal lives in its own `Directory` object): a batch that must sync, wrote log records
  since the WAL's last sync (`wal_unsynced`) and writes a core state through a
  `StateJournal` (which fsyncs its own file) and no hard state syncs the WAL on a helper
  thread while the journal is written and fsynced (different files, different `Directory`
  objects: nothing shared; `OsDirectory` is not thread-safe), and returns once both are
  durable. On one ext4 disk two concurrent fsyncs cost about one (the second joins the
  first's journal commit): the leaderless core's batches carry released entries and its
  record together (docs/LEADERLESS.md "Round 6"). Any other batch syncs as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from phalanx.consensus.core import Ready
from phalanx.consensus.types import HardState, SnapshotMeta
from phalanx.runtime.persistence import ReadyPersister, StateJournal, commit_only_change


class GroupCommitter:
    """Persists batches of Readys with at most one WAL fsync per batch.

    Args:
        persister: the shared Ready persister over this node's storage.
        install: the replica layer's `install` (restores the state machine from a snapshot
            and stores the checkpoint); None stores the checkpoint only.
        saved: the hard state found on disk at start (None if none).
        overlap_wal_sync: fsync the WAL beside the core-state journal (module docstring);
            only when that journal's `Directory` object is not the WAL's.
    """

    def __init__(
        self,
        persister: ReadyPersister,
        *,
        install: Callable[[SnapshotMeta, bytes], None] | None,
        saved: HardState | None,
        overlap_wal_sync: bool = False,
    ) -> None:
        self.persister = persister
        self._install = install
        self._saved = saved if saved is not None else HardState()
        self._latest = self._saved
        self.batches = 0
        self.syncs = 0
        self.hard_state_writes = 0
        self.wal_unsynced = False
        """Log records were written since the WAL's last sync (by this committer)."""
        self.overlapped_syncs = 0
        """WAL fsyncs run beside the core-state journal's (module docstring)."""
        self._overlap = overlap_wal_sync
        self._helper: ThreadPoolExecutor | None = None

    @property
    def saved_hard_state(self) -> HardState:
        """The hard state last written durably."""
        return self._saved

    def _must_write(self, hs: HardState) -> bool:
        return not commit_only_change(self._saved, hs)

    def needs_io(self, batch: Sequence[Ready]) -> bool:
        """Whether persisting `batch` writes anything (False: only deferred hard states)."""
        for ready in batch:
            if (
                ready.snapshot is not None
                or ready.truncate_from is not None
                or ready.entries
                or ready.core_state is not None
                or ready.must_sync
                or (ready.hard_state is not None and self._must_write(ready.hard_state))
            ):
                return True
        return False

    def note_deferred(self, batch: Sequence[Ready]) -> None:
        """Record the hard states of a batch that `needs_io` judged deferrable."""
        for ready in batch:
            if ready.hard_state is not None:
                self._latest = ready.hard_state

    def persist(self, batch: Sequence[Ready], *, again: bool = False) -> bool:
        """Carry out step 1 for every Ready of `batch`, in order; returns whether it fsynced.

        Raises whatever the storage raises (`StorageError`, `OSError`). Nothing of a failed
        batch counts as durable (after a failed write or fsync the disk's contents are
        unknown): the driver holds the batch back and calls `retry(batch)` later.
        """
        persister = self.persister
        must_sync = False
        hs: HardState | None = None
        core_state: object | None = None
        for ready in batch:
            if ready.hard_state is not None:
                hs = ready.hard_state
            if ready.core_state is not None:
                core_state = ready.core_state  # each replaces the last: write only the newest
            must_sync = must_sync or ready.must_sync
            if ready.snapshot is not None or ready.truncate_from is not None or ready.entries:
                self.wal_unsynced = True
                persister.persist_log(ready, install=self._install, again=again)
        if hs is not None:
            self._latest = hs
        write_hs = hs is not None and self._must_write(hs)
        if (self._overlap and must_sync and core_state is not None and not write_hs
                and self.wal_unsynced and isinstance(persister.core_state, StateJournal)):
            self._journal_beside_wal_sync(core_state)
        else:
            if core_state is not None:
                persister.persist(Ready(core_state=core_state))
            if write_hs:
                assert hs is not None  # write_hs says so
                self._write_hard_state(hs)
            if must_sync:
                persister.wal.sync()
        if must_sync:
            self.syncs += 1
            self.wal_unsynced = False
        self.batches += 1
        return must_sync

    def _journal_beside_wal_sync(self, core_state: object) -> None:
        """Write (and fsync) the core-state journal while a helper thread fsyncs the WAL;
        return once both are durable. Raises the journal's error, else the WAL's."""
        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-sync")
        persister = self.persister
        journal = persister.core_state
        assert isinstance(journal, StateJournal)  # our caller checked
        wal_synced = self._helper.submit(persister.wal.sync)
        try:
            journal.save_state(core_state)  # appends and fsyncs; touches no WAL file
        finally:
            wal_error = wal_synced.exception()  # waits for the fsync
        if wal_error is not None:
            raise wal_error
        self.overlapped_syncs += 1

    def retry(self, batch: Sequence[Ready]) -> bool:
        """Persist a batch whose earlier attempt failed: rewind the WAL to its last durable
        record (`WriteAheadLog.rewind`: nothing written after the last successful fsync is
        trusted), then write the whole batch again and sync it. Raises as `persist` does
        (the batch is still not durable then)."""
        self.persister.wal.rewind()
        self.persist(batch, again=True)
        self._write_hard_state(self._latest)  # a failed save may have left either value
        self.persister.wal.sync()
        self.syncs += 1
        self.wal_unsynced = False
        return True

    def flush_commit_due(self) -> bool:
        """Whether a commit-only hard state is waiting to be written."""
        return self._latest != self._saved

    def flush_commit(self) -> bool:
        """Write a deferred commit-only hard state, if any; returns whether it wrote."""
        if self._latest == self._saved:
            return False
        self._write_hard_state(self._latest)
        return True

    def _write_hard_state(self, hs: HardState) -> None:
        self.persister.hard_state.save(self.persister.codec.encode(hs))
        self._saved = hs
        self.hard_state_writes += 1

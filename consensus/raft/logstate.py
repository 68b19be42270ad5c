"""The log of a Raft node and how far it is committed, applied and durable (§3.5, §3.6.2,
§4.1, §5.3).

Owns: `LogState`: the in-memory `RaftLog`, `commit`, `applied`, `durable` and the Readys not
yet `Persisted` (`pending_durable`), the latest checkpoint (`snapshot`), the configuration
in force (`config`, with its quorum math `joint`), and the log changes a step's Ready must
persist (`new_entries`, `truncate`, `snap_out`; the core hands them over and resets them).

Invariants:
- log.offset <= applied <= commit <= last index; `commit` never decreases.
- Entries 1..durable of the in-memory log are durable on disk; the indexes recorded in
  `pending_durable` never exceed the current log (truncation lowers them).
- Only entries above `commit` are ever truncated (our own misuse otherwise raises).
- `config` is the latest configuration in the log (Ref: §4.1: in force once appended),
  `joint == JointConfig.of(config)`; after every change `on_config` runs (set by the core:
  the leader's progress tracking follows the configuration).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from phalanx.consensus.core import Snapshot, SnapshotData
from phalanx.consensus.quorum import JointConfig
from phalanx.consensus.raft.config import RaftConfig, RaftRestoredState
from phalanx.consensus.raft.log import RaftLog
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    SnapshotMeta,
)

_CONFIG = EntryKind.CONFIG


def _unwired() -> None:
    raise LocalProtocolError("LogState.on_config not wired (RaftCore sets it)")


class LogState:
    """The log, its commit/applied/durable points and the changes to persist."""

    __slots__ = ("applied", "commit", "config", "durable", "joint", "log", "new_entries",
                 "on_config", "pending_durable", "snap_out", "snapshot", "truncate")

    def __init__(self, cfg: RaftConfig, restored: RaftRestoredState | None) -> None:
        snap = restored.snapshot if restored is not None else None
        if snap is not None:
            self.log = RaftLog(offset=snap.meta.index, offset_term=snap.meta.term,
                               base_config=snap.meta.config)
        else:
            self.log = RaftLog(offset=0, offset_term=0, base_config=cfg.bootstrap_config())
        if restored is not None:
            self.log.append([e for e in restored.entries if e.index > self.log.offset])
        self.snapshot: Snapshot | None = snap
        """The latest checkpoint this node can send in InstallSnapshot."""
        hs_commit = restored.hard_state.commit if restored is not None else 0
        self.commit = min(max(hs_commit, self.log.offset), self.log.last_index())
        self.applied = self.log.offset
        self.durable = self.log.last_index()
        self.pending_durable: deque[tuple[int, int]] = deque()
        """(Ready number, log last index after it) for Readys not yet `Persisted`."""
        self.new_entries: list[Entry] = []
        self.truncate: int | None = None
        self.snap_out: Snapshot | None = None
        self.on_config: Callable[[], None] = _unwired
        self.config: Configuration = self.log.latest_config()[1]
        """The configuration in force (the latest one in the log, Ref: §4.1)."""
        self.joint = JointConfig.of(self.config)
        """`JointConfig.of(config)`: the quorum math of every commit, vote and ReadIndex
        check (rebuilt only when the configuration changes)."""

    def _set_config(self, value: Configuration) -> None:
        self.config = value
        self.joint = JointConfig.of(value)
        self.on_config()

    # ------------------------------------------------------------------ local log updates

    def append(self, entries: list[Entry]) -> None:
        """Append our own or a leader's entries (to persist in this step's Ready)."""
        log = self.log
        log.append(entries)
        self.new_entries.extend(entries)
        for e in entries:  # (a loop, not `any(...)`: no generator on this hot path)
            if e.kind is _CONFIG:
                self._set_config(log.latest_config()[1])  # Ref: §4.1: in force once appended
                break

    def truncate_from(self, index: int) -> None:
        """Drop the entries from `index` on (uncommitted: a follower's conflict)."""
        if index <= self.commit:
            raise LocalProtocolError(f"truncating committed index {index} (commit {self.commit})")
        log = self.log
        had_config = bool(log.configs) and log.configs[-1][0] >= index
        log.truncate_from(index)
        self.new_entries = [e for e in self.new_entries if e.index < index]
        self.truncate = index if self.truncate is None else min(self.truncate, index)
        self.durable = min(self.durable, index - 1)
        self.pending_durable = deque((n, min(i, index - 1)) for n, i in self.pending_durable)
        if had_config:
            self._set_config(log.latest_config()[1])

    def install_snapshot(self, snap: Snapshot) -> None:
        """Replace the log by a leader's snapshot (to persist in this step's Ready)."""
        meta = snap.meta
        self.log.restore(index=meta.index, term=meta.term, config=meta.config)
        self.snap_out = snap
        self.snapshot = snap
        self.commit = max(self.commit, meta.index)
        self.applied = meta.index
        self.new_entries = []
        self.truncate = None
        self.durable = min(self.durable, meta.index)
        self.pending_durable = deque((n, min(i, meta.index)) for n, i in self.pending_durable)
        self._set_config(meta.config)

    def commit_to(self, index: int) -> None:
        if index > self.commit:
            self.commit = index

    def persisted(self, n: int) -> None:
        """Readys up to number `n` are durable: advance `durable`."""
        pend = self.pending_durable
        durable = self.durable
        while pend and pend[0][0] <= n:
            index = pend.popleft()[1]
            if index > durable:
                durable = index
        # Invariant kept by `truncate_from`: recorded indexes never exceed the current log.
        log = self.log
        last = log.offset + len(log.entries)
        self.durable = last if last < durable else durable

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_taken(self, cfg: RaftConfig, index: int, data: SnapshotData,
                         sending: list[int]) -> None:
        """The application checkpointed at `index`: keep it to serve, compact the log.
        `sending`: the indexes of older snapshots the leader is still sending followers."""
        if index > self.applied:
            raise LocalProtocolError(f"checkpoint at {index} beyond applied {self.applied}")
        if self.snapshot is not None and index <= self.snapshot.meta.index:
            return
        log = self.log
        term = log.term_at(index)
        if term is None:
            raise LocalProtocolError(f"checkpoint at {index} is already compacted")
        meta = SnapshotMeta(index=index, term=term, config=log.config_at(index))
        self.snapshot = Snapshot(meta=meta, data=data)
        upto = log.tail_start(index, max_entries=cfg.log_tail_after_compaction,
                              max_bytes=cfg.log_tail_max_bytes)
        # A follower receiving an older snapshot keeps it (`Progress.snapshot`): keep the
        # entries after it too, within `snapshot_retain_log_bytes`, so it catches up from
        # there instead of needing this newer snapshot as well.
        sending = [i for i in sending if i < upto]
        if sending and cfg.snapshot_retain_log_bytes:
            floor = log.tail_start(index, max_entries=index - log.offset,
                                   max_bytes=cfg.snapshot_retain_log_bytes)
            upto = max(min(sending), floor)
        log.compact(upto)

    def checkpoint_installed(self, meta: SnapshotMeta, data: SnapshotData) -> None:
        """The application installed a checkpoint (from a snapshot we sent it)."""
        if meta.index <= self.applied and (
                self.snapshot is None or meta.index > self.snapshot.meta.index):
            self.snapshot = Snapshot(meta=meta, data=data)

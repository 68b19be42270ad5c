"""Raft's in-memory log after a compaction point (§3.5, §5).

Owns: the entries with index > `offset`, the term at `offset` (the last compacted entry), and
the membership history needed to answer "which configuration is in force at index i".

Rules:
- Pure: imports only `phalanx.consensus.types`. No I/O; the driver persists what the core
  tells it to through `Ready`.
- Invariants (checked by `_check` only in tests through `check_invariants`):
  `entries[k].index == offset + 1 + k`; terms never decrease along the log and are >=
  `offset_term`; `configs` holds (index, config) for every CONFIG entry in the log, in order,
  and `base_config` is the configuration in force at `offset`.
- Operations are O(1) or O(batch) except `first_index_of_term` (O(length of that term))
  and `tail_start` (O(entries kept), once per checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence

from phalanx.consensus.types import Configuration, Entry, EntryKind, LocalProtocolError

_CONFIG = EntryKind.CONFIG


class RaftLog:
    """The log suffix after a snapshot point."""

    __slots__ = ("base_config", "configs", "entries", "offset", "offset_term")

    def __init__(self, *, offset: int, offset_term: int, base_config: Configuration) -> None:
        if offset < 0 or offset_term < 0:
            raise LocalProtocolError("log offset and term must be >= 0")
        self.offset = offset
        """Index of the last compacted entry (0 for an empty, never-compacted log)."""
        self.offset_term = offset_term
        self.entries: list[Entry] = []
        # Invariant: entries[k].index == offset + 1 + k.
        self.base_config = base_config
        """The configuration in force at `offset`."""
        self.configs: list[tuple[int, Configuration]] = []
        # Invariant: one (index, config) per CONFIG entry in `entries`, ascending.

    # ---------------------------------------------------------------------------- queries

    def first_index(self) -> int:
        return self.offset + 1

    def last_index(self) -> int:
        return self.offset + len(self.entries)

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.offset_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`, or None if compacted away or beyond the log."""
        if index == self.offset:
            return self.offset_term
        k = index - self.offset - 1
        if 0 <= k < len(self.entries):
            return self.entries[k].term
        return None

    def entry(self, index: int) -> Entry:
        k = index - self.offset - 1
        if not 0 <= k < len(self.entries):
            raise LocalProtocolError(
                f"index {index} not in log ({self.offset}, {self.last_index()}]")
        return self.entries[k]

    def match_term(self, index: int, term: int) -> bool:
        """Whether the entry at `index` has `term` (the AppendEntries consistency check)."""
        return self.term_at(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as up-to-date as ours.

        Ref: §3.6.1 (compare last terms, then lengths).
        """
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """The index of the first of `entries` that is beyond our log or differs in term from
        ours; 0 when every entry matches (so nothing must be truncated or appended)."""
        offset, mine = self.offset, self.entries
        for e in entries:
            k = e.index - offset  # `term_at(e.index)`, inlined
            if k <= 0:
                if k < 0 or self.offset_term == e.term:
                    continue  # compacted (committed, hence identical: Log Matching), or equal
                return e.index
            if k > len(mine) or mine[k - 1].term != e.term:
                return e.index
        return 0

    def first_index_of_term(self, index: int) -> int:
        """The first index in the log holding the same term as `index` (a rejection hint)."""
        term = self.term_at(index)
        if term is None:
            return index
        i = index
        while i - 1 > self.offset and self.entries[i - 2 - self.offset].term == term:
            i -= 1
        return i

    def last_index_of_term(self, term: int, at_most: int) -> int:
        """The last index <= at_most whose term is `term`, or 0 if the log holds none."""
        i = min(at_most, self.last_index())
        while i > self.offset:
            t = self.entries[i - 1 - self.offset].term
            if t == term:
                return i
            if t < term:
                return 0
            i -= 1
        if i == self.offset and self.offset_term == term and self.offset > 0:
            return self.offset
        return 0

    def between(self, lo: int, hi: int) -> tuple[Entry, ...]:
        """All entries lo..hi-1 (`slice` without limits). Raises for a range outside the log."""
        if lo <= self.offset or hi > self.offset + len(self.entries) + 1 or lo > hi:
            raise LocalProtocolError(f"range [{lo}, {hi}) outside log ({self.offset}, "
                                     f"{self.last_index()}]")
        return tuple(self.entries[lo - self.offset - 1: hi - self.offset - 1])

    def slice(self, lo: int, hi: int, *, max_entries: int, max_bytes: int) -> tuple[Entry, ...]:
        """Entries lo..hi-1, at most `max_entries`, and at most `max_bytes` (estimated; the
        first entry is always included). Raises for a range outside the log."""
        if lo <= self.offset or hi > self.offset + len(self.entries) + 1 or lo > hi:
            raise LocalProtocolError(f"slice [{lo}, {hi}) outside log ({self.offset}, "
                                     f"{self.last_index()}]")
        hi = min(hi, lo + max_entries)
        out: list[Entry] = []
        size = 0
        for k in range(lo - self.offset - 1, hi - self.offset - 1):
            e = self.entries[k]
            size += entry_size(e)
            if out and size > max_bytes:
                break
            out.append(e)
        return tuple(out)

    def tail_start(self, index: int, *, max_entries: int, max_bytes: int) -> int:
        """Where to compact to for a checkpoint at `index` (in the log or at the offset),
        keeping the longest run of entries ending at `index` with at most `max_entries`
        entries and at most `max_bytes` bytes (`entry_size`). Never below the offset.

        O(entries kept): it sums sizes back from `index` and stops at the first limit."""
        offset = self.offset
        if not offset <= index <= offset + len(self.entries):
            raise LocalProtocolError(f"index {index} not in log [{offset}, {self.last_index()}]")
        start = max(offset, index - max_entries)
        entries = self.entries
        size = 0
        for i in range(index, start, -1):
            size += entry_size(entries[i - offset - 1])
            if size > max_bytes:
                return i  # entry i does not fit: compact through it
        return start

    def config_at(self, index: int) -> Configuration:
        """The latest configuration at or before `index` (§4.1: a server uses the latest
        configuration in its log, committed or not)."""
        cfg = self.base_config
        for i, c in self.configs:
            if i > index:
                break
            cfg = c
        return cfg

    def latest_config(self) -> tuple[int, Configuration]:
        """(index of the latest CONFIG entry or the offset, that configuration)."""
        if self.configs:
            return self.configs[-1]
        return self.offset, self.base_config

    # ---------------------------------------------------------------------------- updates

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries that start right after our last index."""
        if not entries:
            return
        mine = self.entries
        if entries[0].index != self.offset + len(mine) + 1:
            raise LocalProtocolError(
                f"append at {entries[0].index} but last index is {self.last_index()}")
        for e in entries:
            mine.append(e)
            if e.kind is _CONFIG and e.config is not None:
                self.configs.append((e.index, e.config))

    def truncate_from(self, index: int) -> None:
        """Drop every entry with index >= `index` (a real term conflict, §3.5)."""
        if index <= self.offset:
            raise LocalProtocolError(f"cannot truncate at {index}: compacted up to {self.offset}")
        del self.entries[index - self.offset - 1:]
        while self.configs and self.configs[-1][0] >= index:
            self.configs.pop()

    def compact(self, index: int) -> None:
        """Discard entries up to and including `index` (must be in the log)."""
        if index <= self.offset:
            return
        term = self.term_at(index)
        if term is None:
            raise LocalProtocolError(f"cannot compact to {index}: beyond last index")
        self.base_config = self.config_at(index)
        self.configs = [(i, c) for i, c in self.configs if i > index]
        del self.entries[: index - self.offset]
        self.offset = index
        self.offset_term = term

    def restore(self, *, index: int, term: int, config: Configuration) -> None:
        """Reset to an empty log after a snapshot at (index, term)."""
        self.entries = []
        self.configs = []
        self.offset = index
        self.offset_term = term
        self.base_config = config

    def check_invariants(self) -> None:
        """Raise AssertionError if an invariant is broken (for tests)."""
        prev = self.offset_term
        for k, e in enumerate(self.entries):
            if e.index != self.offset + 1 + k:
                raise AssertionError(f"entry {k} has index {e.index}")
            if e.term < prev:
                raise AssertionError(f"term decreases at {e.index}")
            prev = e.term
        expect = [(e.index, e.config) for e in self.entries if e.config is not None]
        if expect != self.configs:
            raise AssertionError("config history out of sync")


def entry_size(e: Entry) -> int:
    """A cheap size estimate for batching (payload bytes plus a fixed overhead)."""
    size = 24
    for r in e.requests:  # (a loop, not `sum(...)`: no generator per entry sent)
        size += len(r.command) + len(r.client_id) + 8
    return size

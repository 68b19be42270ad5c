"""Explicit WAL repair: the action an operator (or a protocol-aware recovery path) takes after
`Wal.open` refused to start with a `CorruptionError`.

Owns: `repair_wal` and its `RepairReport`.
Must not import: `phalanx.consensus`, `os` (works on any `Directory`).

What repair does: it keeps the longest clean prefix of the log and drops everything from the
first problem on (the corrupt record, a torn record in a non-final segment, or a gap), then
fsyncs. It never invents data. The report says exactly which indexes were lost, so the caller
can re-fetch them from peers (CTRL: a truncated *committed* entry must be repaired from a
replica, never silently forgotten). A corrupt meta file is reset to just before the first
surviving record. A cut also leaves the WAL's `wal.lost` marker, which
`phalanx.runtime.persistence.ReadyPersister.load` reports as `DurableState.lost_reason`: the node
may
have acknowledged what was dropped, so it must catch up from its peers before it trusts its
log (and, once the Raft core's recovering mode exists, before it votes).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.storage.directory import Directory
from phalanx.storage.interface import CorruptionError
from phalanx.storage.records import DEFAULT_MAX_RECORD_BYTES, scan
from phalanx.storage.wal import list_segments, read_meta, write_lost, write_meta


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairReport:
    """What `repair_wal` changed.

    Attributes:
        problem: the first problem found ("" if the log was clean and nothing changed).
        path, offset: where the log was cut (None if nothing was cut).
        lost_from_index: the first index no longer held (None if nothing was dropped);
            every index from there to the old end is gone.
        removed: segment files removed whole.
        meta_reset: the compaction point written when the meta file was corrupt, else None.
    """

    problem: str
    path: str | None = None
    offset: int | None = None
    lost_from_index: int | None = None
    removed: tuple[str, ...] = ()
    meta_reset: int | None = None

    @property
    def changed(self) -> bool:
        return self.path is not None or bool(self.removed) or self.meta_reset is not None


def repair_wal(directory: Directory, *,
               max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> RepairReport:
    """Cut the WAL in `directory` back to its longest clean prefix and make that durable.

    Afterwards `Wal.open(directory)` succeeds (barring new damage). A torn tail in the final
    segment is not a problem; it is left for `Wal.open` to cut.
    """
    segments = list_segments(directory)
    meta_reset: int | None = None
    problem = ""
    try:
        read_meta(directory)
    except CorruptionError as e:
        problem = str(e)
        meta_reset = segments[0][0] - 1 if segments else 0
        write_meta(directory, meta_reset, durable=True)
    prev_last: int | None = None
    for pos, (first, name) in enumerate(segments):
        res = scan(directory.read(name), first, max_record_bytes=max_record_bytes)
        cut: int | None = None
        why = ""
        if prev_last is not None and first != prev_last + 1:
            cut, why = 0, f"gap: segment starts at {first}, previous ends at {prev_last}"
        elif res.corrupt_offset is not None:
            cut, why = res.corrupt_offset, res.reason
        elif res.torn and pos != len(segments) - 1:
            cut, why = res.valid_end, f"damaged record in a non-final segment: {res.reason}"
        if cut is None:
            prev_last = first + len(res.offsets) - 1
            continue
        lost_from = first + sum(1 for off in res.offsets if off < cut)
        removed = tuple(n for _, n in segments[pos + 1:])
        for victim in reversed(removed):
            directory.remove(victim)
        if cut == 0:
            directory.remove(name)
            removed = (name, *removed)
        else:
            directory.truncate(name, cut)
            directory.fsync(name)
        directory.fsync_dir()
        path = directory.path(name)
        write_lost(directory, f"repair_wal dropped the log from index {lost_from} on: {why} "
                   f"(file {path}, offset {cut})", durable=True)
        return RepairReport(problem=f"{why} (file {path}, offset {cut})", path=path,
                            offset=cut, lost_from_index=lost_from, removed=removed,
                            meta_reset=meta_reset)
    return RepairReport(problem=problem, meta_reset=meta_reset)

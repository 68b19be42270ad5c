"""The write-ahead log: segment files of checksummed records over a `Directory`.

Owns: `Wal` (implements `WriteAheadLog`), its on-disk layout and its recovery.
Must not import: `phalanx.consensus`, `os` (all I/O goes through `Directory`, so the file
and memory backends run exactly this code), clocks, randomness.

Layout in the directory:
- `wal-<first index, 20 digits>.seg`: records `first, first+1, ...` (format: `records.py`).
- `wal.meta`: the compaction point, replaced atomically (temp file, fsync, rename, fsync
  directory). Missing means 0.
- `wal.lost`: present when the log lost records it once held (`repair_wal` cut it, or the
  persister found it unusable against the checkpoints); one line saying why. It stays until
  `clear_lost()`: the node must recover what it lost from its peers before trusting its log.

Crash-safety protocol (each rule closes one crash state recovery could not explain):
- A segment is fsynced before the next one is created, so only the final segment can hold a
  torn tail; damage anywhere else is corruption.
- `truncate_suffix` removes whole later segments and fsyncs the directory *before* cutting
  the segment that holds `from_index`, so no crash leaves a gap between segments.
- `compact_prefix` makes the new compaction point durable before removing segments, and
  fsyncs the directory after, so the first index survives restarts and leftovers are never
  older segments with torn tails.
- Recovery: a torn tail in the final segment is cut off (and reported in `recovery`);
  corruption, a gap, or a torn non-final segment raises `CorruptionError(path, offset)`.
  Repair is `phalanx.storage.repair.repair_wal`, an explicit separate action.
- Recovery trusts only durable bytes: under a durable policy `open` fsyncs every segment it
  keeps, `wal.meta` and `wal.lost`, then the directory, before it returns (and before it
  removes segments below the compaction point). A previous process may have died between a
  write and its fsync (or a create/rename and the directory fsync): its page-cache bytes and
  names are readable but not durable. Without this pass, a power loss after the restart
  could take records this process had treated as durable (acknowledged, rewound to, built
  on), leave a gap behind a segment this process created (it fsyncs a predecessor only if
  it wrote to it), or drop a `wal.lost` marker. A clean file's fsync costs next to nothing.
- After an I/O error the log is poisoned: every later call raises `StorageError` (after a
  failed fsync the page cache can no longer be trusted; reopen to recover).
- Segments grow by appending and are synced with `fsync`; they are not preallocated. Zeros
  after the last record of the final segment (a preallocated region, e.g. written by a
  future writer, or a size extended before its data) end the log and are cut like a torn
  tail; a record torn inside and followed by zeros is refused. A preallocating layout was
  measured (~0.1 ms of a 1-client write, docs/BENCHMARKS.md issue 23 "Round 3", with what
  it would need); `tests/storage/test_wal_zero_tail.py` pins these zero-tail rules.

Invariant: segments are sorted and contiguous; `segments[i+1].first == segments[i].last + 1`;
`first_index() == compacted + 1` whenever the log is non-empty, and records at indexes
`<= compacted` still present in the first segment are invisible.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.storage.directory import Directory
from phalanx.storage.interface import CorruptionError, StorageError, SyncPolicy
from phalanx.storage.records import (
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    decode_span,
    encode_into,
    scan,
)

SEGMENT_PREFIX = "wal-"
SEGMENT_SUFFIX = ".seg"
META_NAME = "wal.meta"
_META_TMP = "wal.meta.tmp"
LOST_NAME = "wal.lost"
_LOST_TMP = "wal.lost.tmp"
_META_MAGIC = b"PHXWAL01"
_META = struct.Struct("<8sQI")
_U32 = struct.Struct("<I")
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


def segment_name(first: int) -> str:
    return f"{SEGMENT_PREFIX}{first:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first index a segment name encodes, or None if `name` is not a segment."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    digits = name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]
    if len(digits) != 20 or not digits.isdigit():
        return None
    return int(digits)


def encode_meta(compacted: int) -> bytes:
    head = _META_MAGIC + compacted.to_bytes(8, "little")
    return head + _U32.pack(zlib.crc32(head))


def read_meta(directory: Directory) -> int:
    """The durable compaction point (0 if never compacted). Raises `CorruptionError`."""
    if META_NAME not in directory.list():
        return 0
    data = directory.read(META_NAME)
    if len(data) != _META.size:
        raise CorruptionError(f"WAL meta file has {len(data)} bytes, expected {_META.size}",
                              path=directory.path(META_NAME), offset=0)
    magic, compacted, crc = _META.unpack(data)
    if magic != _META_MAGIC or zlib.crc32(data[:16]) != crc:
        raise CorruptionError("WAL meta file fails its checksum",
                              path=directory.path(META_NAME), offset=0)
    return int(compacted)


def write_meta(directory: Directory, compacted: int, *, durable: bool) -> None:
    """Atomically replace the meta file (temp, fsync, rename, fsync directory)."""
    directory.create(_META_TMP)
    directory.append(_META_TMP, encode_meta(compacted))
    if durable:
        directory.fsync(_META_TMP)
    directory.rename(_META_TMP, META_NAME)
    if durable:
        directory.fsync_dir()


def read_lost(directory: Directory) -> str | None:
    """Why the log lost records (the `wal.lost` marker), or None if it never did."""
    if LOST_NAME not in directory.list():
        return None
    text = directory.read(LOST_NAME).decode("utf-8", "replace").strip()
    return text or "the log lost records (no reason recorded)"


def write_lost(directory: Directory, reason: str, *, durable: bool) -> None:
    """Atomically record that the log lost records, and why (kept if already recorded)."""
    if LOST_NAME in directory.list():
        return  # the first loss is the one that matters; it still stands
    directory.create(_LOST_TMP)
    directory.append(_LOST_TMP, " ".join(reason.split()).encode() + b"\n")
    if durable:
        directory.fsync(_LOST_TMP)
    directory.rename(_LOST_TMP, LOST_NAME)
    if durable:
        directory.fsync_dir()


def _make_durable(directory: Directory, segments: list[str]) -> None:
    """Recovery's durability pass (module docstring): fsync the segments kept, the meta and
    lost files, then the directory. Descriptors it opened are released, except the final
    segment's (the next append uses it)."""
    present = directory.list()
    names = [*segments, *(n for n in (META_NAME, LOST_NAME) if n in present)]
    for name in names:
        directory.fsync(name)
        if not segments or name != segments[-1]:
            directory.release(name)
    directory.fsync_dir()


def list_segments(directory: Directory) -> list[tuple[int, str]]:
    """(first index, name) of every segment, ascending."""
    found = []
    for name in directory.list():
        first = parse_segment_name(name)
        if first is not None:
            found.append((first, name))
    found.sort()
    return found


@dataclass(slots=True)
class _Segment:
    name: str
    first: int
    offsets: array[int]  # file offset of each record; record i has index first + i
    size: int  # bytes in the file (all of them valid records)
    synced: int = 0  # bytes the last successful fsync made durable (what `rewind` keeps)

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class WalRecovery:
    """What opening the log found. `torn_path` is set when a torn tail was cut off."""

    segments: int
    records: int
    compacted: int
    torn_path: str | None = None
    torn_offset: int | None = None
    torn_bytes: int = 0
    torn_reason: str = ""
    removed: tuple[str, ...] = ()
    """Leftover files removed: a stale meta temp file, segments wholly below the compaction
    point."""


class Wal:
    """A `WriteAheadLog` over a `Directory`. Open it with `Wal.open`.

    Not thread-safe. Blocking: run it from a worker thread under trio.
    """

    __slots__ = ("_closed", "_compacted", "_dir", "_dir_dirty", "_dirty", "_max_record",
                 "_poisoned", "_segment_bytes", "_segs", "_sync", "recovery")

    def __init__(self, directory: Directory, *, sync: SyncPolicy, segment_bytes: int,
                 max_record_bytes: int, compacted: int, segments: list[_Segment],
                 recovery: WalRecovery) -> None:
        """Internal: use `Wal.open`, which runs recovery."""
        if segment_bytes < HEADER_SIZE:
            raise ValueError(f"segment_bytes must be >= {HEADER_SIZE}")
        self._dir = directory
        self._sync = sync
        self._segment_bytes = segment_bytes
        self._max_record = max_record_bytes
        self._compacted = compacted
        self._segs = segments
        self._dirty: dict[str, None] = {}  # insertion-ordered set of un-fsynced files
        self._dir_dirty = False
        self._poisoned: BaseException | None = None
        self._closed = False
        self.recovery = recovery

    # -- opening and recovery -----------------------------------------------------------------

    @classmethod
    def open(cls, directory: Directory, *, sync: SyncPolicy = SyncPolicy.GROUP,
             segment_bytes: int = DEFAULT_SEGMENT_BYTES,
             max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Wal:
        """Recover the log in `directory` (creating an empty one if there is none).

        Raises:
            CorruptionError: a record fails its checksum and a crash cannot explain it, or
                segments are not contiguous. Nothing is modified in that case.
        """
        durable = sync is not SyncPolicy.OFF
        compacted = read_meta(directory)
        segs: list[_Segment] = []
        torn: tuple[_Segment, int, str] | None = None
        listed = list_segments(directory)
        for pos, (first, name) in enumerate(listed):
            data = directory.read(name)
            res = scan(data, first, max_record_bytes=max_record_bytes)
            path = directory.path(name)
            if res.corrupt_offset is not None:
                raise CorruptionError(f"WAL record is corrupt: {res.reason}", path=path,
                                      offset=res.corrupt_offset)
            seg = _Segment(name=name, first=first, offsets=res.offsets, size=res.valid_end,
                           synced=res.valid_end)
            if res.torn:
                if pos != len(listed) - 1:
                    raise CorruptionError(f"damaged record in a non-final segment: {res.reason}",
                                          path=path, offset=res.valid_end)
                torn = (seg, len(data) - res.valid_end, res.reason)
            if segs and first != segs[-1].last + 1:
                raise CorruptionError(f"WAL gap: segment starts at {first}, previous ends at "
                                      f"{segs[-1].last}", path=path, offset=0)
            segs.append(seg)
        if segs and segs[0].first > compacted + 1 and segs[-1].last > compacted:
            raise CorruptionError(f"WAL gap: compacted up to {compacted} but the first segment "
                                  f"starts at {segs[0].first}", path=directory.path(segs[0].name),
                                  offset=0)
        # Checks done: from here on recovery modifies files.
        removed: list[str] = []
        if _META_TMP in directory.list():
            directory.remove(_META_TMP)
            removed.append(_META_TMP)
        if torn is not None:
            seg = torn[0]
            directory.truncate(seg.name, seg.size)
        stale: list[str] = []
        while segs and segs[0].last <= compacted and (len(segs) == 1 or segs[1].first
                                                      <= compacted + 1):
            stale.append(segs.pop(0).name)
        if durable:
            _make_durable(directory, [s.name for s in segs])
        for name in stale:
            directory.remove(name)
            removed.append(name)
        if stale and durable:
            directory.fsync_dir()
        recovery = WalRecovery(
            segments=len(segs), records=sum(len(s.offsets) for s in segs), compacted=compacted,
            torn_path=None if torn is None else directory.path(torn[0].name),
            torn_offset=None if torn is None else torn[0].size,
            torn_bytes=0 if torn is None else torn[1],
            torn_reason="" if torn is None else torn[2], removed=tuple(removed))
        return cls(directory, sync=sync, segment_bytes=segment_bytes,
                   max_record_bytes=max_record_bytes, compacted=compacted, segments=segs,
                   recovery=recovery)

    # -- WriteAheadLog ------------------------------------------------------------------------

    def first_index(self) -> int:
        return self._compacted + 1

    def last_index(self) -> int:
        if self._segs:
            return max(self._compacted, self._segs[-1].last)
        return self._compacted

    def append(self, index: int, payload: bytes) -> None:
        self.append_many(((index, payload),))

    def append_many(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Append contiguous records; one write per segment touched.

        Raises:
            StorageError: the first index is not `last_index() + 1`, indexes are not
                contiguous, or a payload exceeds `max_record_bytes`; nothing is written then.
        """
        self._check_usable()
        if not records:
            return
        expected = self.last_index() + 1
        limit = self._max_record
        for index, payload in records:
            if index != expected:
                raise StorageError(f"append of index {index}, expected {expected}")
            if len(payload) > limit:
                raise StorageError(f"payload of {len(payload)} bytes exceeds {limit}")
            expected += 1
        try:
            self._append_checked(records)
            if self._sync is SyncPolicy.EVERY_WRITE:
                self._sync_now()
        except OSError as e:
            self._poison(e)

    def _append_checked(self, records: Sequence[tuple[int, bytes]]) -> None:
        n = len(records)
        i = 0
        while i < n:
            seg = self._writable_segment(records[i][0], len(records[i][1]))
            buf = bytearray()
            i, pos = encode_into(records, i, buf, seg.offsets, seg.size,
                                 self._segment_bytes - seg.size)
            # NB: if this write fails the log is poisoned (`rewind` trims `offsets`).
            self._dir.append(seg.name, buf)
            seg.size = pos
            if self._sync is SyncPolicy.OFF:
                seg.synced = pos  # nothing is ever synced: nothing to rewind to
            self._dirty[seg.name] = None

    def _writable_segment(self, index: int, payload_len: int) -> _Segment:
        segs = self._segs
        if segs:
            seg = segs[-1]
            fits = seg.size == 0 or seg.size + HEADER_SIZE + payload_len <= self._segment_bytes
            if fits and seg.last + 1 == index:
                return seg
            if self._sync is not SyncPolicy.OFF and seg.name in self._dirty:
                # Rule: a segment is durable before its successor exists.
                self._dir.fsync(seg.name)
                seg.synced = seg.size
                del self._dirty[seg.name]
        seg = _Segment(name=segment_name(index), first=index, offsets=array("q"), size=0)
        self._dir.create(seg.name)
        self._dir_dirty = True
        segs.append(seg)
        return seg

    def read(self, lo: int, hi: int) -> list[bytes]:
        """Payloads of `lo..hi-1`, re-verified against their checksums.

        Raises:
            StorageError: the range is not within `first_index()..last_index()+1`.
            CorruptionError: a record went bad on the media since recovery.
        """
        self._check_usable()
        if not (self.first_index() <= lo <= hi <= self.last_index() + 1):
            raise StorageError(f"read [{lo}, {hi}) outside the held range "
                               f"[{self.first_index()}, {self.last_index() + 1})")
        out: list[bytes] = []
        segs = self._segs
        k = max(0, bisect_right(segs, lo, key=_first) - 1)
        while lo < hi:
            seg = segs[k]
            stop = min(hi, seg.last + 1)
            offs = seg.offsets[lo - seg.first:stop - seg.first]
            start = offs[0]
            end = seg.offsets[stop - seg.first] if stop <= seg.last else seg.size
            try:
                data = self._dir.read_at(seg.name, start, end - start)
            except OSError as e:
                raise StorageError(f"read of {self._dir.path(seg.name)} failed: {e}") from e
            payloads, bad, reason = decode_span(data, start, offs, lo)
            if bad is not None:
                raise CorruptionError(f"WAL record is corrupt: {reason}",
                                      path=self._dir.path(seg.name), offset=bad)
            out += payloads
            lo = stop
            k += 1
        return out

    def truncate_suffix(self, from_index: int) -> None:
        """Drop indexes `>= from_index`; durable at the next `sync()`.

        Raises:
            StorageError: `from_index` is inside the compacted prefix.
        """
        self._check_usable()
        if from_index > self.last_index():
            return
        if from_index <= self._compacted:
            raise StorageError(f"truncate_suffix({from_index}) reaches into the compacted "
                               f"prefix (first index {self.first_index()})")
        try:
            segs = self._segs
            removed = False
            while segs and segs[-1].first >= from_index:
                seg = segs.pop()
                self._dirty.pop(seg.name, None)
                self._dir.remove(seg.name)
                removed = True
            if removed and self._sync is not SyncPolicy.OFF:
                # Rule: removals are durable before the cut, so no crash leaves a gap.
                self._dir.fsync_dir()
                self._dir_dirty = False
            if segs and segs[-1].last >= from_index:
                seg = segs[-1]
                keep = from_index - seg.first
                seg.size = seg.offsets[keep]
                seg.synced = min(seg.synced, seg.size)
                del seg.offsets[keep:]
                self._dir.truncate(seg.name, seg.size)
                self._dirty[seg.name] = None
            if self._sync is SyncPolicy.EVERY_WRITE:
                self._sync_now()
        except OSError as e:
            self._poison(e)

    def compact_prefix(self, upto_index: int) -> None:
        """Drop indexes `<= upto_index`; the new first index is durable when this returns
        (unless the policy is OFF)."""
        self._check_usable()
        if upto_index <= self._compacted:
            return
        durable = self._sync is not SyncPolicy.OFF
        try:
            write_meta(self._dir, upto_index, durable=durable)
            self._compacted = upto_index
            segs = self._segs
            removed = False
            while segs and (segs[0].last <= upto_index if len(segs) == 1
                            else segs[1].first <= upto_index + 1):
                seg = segs.pop(0)
                self._dirty.pop(seg.name, None)
                self._dir.remove(seg.name)
                removed = True
            if removed and durable:
                self._dir.fsync_dir()
        except OSError as e:
            self._poison(e)

    def rewind(self) -> None:
        """After an I/O error (disk full, EIO): make the log usable again at its last
        durable record. Every segment is cut back to what its last successful fsync made
        durable, and segments created since are removed; nothing written after that fsync is
        trusted (after a failed fsync the page cache may hold bytes the disk does not).
        The log then ends at its last durable record; the caller writes the rest again.

        Raises:
            StorageError: cutting back failed too (the log stays poisoned; try again later).
        """
        if self._closed:
            raise StorageError("the WAL is closed")
        durable = self._sync is not SyncPolicy.OFF
        try:
            segs = self._segs
            removed = False
            while segs and segs[-1].synced == 0:
                seg = segs.pop()
                self._dir.remove(seg.name)
                removed = True
            for seg in segs:
                tail = len(seg.offsets) > 0 and seg.offsets[-1] >= seg.synced
                if seg.size > seg.synced or tail:
                    keep = bisect_right(seg.offsets, seg.synced - 1)
                    del seg.offsets[keep:]
                    seg.size = seg.synced
                    self._dir.truncate(seg.name, seg.size)
                    if durable:
                        self._dir.fsync(seg.name)
            if durable and (removed or self._dir_dirty):
                self._dir.fsync_dir()
        except OSError as e:
            self._poisoned = e
            raise StorageError(f"WAL rewind failed: {e}") from e
        self._dirty.clear()
        self._dir_dirty = False
        self._poisoned = None

    def reset(self, compacted: int, *, lost: str | None = None) -> None:
        """Drop every record and restart the log, empty, after `compacted` (which may be
        below the current compaction point), durably. With `lost`, first record durably that
        the log lost records (`wal.lost`), so a crash in between still says so.

        For a log that cannot continue from the newest checkpoint (it ends behind it, or a
        gap separates them): see `phalanx.runtime.persistence.ReadyPersister.load`.
        """
        self._check_usable()
        durable = self._sync is not SyncPolicy.OFF
        try:
            if lost is not None:
                write_lost(self._dir, lost, durable=durable)
            while self._segs:
                seg = self._segs.pop()
                self._dirty.pop(seg.name, None)
                self._dir.remove(seg.name)
            if durable:
                self._dir.fsync_dir()
            write_meta(self._dir, compacted, durable=durable)
            self._compacted = compacted
        except OSError as e:
            self._poison(e)

    def lost(self) -> str | None:
        """Why this log lost records it once held (`wal.lost`), or None."""
        self._check_usable()
        try:
            return read_lost(self._dir)
        except OSError as e:
            raise StorageError(f"reading {self._dir.path(LOST_NAME)} failed: {e}") from e

    def clear_lost(self) -> None:
        """Forget the `wal.lost` marker (the node recovered what it lost from its peers)."""
        self._check_usable()
        try:
            if LOST_NAME in self._dir.list():
                self._dir.remove(LOST_NAME)
                if self._sync is not SyncPolicy.OFF:
                    self._dir.fsync_dir()
        except OSError as e:
            self._poison(e)

    def sync(self) -> None:
        """fsync every file written since the last sync, then the directory if it changed.
        A no-op under `SyncPolicy.OFF`."""
        self._check_usable()
        if self._sync is SyncPolicy.OFF:
            return
        try:
            self._sync_now()
        except OSError as e:
            self._poison(e)

    def _sync_now(self) -> None:
        for name in self._dirty:
            self._dir.fsync(name)
        for seg in self._segs:
            if seg.name in self._dirty:
                seg.synced = seg.size
        self._dirty.clear()
        if self._dir_dirty:
            self._dir.fsync_dir()
            self._dir_dirty = False

    def close(self) -> None:
        """Stop using the log. Does not sync: call `sync()` first to keep un-synced records."""
        self._closed = True

    # -- helpers ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError("the WAL is closed")
        if self._poisoned is not None:
            raise StorageError(f"the WAL failed earlier ({self._poisoned}); reopen it")

    def _poison(self, error: OSError) -> None:
        self._poisoned = error
        raise StorageError(f"WAL I/O failed: {error}") from error

    def segment_names(self) -> list[str]:
        """Names of the live segments, oldest first (for tests and status)."""
        return [s.name for s in self._segs]


def _first(seg: _Segment) -> int:
    return seg.first


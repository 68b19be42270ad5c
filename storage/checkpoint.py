"""Checkpoints stored as checksummed files written atomically, over a `Directory`.

Owns: `FileCheckpointStore` (implements `CheckpointStore`) and the checkpoint file formats.
Must not import: `phalanx.consensus`, `phalanx.apps` (checkpoints are opaque bytes), `os`.

File `checkpoint-<index, 20 digits>.ckpt`, in one of three layouts:
- v1 and v2 (one file holding the whole data; `phalanx.storage.checkpoint_v2` has them),
  written by earlier versions and still read; `layout=2` still writes v2.
- v3, written by `save` and `save_stream` since incremental checkpoints: a manifest naming
  content-addressed pieces held in pack files (`phalanx.storage.packs` has the layout). A save
  writes only the pieces no retained checkpoint holds (an app's unchanged shards cost nothing
  but their 52-byte reference), so its cost follows what changed.
All three are read by `load_latest` and `read_view`.
Piece memory (`memory_bytes`, `phalanx.storage.piece_memory`): up to that many bytes of held
pieces, from saves and loads, answer `read_piece_range` and `read_piece` (a peer's fetch)
before the packs; it never answers for a piece the store no longer holds.
Save protocol (v3): write the new pieces into a new pack, fsync it; write `<name>.tmp`, fsync,
rename to `<name>`, fsync the directory (one directory fsync covers the pack's creation and
the rename: directory operations become durable in order, the crash model
`phalanx.storage.memory` checks); then remove the oldest beyond `keep` and every pack no
retained checkpoint needs (nor a live view, nor a save in progress). A crash leaves the
previous set plus, at most, a stray temp file or pack (removed by the next save). Until the
new manifest is durable the previous checkpoint and all its packs stay as they were.
Load: the first `load_latest` (durable policy) fsyncs the directory first: a process that
died between a manifest's rename and the directory fsync left a checkpoint readable but not
durable (file contents are fsynced before the rename), which the node must not build on.

Invariant: `load_latest` returns only a checkpoint whose checksums, hashes, lengths and index
match; every newer checkpoint it skipped is named in `problems` (reported, never hidden).
Trade-off: checkpoints share unchanged pieces, so one damaged shared piece makes every
retained checkpoint that uses it unloadable (the node then recovers from its peers, as when
every checkpoint is corrupt).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from phalanx.storage.checkpoint_v2 import (
    END2,
    HEADER_SIZE,
    TRAIL2,
    data_range,
    decode_checkpoint,
    encode_header2,
)
from phalanx.storage.checkpoint_v2 import encode_header as encode_header  # re-exported
from phalanx.storage.directory import ByteView, Directory
from phalanx.storage.interface import (
    LoadedCheckpoint,
    Piece,
    StorageError,
    StoredCheckpoint,
    SyncPolicy,
)
from phalanx.storage.packs import (
    MAGIC3,
    PackView,
    Ref,
    decode_manifest,
    encode_manifest,
    encode_refs,
    group_ends,
    pack_name,
    parse_pack_name,
    pieces_of,
    read_pieces,
    resolve,
)
from phalanx.storage.piece_memory import PieceMemory

CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_SUFFIX = ".ckpt"
_TMP_SUFFIX = ".tmp"
SMALL_PACK_BYTES = 1 << 20
MAX_SMALL_PACKS = 64
STREAM_WRITE_BYTES = 1 << 20
"""`save_stream` gathers steps into appends of about this many bytes (one syscall each)."""


def checkpoint_name(index: int) -> str:
    return f"{CHECKPOINT_PREFIX}{index:020d}{CHECKPOINT_SUFFIX}"


def _parse_name(name: str) -> int | None:
    if not (name.startswith(CHECKPOINT_PREFIX) and name.endswith(CHECKPOINT_SUFFIX)):
        return None
    digits = name[len(CHECKPOINT_PREFIX):-len(CHECKPOINT_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


class FileCheckpointStore:
    """A `CheckpointStore` keeping the newest `keep` checkpoints (by index) in a `Directory`.

    `layout` 3 (the default) stores content-addressed pieces in pack files under a small
    manifest (`phalanx.storage.packs`): a save writes only the pieces no retained checkpoint
    holds. `layout` 2 writes the previous single-file format (benchmarks compare the two;
    tests make old-format fixtures with it). Every layout loads whatever the layout.

    Thread-safe for one saver at a time plus readers (`read_view`, `load_latest` from other
    threads): the catalogue of retained manifests, pack allocation and collection run under
    one lock; a pack an in-progress save or a live `read_view` uses is never collected.
    """

    __slots__ = ("_active", "_catalog", "_dir", "_held", "_keep", "_layout", "_lock",
                 "_settled", "_sync", "_tmps", "_views", "memory", "stats")

    def __init__(self, directory: Directory, *, keep: int = 3,
                 sync: SyncPolicy = SyncPolicy.GROUP, layout: int = 3,
                 memory_bytes: int = 0) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if layout not in (2, 3):
            raise ValueError(f"checkpoint layout must be 2 or 3, got {layout}")
        self._dir = directory
        self._keep = keep
        self._sync = sync
        self._settled = sync is SyncPolicy.OFF  # whether the directory is known durable
        self._layout = layout
        self._lock = threading.Lock()
        self._catalog: dict[int, list[Ref]] | None = None  # v3 index -> its pieces and groups
        self._held: dict[bytes, Ref] = {}
        self._active: list[set[int]] = []  # packs each in-progress save writes or reuses
        self._views: weakref.WeakSet[PackView] = weakref.WeakSet()
        self._tmps: set[str] = set()
        self.stats = SaveStats()
        """What the last save wrote (benchmarks, tests)."""
        self.memory = PieceMemory(memory_bytes)
        """Up to `memory_bytes` of held pieces, kept as saves write them and loads read them
        (`phalanx.storage.piece_memory`): `read_piece_range` and `read_piece` use them
        before the packs."""

    def indexes(self) -> list[int]:
        found = [_parse_name(n) for n in self._dir.list()]
        return sorted(i for i in found if i is not None)

    def save(self, checkpoint: StoredCheckpoint) -> None:
        """Store `checkpoint` durably and atomically, replacing one with the same index
        (`save_stream` of its data in one piece).

        Raises:
            StorageError: I/O failed (the stored set is then unchanged, maybe plus a temp file).
        """
        self.save_stream(checkpoint.index, checkpoint.meta, (checkpoint.data,))

    def save_stream(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece], *,
                    write_bytes: int = STREAM_WRITE_BYTES) -> int:
        """Store a checkpoint whose data is the concatenation of `chunks` (a `Piece` stands
        for its `data()`), durably and atomically, without ever holding the whole data;
        returns the data's length. Layout 3 writes the pieces no retained checkpoint holds
        into one new pack (appends of about `write_bytes`), fsyncs it, then writes the
        manifest (temp file, fsync, rename, fsync the directory), then removes checkpoints
        beyond `keep` and the packs no retained checkpoint needs.

        Raises:
            StorageError: I/O failed (as `save`). An exception from `chunks` propagates
            unchanged, with nothing stored but a stray temp file or pack (collected later).
        """
        if index < 0:
            raise StorageError(f"checkpoint index {index} is negative")
        if self._layout == 2:
            return self._save_v2(index, meta, chunks, write_bytes)
        try:
            with self._lock:
                names = self._dir.list()
                taken = {p for p in map(parse_pack_name, names) if p is not None}
                self._refresh(names, taken)
                for uses in self._active:
                    taken |= uses
                pack = max(taken, default=0) + 1
                uses = {pack}
                self._active.append(uses)
                sparse = self._sparse()
        except OSError as e:
            raise StorageError(f"saving checkpoint {index} failed: {e}") from e
        try:
            length = self._write_v3(index, meta, chunks, pack, uses, sparse, write_bytes)
        finally:
            with self._lock:
                self._active.remove(uses)
        return length

    def _write_v3(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece], pack: int,
                  uses: set[int], sparse: set[int], write_bytes: int) -> int:
        durable = self._sync is not SyncPolicy.OFF
        name = pack_name(pack)
        stats = SaveStats()
        fresh: dict[bytes, Ref] = {}
        pending: list[bytes] = []
        offset = size = length = 0
        refs: list[Ref] = []
        group: list[Ref] = []
        groups: list[Ref] = []
        lock, held, append = self._lock, self._held, self._dir.append
        memory = self.memory if self.memory.budget else None

        def put(digest: bytes, raw: bytes) -> Ref:
            nonlocal offset, size, pending
            ref = Ref(digest, pack, offset, len(raw))
            fresh[digest] = ref
            offset += len(raw)
            pending.append(raw)
            size += len(raw)
            stats.written += len(raw)
            if size >= write_bytes:
                append(name, b"".join(pending))
                pending, size = [], 0
            return ref

        def stored(digest: bytes) -> Ref | None:
            """Where this save or a retained checkpoint already holds `digest` (not in a
            sparse pack), or None."""
            ref = fresh.get(digest)
            if ref is None:
                with lock:
                    ref = held.get(digest)
                    if ref is None:
                        return None
                    if ref.pack in sparse:
                        stats.copied += ref.length  # the caller writes it again
                        return None
                    uses.add(ref.pack)
            return ref

        def close_group() -> None:
            raw = encode_refs(group)
            digest = hashlib.sha256(raw).digest()
            groups.append(stored(digest) or put(digest, raw))
            refs.extend(group)
            group.clear()

        try:
            self._dir.create(name)
            for piece in pieces_of(chunks):
                if piece is None:
                    continue
                digest = piece.digest
                ref = stored(digest)
                if ref is None:
                    raw = piece.data()
                    ref = put(digest, raw)
                    stats.new_pieces += 1
                    if memory is not None:
                        memory.put(digest, raw)
                else:
                    stats.reused_pieces += 1
                    if memory is not None:
                        memory.touch(digest)
                group.append(ref)
                length += ref.length
                if group_ends(digest, len(group)):
                    close_group()
            if group:
                close_group()
            if pending:
                append(name, b"".join(pending))
            if durable:
                self._dir.fsync(name)
            self._dir.release(name)  # written once: no descriptor kept per pack
            manifest = encode_manifest(index, meta, length, groups)
            stats.written += len(manifest)
            self._save(index, lambda tmp: self._dir.append(tmp, manifest))
        except OSError as e:
            raise StorageError(f"saving checkpoint {index} failed: {e}") from e
        with lock:
            catalog = self._ensure_catalog()
            catalog[index] = refs + groups
            try:
                self._collect()
            except OSError as e:
                raise StorageError(f"collecting after checkpoint {index} failed: {e}") from e
        self.stats = stats
        return length

    def _save_v2(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece],
                 write_bytes: int) -> int:
        """The previous single-file layout (v2, module docstring)."""
        length = 0

        def write(tmp: str) -> None:
            nonlocal length
            self._dir.append(tmp, encode_header2(index, meta))
            crc = 0
            pending: list[bytes] = []
            size = 0
            # NB: the CRC runs over each gathered append, not over each chunk. zlib releases
            # the GIL for a buffer over 5 KiB, and a writer thread that let go of the GIL
            # after every chunk waited for it again each time (up to a switch interval, 5 ms,
            # behind a busy applying thread): a 1M-key checkpoint of ~1000 shard-sized
            # chunks took 4-5 s where its own work is ~0.1 s.
            for chunk in chunks:
                if not isinstance(chunk, bytes):
                    chunk = chunk.data()
                if not chunk:
                    continue
                pending.append(chunk)
                size += len(chunk)
                if size >= write_bytes:
                    joined = b"".join(pending)
                    crc = zlib.crc32(joined, crc)
                    self._dir.append(tmp, joined)
                    length += size
                    pending, size = [], 0
            length += size
            joined = b"".join(pending)
            crc = zlib.crc32(joined, crc)
            self._dir.append(tmp, joined + TRAIL2.pack(length, crc, END2))

        try:
            self._save(index, write)
            with self._lock:
                if self._catalog is not None:
                    self._catalog.pop(index, None)
                self._collect()
        except OSError as e:
            raise StorageError(f"saving checkpoint {index} failed: {e}") from e
        self.stats = SaveStats(written=length)
        return length

    def _save(self, index: int, write: Callable[[str], None]) -> None:
        """Write the checkpoint file `index` atomically (temp file, fsync, rename, fsync the
        directory). Raises `OSError`."""
        durable = self._sync is not SyncPolicy.OFF
        name = checkpoint_name(index)
        tmp = name + _TMP_SUFFIX
        with self._lock:
            for stray in self._dir.list():
                if (stray.startswith(CHECKPOINT_PREFIX) and stray.endswith(_TMP_SUFFIX)
                        and stray not in self._tmps):
                    self._dir.remove(stray)
            self._tmps.add(tmp)
        try:
            self._dir.create(tmp)
            write(tmp)
            if durable:
                self._dir.fsync(tmp)
            self._dir.rename(tmp, name)
            if durable:
                self._dir.fsync_dir()
        finally:
            with self._lock:
                self._tmps.discard(tmp)

    def _refresh(self, names: list[str], packs: set[int]) -> None:
        """Read the catalogue again if the directory no longer matches it (another store
        object on this directory saved or collected since, or a pack went missing), so a
        save never reuses a piece that is gone. Caller holds the lock."""
        catalog = self._ensure_catalog()
        present = {i for i in map(_parse_name, names) if i is not None}
        if (not set(catalog) <= present or any(r.pack not in packs for r in self._held.values())
                or any(i not in catalog and self._is_v3(i) for i in present)):
            self._catalog = None
            self._ensure_catalog()

    def _is_v3(self, index: int) -> bool:
        try:
            return self._dir.read_at(checkpoint_name(index), 0, 8) == MAGIC3
        except OSError:
            return False

    def _ensure_catalog(self) -> dict[int, list[Ref]]:
        """The pieces and groups of every retained v3 checkpoint that resolves (read once;
        pieces are trusted here, checked when loaded). Caller holds the lock."""
        if self._catalog is None:
            catalog: dict[int, list[Ref]] = {}
            for index in self.indexes():
                try:
                    raw = self._dir.read(checkpoint_name(index))
                except OSError:
                    continue
                if raw[:8] != MAGIC3:
                    continue
                manifest = decode_manifest(raw)
                if isinstance(manifest, str) or manifest.index != index:
                    continue
                refs = resolve(self._dir, manifest)
                if not isinstance(refs, str):
                    catalog[index] = refs + list(manifest.groups)
            self._catalog = catalog
            self._index_held()
        return self._catalog

    def _index_held(self) -> None:
        self._held = {r.digest: r for refs in (self._catalog or {}).values() for r in refs}
        if self.memory.budget:
            self.memory.keep_only(self._held)

    def _sparse(self) -> set[int]:
        """Packs the newest checkpoint uses less than a quarter of: a save copies the pieces
        it needs from them into its own pack, so they can be collected (space stays within
        ~4x the state, and each copy is paid for by the 3/4 rewritten before it). Also, once
        more than `MAX_SMALL_PACKS` packs under `SMALL_PACK_BYTES` are in use (each save of a
        few changes leaves one), all of those, so they merge into one and files stay few."""
        catalog = self._catalog or {}
        if not catalog:
            return set()
        live: dict[int, int] = {}
        for ref in catalog[max(catalog)]:
            live[ref.pack] = live.get(ref.pack, 0) + ref.length
        sparse = set()
        small = []
        for pack, used in live.items():
            try:
                size = self._dir.size(pack_name(pack))
            except OSError:
                continue
            if used * 4 < size:
                sparse.add(pack)
            elif size < SMALL_PACK_BYTES:
                small.append(pack)
        if len(small) > MAX_SMALL_PACKS:
            sparse.update(small)
        return sparse

    def _collect(self) -> None:
        """Remove checkpoints beyond `keep`, then every pack no retained checkpoint, live
        view or in-progress save uses. Caller holds the lock. Raises `OSError`."""
        catalog = self._catalog
        for old in self.indexes()[:-self._keep]:
            self._dir.remove(checkpoint_name(old))
            if catalog is not None:
                catalog.pop(old, None)
        if catalog is None:
            return
        needed: set[int] = set()
        for refs in catalog.values():
            needed.update(r.pack for r in refs)
        for view in list(self._views):
            needed |= view.packs
        for uses in self._active:
            needed |= uses
        for name in self._dir.list():
            pack = parse_pack_name(name)
            if pack is not None and pack not in needed:
                self._dir.remove(name)
        self._index_held()

    def piece_list(self, index: int) -> tuple[bytes, list[tuple[bytes, int]]]:
        """Stored v3 checkpoint `index` as (its metadata, [(SHA-256, length) of each piece,
        in order]): what a peer fetches first to assemble the checkpoint from the pieces it
        lacks (`lacks`, `read_piece`, then `save_stream` of the pieces).

        Raises:
            StorageError: no such v3 checkpoint, or its manifest or a group does not check.
        """
        name = checkpoint_name(index)
        with self._lock:
            try:
                manifest = decode_manifest(self._dir.read(name))
            except OSError as e:
                raise StorageError(f"reading checkpoint {index} failed: {e}") from e
            refs = manifest if isinstance(manifest, str) else resolve(self._dir, manifest)
        if isinstance(refs, str) or isinstance(manifest, str):
            raise StorageError(f"{self._dir.path(name)}: {refs}")
        return manifest.meta, [(r.digest, r.length) for r in refs]

    def lacks(self, digests: Iterable[bytes]) -> list[bytes]:
        """Those of `digests` no retained v3 checkpoint here holds, in order, once each."""
        with self._lock:
            self._ensure_catalog()
            held = self._held
            seen: set[bytes] = set()
            out = []
            for digest in digests:
                if digest not in held and digest not in seen:
                    seen.add(digest)
                    out.append(digest)
            return out

    def read_piece(self, digest: bytes) -> bytes:
        """A held piece's bytes, checked against `digest`.

        Raises:
            StorageError: not held, unreadable, or it fails its hash.
        """
        with self._lock:
            self._ensure_catalog()
            ref = self._held.get(digest)
            kept = self.memory.get(digest) if ref is not None and self.memory.budget else None
            if kept is not None and hashlib.sha256(kept).digest() == digest:
                return kept
            raw = read_pieces(self._dir, (ref,)) if ref is not None else "not held"
        if isinstance(raw, str):
            raise StorageError(f"checkpoint piece {digest.hex()[:16]}: {raw}")
        return raw

    def read_piece_range(self, digest: bytes, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of a held piece, NOT checked (a peer fetching ranges
        of a large piece checks the whole piece against `digest`); shorter at its end. From
        `memory` when it holds the piece, else from its pack.

        Raises:
            StorageError: not held, or unreadable.
        """
        with self._lock:
            self._ensure_catalog()
            ref = self._held.get(digest)
            if ref is None or offset < 0 or length < 0:
                raise StorageError(f"checkpoint piece {digest.hex()[:16]}: not held")
            take = max(0, min(length, ref.length - offset))
            kept = self.memory.get(digest) if self.memory.budget else None
            if kept is not None and len(kept) == ref.length:
                self.memory.count_served(take)
                return kept[offset:offset + take]
            try:
                return self._dir.read_at(pack_name(ref.pack), ref.offset + offset, take)
            except OSError as e:
                raise StorageError(f"checkpoint piece {digest.hex()[:16]}: {e}") from e

    def read_view(self, index: int) -> ByteView:
        """The data of stored checkpoint `index` as a view that reads the files on demand
        (`Directory.view`, or a `PackView` over its packs): it stays valid after the
        checkpoint is superseded and removed (its packs are kept while the view lives).
        Checksums are not re-verified here (the caller saved or loaded this checkpoint).

        Raises:
            StorageError: no such checkpoint, or its header does not match the file.
        """
        name = checkpoint_name(index)
        try:
            head = self._dir.read_at(name, 0, 8)
            if head == MAGIC3:
                with self._lock:
                    manifest = decode_manifest(self._dir.read(name))
                    refs = (manifest if isinstance(manifest, str)
                            else resolve(self._dir, manifest))
                    if isinstance(refs, str):
                        raise StorageError(f"{self._dir.path(name)}: {refs}")
                    assert not isinstance(manifest, str)
                    if manifest.index != index:
                        raise StorageError(f"{self._dir.path(name)}: not checkpoint {index}")
                    view = PackView(self._dir, refs)
                    self._views.add(view)
                    return view
            size = self._dir.size(name)
            found = data_range(self._dir.read_at(name, 0, HEADER_SIZE), size)
            if isinstance(found, str):
                raise StorageError(f"{self._dir.path(name)}: {found}")
            stored, _, data_at, data_len = found
            if stored != index:
                raise StorageError(f"{self._dir.path(name)}: not checkpoint {index}")
            return self._dir.view(name, data_at, data_len)
        except (OSError, ValueError) as e:
            raise StorageError(f"reading checkpoint {index} failed: {e}") from e

    def _decode_v3(self, raw: bytes) -> StoredCheckpoint | str:
        manifest = decode_manifest(raw)
        if isinstance(manifest, str):
            return manifest
        keep = self.memory.put if self.memory.budget else None
        with self._lock:
            refs = resolve(self._dir, manifest)
            data = refs if isinstance(refs, str) else read_pieces(self._dir, refs, keep=keep)
        if isinstance(data, str):
            return data
        return StoredCheckpoint(index=manifest.index, data=data, meta=manifest.meta)

    def load_latest(self) -> LoadedCheckpoint:
        """The newest valid checkpoint, with a problem line for every newer invalid one (a
        v3 checkpoint is valid when its manifest, every group and every piece check out).
        The first call fsyncs the directory first (module docstring); `StorageError` if
        that fails."""
        if not self._settled:
            try:
                self._dir.fsync_dir()
            except OSError as e:
                raise StorageError(f"making the checkpoints durable failed: {e}") from e
            self._settled = True
        problems: list[str] = []
        for index in reversed(self.indexes()):
            name = checkpoint_name(index)
            result: StoredCheckpoint | str
            try:
                raw = self._dir.read(name)
                result = self._decode_v3(raw) if raw[:8] == MAGIC3 else decode_checkpoint(raw)
            except OSError as e:
                result = f"unreadable: {e}"
            if isinstance(result, StoredCheckpoint) and result.index != index:
                result = f"holds index {result.index}, not {index}"
            if isinstance(result, StoredCheckpoint):
                return LoadedCheckpoint(checkpoint=result, problems=tuple(problems))
            problems.append(f"{self._dir.path(name)}: {result}")
        return LoadedCheckpoint(checkpoint=None, problems=tuple(problems))


@dataclass(slots=True)
class SaveStats:
    """What one save wrote: bytes (pieces, groups and manifest; the v2 file's data for layout
    2), of which `copied` out of sparse packs, and how many pieces it wrote anew or found
    already stored."""

    written: int = 0
    copied: int = 0
    new_pieces: int = 0
    reused_pieces: int = 0

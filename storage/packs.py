"""Content-addressed checkpoint pieces: pack files, the version 3 manifest, and views over them.

Owns: the piece reference (`Ref`), the pack file naming, the manifest layout (checkpoint file
format v3, written by `phalanx.storage.checkpoint.FileCheckpointStore`), the grouping of piece
references into content-addressed groups, `pieces_of` (a checkpoint stream cut into pieces,
each named by its SHA-256) and `PackView` (a checkpoint's data read from its packs on demand).
Must not import: `phalanx.consensus`, `phalanx.apps`, `os` (works on any `Directory`).

Layout (integers little-endian):
- A piece is a run of checkpoint data named by its SHA-256. A checkpoint stream's `Piece`s (an
  app's content-defined shards, which carry their digest) are pieces as they are; plain `bytes`
  chunks between them are gathered and cut into pieces of `PIECE_BYTES` (the last one shorter).
- ``ckpack-<id, 20 digits>.pack``: the pieces one save wrote that no retained checkpoint held
  yet, concatenated; written once, fsynced, never modified.
- A reference (52 bytes): sha256 (32) | u64 pack id | u64 offset | u32 length.
- A group: the references of consecutive pieces, concatenated; itself a piece (in a pack,
  named by its hash). A group ends after a piece whose digest's first two bytes are 0 modulo
  `GROUP_MEAN`, or at `GROUP_MAX` references: content-defined, so a change re-writes only the
  groups around it and the manifest stays small (~1 KiB for a 1M-key KV state).
- Manifest ``checkpoint-<index>.ckpt`` (v3): b"PHXCKP03" | u64 index | u32 meta_len |
  u64 data_len | u32 group count | meta | group references | u32 crc32(all before) |
  b"PHXEND03".
Invariants: the data of a checkpoint is its groups' pieces in order; a loader checks the
manifest's CRC and end marker, each group's and piece's SHA-256 and the total length, and
never returns data that failed one (`resolve`, `read_pieces`).
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from phalanx.storage.directory import Directory
from phalanx.storage.interface import Piece

PACK_PREFIX = "ckpack-"
PACK_SUFFIX = ".pack"
PIECE_BYTES = 256 << 10
"""Plain `bytes` chunks are cut into pieces of this size (apps without their own shards)."""
GROUP_MEAN = 32
GROUP_MAX = 256
MAGIC3 = b"PHXCKP03"
_END3 = b"PHXEND03"
_HEAD3 = struct.Struct("<8sQIQI")  # magic, index, meta_len, data_len, groups
_REF = struct.Struct("<32sQQI")  # sha256, pack id, offset, length
REF_SIZE = _REF.size


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a piece lives: `length` bytes at `offset` of pack `pack`, with SHA-256 `digest`."""

    digest: bytes
    pack: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Manifest:
    index: int
    meta: bytes
    data_len: int
    groups: tuple[Ref, ...]


def pack_name(pack: int) -> str:
    return f"{PACK_PREFIX}{pack:020d}{PACK_SUFFIX}"


def parse_pack_name(name: str) -> int | None:
    if not (name.startswith(PACK_PREFIX) and name.endswith(PACK_SUFFIX)):
        return None
    digits = name[len(PACK_PREFIX):-len(PACK_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def encode_refs(refs: Iterable[Ref]) -> bytes:
    pack = _REF.pack
    return b"".join(pack(r.digest, r.pack, r.offset, r.length) for r in refs)


def decode_refs(raw: bytes | memoryview) -> list[Ref] | str:
    if len(raw) % REF_SIZE:
        return f"{len(raw)} bytes of references is not a multiple of {REF_SIZE}"
    return [Ref(*fields) for fields in _REF.iter_unpack(raw)]


def group_ends(digest: bytes, size: int) -> bool:
    """Whether a group of `size` references ends after the piece with `digest`."""
    return size >= GROUP_MAX or not int.from_bytes(digest[:2], "little") % GROUP_MEAN


def encode_manifest(index: int, meta: bytes, data_len: int, groups: Sequence[Ref]) -> bytes:
    body = _HEAD3.pack(MAGIC3, index, len(meta), data_len, len(groups)) + meta + encode_refs(groups)
    return body + zlib.crc32(body).to_bytes(4, "little") + _END3


def decode_manifest(raw: bytes) -> Manifest | str:
    """The manifest in a v3 file's bytes, or why it is invalid."""
    if len(raw) < _HEAD3.size + 12:
        return f"only {len(raw)} bytes"
    if raw[-8:] != _END3:
        return "no end marker (the file was cut short)"
    body = memoryview(raw)[:-12]
    if zlib.crc32(body) != int.from_bytes(raw[-12:-8], "little"):
        return "manifest checksum mismatch"
    magic, index, meta_len, data_len, n_groups = _HEAD3.unpack_from(raw)
    if magic != MAGIC3 or _HEAD3.size + meta_len + n_groups * REF_SIZE != len(body):
        return "manifest lengths do not match the file size"
    at = _HEAD3.size + meta_len
    groups = decode_refs(body[at:])
    if isinstance(groups, str):
        return groups
    return Manifest(index=index, meta=bytes(body[_HEAD3.size:at]), data_len=data_len,
                    groups=tuple(groups))


def _read(directory: Directory, ref: Ref) -> bytes | str:
    """A piece's bytes, checked against its digest, or why not."""
    name = pack_name(ref.pack)
    try:
        raw = directory.read_at(name, ref.offset, ref.length)
    except OSError as e:
        return f"{directory.path(name)} unreadable: {e}"
    if len(raw) != ref.length:
        return f"{directory.path(name)} ends inside a piece (offset {ref.offset})"
    if hashlib.sha256(raw).digest() != ref.digest:
        return f"{directory.path(name)}: piece at offset {ref.offset} fails its SHA-256"
    return raw


def resolve(directory: Directory, manifest: Manifest) -> list[Ref] | str:
    """The references of every piece of `manifest`'s data, in order (each group read and
    checked against its hash), or why they cannot be had."""
    pieces: list[Ref] = []
    for group in manifest.groups:
        raw = _read(directory, group)
        if isinstance(raw, str):
            return f"group: {raw}"
        refs = decode_refs(raw)
        if isinstance(refs, str):
            return f"group: {refs}"
        pieces.extend(refs)
    if sum(r.length for r in pieces) != manifest.data_len:
        return f"pieces do not add up to the {manifest.data_len} bytes the manifest declares"
    return pieces


def read_pieces(directory: Directory, refs: Iterable[Ref],
                keep: Callable[[bytes, bytes], None] | None = None) -> bytes | str:
    """The concatenated pieces, each checked against its SHA-256, or why not; `keep` is
    handed each checked piece (digest, bytes)."""
    parts: list[bytes] = []
    for ref in refs:
        raw = _read(directory, ref)
        if isinstance(raw, str):
            return raw
        if keep is not None:
            keep(ref.digest, raw)
        parts.append(raw)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class BytesPiece:
    """A piece whose bytes are already at hand."""

    digest: bytes
    raw: bytes

    def data(self) -> bytes:
        return self.raw


def pieces_of(chunks: Iterable[bytes | Piece], piece_bytes: int = PIECE_BYTES
              ) -> Iterator[Piece | None]:
    """The stream's pieces (module docstring), with `None` for a chunk that completed none
    (so a paced caller keeps its rhythm)."""
    pending: list[bytes] = []
    size = 0

    def cut(final: bool) -> Iterator[Piece]:
        nonlocal pending, size
        if not size:
            return
        joined = b"".join(pending) if len(pending) > 1 else pending[0]
        at = 0
        while len(joined) - at >= piece_bytes or (final and at < len(joined)):
            raw = joined[at:at + piece_bytes]
            at += len(raw)
            yield BytesPiece(hashlib.sha256(raw).digest(), raw)
        pending = [joined[at:]] if at < len(joined) else []
        size = len(joined) - at

    for chunk in chunks:
        if isinstance(chunk, bytes):
            if not chunk:
                yield None
                continue
            pending.append(chunk)
            size += len(chunk)
            if size < piece_bytes:
                yield None
                continue
            yield from cut(False)
        else:
            yield from cut(True)
            yield chunk
    yield from cut(True)


class PackView:
    """A checkpoint's data as a read-only `ByteView` over its pieces in pack files, read on
    demand (`Directory.read_at`). Not re-verified (the store saved or loaded it). The store
    that made it keeps the packs it names until the view is garbage-collected (`packs`)."""

    __slots__ = ("__weakref__", "_dir", "_length", "_refs", "_starts", "packs")

    def __init__(self, directory: Directory, refs: Sequence[Ref]) -> None:
        self._dir = directory
        self._refs = tuple(refs)
        starts = [0]
        for ref in self._refs:
            starts.append(starts[-1] + ref.length)
        self._starts = starts
        self._length = starts[-1]
        self.packs = frozenset(r.pack for r in self._refs)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"PackView(pieces={len(self._refs)}, length={self._length})"

    def __getitem__(self, key: slice, /) -> bytes:
        if not isinstance(key, slice):
            raise TypeError("PackView supports slices only")
        lo, hi, step = key.indices(self._length)
        if step != 1:
            raise ValueError("PackView slices must be contiguous (step 1)")
        parts: list[bytes] = []
        i = bisect.bisect_right(self._starts, lo) - 1
        while lo < hi:
            ref, start = self._refs[i], self._starts[i]
            take = min(hi, start + ref.length) - lo
            piece = self._dir.read_at(pack_name(ref.pack), ref.offset + lo - start, take)
            if len(piece) != take:
                raise OSError(f"{self._dir.path(pack_name(ref.pack))} ended early")
            parts.append(piece)
            lo += take
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

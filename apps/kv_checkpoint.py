"""The KV store's checkpoint format: `KvSnapshot` (writing it in bounded steps) and
`parse_checkpoint` (reading and checking it).

Owns: the format below, its bounded-work serialisation and its strict parsing; nothing here
mutates a `KvStateMachine` (`phalanx.apps.kv` restores from what `parse_checkpoint` returns).
Must not import: consensus cores, storage, trio, clocks.

Invariants: equal states give equal bytes on every replica (keys sorted, content-defined
shards); every malformed input raises `SnapshotFormatError`, never anything else. `pieces`
gives each shard with its SHA-256, cached on the shard (`PackedShard.ckpt_digest`), so a
checkpoint after a few writes hashes and serialises only the shards they touched.

Checkpoint format (version 3), a stream of msgpack objects, concatenated:
    ["phalanx.kv", 3]
    [keys, key_offsets, values, value_offsets]   # one array per shard, repeated
    count                                         # an int: how many keys came before it
A shard is the state's own packed shard (`phalanx.apps.kv_base.PackedShard`): `keys` is the
shard's keys concatenated (a str) and `values` their values concatenated (bytes); each
`*_offsets` holds the N + 1 offsets (first 0, last the length of the str in code points or of
the bytes) as little-endian unsigned integers of 4 bytes, or 8 when the last one does not fit
in 4. Keys are strictly ascending (by code point) across the whole stream, and the shards are
the ones the content-defined cut rule makes of the keys (`phalanx.apps.kv_base`), so equal
states give equal bytes on every replica. Writing a shard nothing changed is a copy of its
parts; loading one is a few C calls. `restore` checks the header, types, offsets, limits, the
order, the cut rule at each shard's end and the count, and raises `SnapshotFormatError`
otherwise (cut keys inside a shard are checked by the first checkpoint that reuses it).
Version 4 (transaction mode, when some key has version metadata: `phalanx.apps.kv_versions`)
is version 3 with header ``["phalanx.kv", 4]`` and, between the last shard and the count, the
metadata chunks ``["versions", [key, base, mix, run, ...]]`` (keys strictly ascending across
chunks); a state without metadata (Raft, PBFT) is always written as version 3, byte for byte
as before.
Versions 1 (`["phalanx.kv", 1, count]`, then `[k1, v1, k2, v2, ...]` arrays) and 2 (the same
arrays after `["phalanx.kv", 2]`, then the count) still load.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import operator
import sys
from array import array
from collections.abc import Iterable, Iterator

import immutables
import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps import kv_versions
from phalanx.apps.interface import SnapshotFormatError
from phalanx.apps.kv_base import (
    MAX_SHARD_KEYS,
    SHARD_KEYS,
    PackedShard,
    ShardPacker,
    SortedBase,
    is_cut,
)
from phalanx.apps.kv_state import LayeredSnapshot
from phalanx.apps.kv_types import MAX_KEY_BYTES, MAX_VALUE_BYTES
from phalanx.apps.kv_validate import key_too_large
from phalanx.apps.kv_versions import KeyMeta
from phalanx.apps.sorted_steps import sorted_in_steps

WINDOW_KEYS = 1024
"""Base keys merged per serialisation step: C-level slicing of the packed keys and values (a
new `str` and `bytes` per pair, ~0.35 ms per 1000 of each) plus a bisect per overlay key in
the window, so one step stays under a millisecond."""
SORT_RUN = 1024
STEP_KEYS = 256
"""Overlay keys sorted or merged per serialisation step (Python-level heap merge): bounds one
step to well under a millisecond, so the applying thread never waits long for the GIL."""
_MAGIC = "phalanx.kv"
_VERSION = 3
_VERSION_META = 4
Metadata = immutables.Map[str, KeyMeta]


class KvSnapshot:
    """An O(1) snapshot of a `KvStateMachine`, serialised in bounded steps."""

    __slots__ = ("_meta", "_view")

    def __init__(self, view: LayeredSnapshot, meta: Metadata) -> None:
        self._view = view
        self._meta = meta

    def __len__(self) -> int:
        return self._view.count()

    def chunks(self) -> Iterator[bytes]:
        """The checkpoint (module docstring), one packed shard per step, `b""` between
        steps that produced none."""
        for chunk in self._steps(hashed=False):
            yield chunk if isinstance(chunk, bytes) else chunk.data()

    def pieces(self) -> Iterator[bytes | ShardPiece]:
        """The same stream as `chunks`, each shard as a `ShardPiece` known by its SHA-256
        (`phalanx.apps.interface.PiecedSnapshot`): a shard no write touched since the last
        checkpoint kept its digest, so a content-addressed store skips it without it being
        serialised or hashed again."""
        return self._steps(hashed=True)

    def _steps(self, *, hashed: bool) -> Iterator[bytes | ShardPiece]:
        view, meta = self._view, self._meta
        yield msgpack.packb([_MAGIC, _VERSION_META if meta else _VERSION])
        for shard in view.shards(window=WINDOW_KEYS, run=SORT_RUN, step=STEP_KEYS):
            if shard is None:
                yield b""
            elif not hashed:
                yield _pack_shard(shard)
            elif shard.ckpt_digest is not None:
                yield ShardPiece(shard.ckpt_digest, shard, None)
            else:
                raw = _pack_shard(shard)
                shard.ckpt_digest = digest = hashlib.sha256(raw).digest()
                yield ShardPiece(digest, shard, raw)
        for keys in sorted_in_steps(meta.keys(), run=SORT_RUN, step=STEP_KEYS):
            if keys is None:
                yield b""
                continue
            yield msgpack.packb(kv_versions.pack_entries((k, meta[k]) for k in keys),
                                use_bin_type=True)
        yield msgpack.packb(view.count())  # counted by the fold that just ran


class ShardPiece:
    """One shard of a KV checkpoint known by its SHA-256 (`digest`); `data()` is its bytes
    (`raw` when just made, else packed again from the shard: a copy of its parts)."""

    __slots__ = ("_raw", "_shard", "digest")

    def __init__(self, digest: bytes, shard: PackedShard, raw: bytes | None) -> None:
        self.digest = digest
        self._shard = shard
        self._raw = raw

    def data(self) -> bytes:
        return self._raw if self._raw is not None else _pack_shard(self._shard)


def _pack_shard(shard: PackedShard) -> bytes:
    """A shard's bytes in the checkpoint (module docstring)."""
    kstr, kpos, blob, offsets = shard.packed()
    raw: bytes = msgpack.packb([kstr, _offsets_out(kpos), blob, _offsets_out(offsets)])
    return raw


def _offsets_out(offsets: array[int]) -> bytes:
    """Offsets as the format stores them: little-endian, 4 bytes each if the last fits."""
    width = "I" if offsets[-1] < 1 << 32 else "Q"
    if offsets.typecode != width or sys.byteorder == "big":
        offsets = array(width, offsets)
        if sys.byteorder == "big":
            offsets.byteswap()
    return offsets.tobytes()


def _offsets_in(raw: bytes, total: int, what: str) -> array[int]:
    """Offsets stored by `_offsets_out` over `total` code points or bytes; checks the width,
    the count, and the first and last (not the order: see `_lengths`). Raises
    `SnapshotFormatError`."""
    offsets = array("I" if total < 1 << 32 else "Q")
    if len(raw) % offsets.itemsize or len(raw) < 2 * offsets.itemsize:
        raise SnapshotFormatError(f"KV checkpoint shard: malformed {what} offsets")
    offsets.frombytes(raw)
    if sys.byteorder == "big":
        offsets.byteswap()
    if offsets[0] != 0 or offsets[-1] != total:
        raise SnapshotFormatError(f"KV checkpoint shard: {what} offsets out of range")
    return offsets


def _lengths(offsets: array[int], what: str) -> array[int]:
    """The lengths between consecutive `offsets`; raises `SnapshotFormatError` if one is
    negative (an offset decreased: an unsigned array refuses it)."""
    try:
        return array(offsets.typecode, map(
            operator.sub, itertools.islice(offsets, 1, None), offsets))
    except OverflowError:
        raise SnapshotFormatError(
            f"KV checkpoint shard: {what} offsets out of order") from None


def parse_checkpoint(data: bytes) -> tuple[SortedBase, Metadata]:
    """Decode the KV checkpoint format (module docstring, versions 1 to 4): the state and
    its version metadata; raise `SnapshotFormatError`."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=0)
    unpacker.feed(data)
    try:
        header = next(unpacker)
    except (StopIteration, ValueError, msgpack.UnpackException) as exc:
        raise SnapshotFormatError(f"KV checkpoint header unreadable: {exc}") from exc
    # Version 1 declares the count up front, versions 2 and 3 in a trailer.
    count: int | None = None
    if (
        isinstance(header, list)
        and len(header) == 3
        and header[:2] == [_MAGIC, 1]
        and type(header[2]) is int
        and header[2] >= 0
    ):
        count = header[2]
    elif header not in ([_MAGIC, 2], [_MAGIC, _VERSION], [_MAGIC, _VERSION_META]):
        raise SnapshotFormatError(
            f"not a KV checkpoint header (version 1 to {_VERSION_META}): {header!r}"
        )
    # NB: bulk-loading allocates steadily next to a growing state; pausing the collector
    # keeps its passes from walking it again and again.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        body = _Body(unpacker)
        meta: list[tuple[str, KeyMeta]] = []
        if header == [_MAGIC, _VERSION_META]:
            shards = _parse_shards(_split_versions(body, meta))
        elif header == [_MAGIC, _VERSION]:
            shards = _parse_shards(body)
        else:
            shards = _parse_pairs(body)
        trailer = body.trailer
        if count is None:
            if trailer is None:
                raise SnapshotFormatError("KV checkpoint ends without its count (truncated?)")
            count = trailer
        elif trailer is not None:
            raise SnapshotFormatError("KV checkpoint has data after its last chunk")
        held = sum(map(len, shards))
        if held != count:
            raise SnapshotFormatError(f"KV checkpoint declares {count} keys, holds {held}")
        return SortedBase(shards), immutables.Map(meta)
    except (ValueError, msgpack.UnpackException) as exc:
        raise SnapshotFormatError(f"KV checkpoint body unreadable: {exc}") from exc
    finally:
        if gc_was_enabled:
            gc.enable()


def _check_keys(keys: list[str], previous: str | None, longest: int) -> None:
    """Strictly ascending after `previous`, and within the key size limit (`longest`: the
    most code points of any; C-level passes: a million keys take ~0.1 s, not ~1 s). Raises
    `SnapshotFormatError`."""
    if (previous is not None and not previous < keys[0]) or not all(
        map(operator.lt, keys, itertools.islice(keys, 1, None))
    ):
        raise SnapshotFormatError("KV checkpoint keys not strictly ascending")
    # A code point is at most 4 UTF-8 bytes: only long keys need the per-key check.
    if longest * 4 > MAX_KEY_BYTES and any(map(key_too_large, keys)):
        raise SnapshotFormatError("KV checkpoint key over the size limit")


class _Body:
    """The objects after a checkpoint's header, in order, with the count trailer (an int: the
    last object of versions 2 and 3) kept apart in `trailer`; anything after it is refused."""

    def __init__(self, unpacker: msgpack.Unpacker) -> None:
        self._unpacker = unpacker
        self.trailer: int | None = None

    def __iter__(self) -> Iterator[object]:
        for item in self._unpacker:
            if self.trailer is not None:
                raise SnapshotFormatError("KV checkpoint has data after its count")
            if type(item) is int:
                self.trailer = item
            else:
                yield item


def _split_versions(items: Iterable[object], meta: list[tuple[str, KeyMeta]]
                    ) -> Iterator[object]:
    """Version 4: the shards of `items`, passed on; the version chunks after them (checked)
    appended to `meta`."""
    for item in items:
        if type(item) is list and len(item) == 2:
            entries = kv_versions.unpack_entries(item, meta[-1][0] if meta else None)
            meta.extend(entries)
        elif meta:
            raise SnapshotFormatError("KV checkpoint: a shard after the version chunks")
        else:
            yield item


def _parse_shards(body: Iterable[object]) -> list[PackedShard]:
    """Version 3's shards: each checked, then adopted as it is."""
    shards: list[PackedShard] = []
    previous: str | None = None
    open_ended = False  # the previous shard ended without a cut: it must have been the last
    for item in body:
        if type(item) is not list or len(item) != 4:
            raise SnapshotFormatError("KV checkpoint shard is not [keys, offsets, values, offsets]")
        kstr, kraw, blob, vraw = item
        if type(kstr) is not str or type(kraw) is not bytes or type(blob) is not bytes or (
            type(vraw) is not bytes
        ):
            raise SnapshotFormatError("KV checkpoint shard: wrong field types")
        kpos = _offsets_in(kraw, len(kstr), "key")
        offsets = _offsets_in(vraw, len(blob), "value")
        if len(kpos) != len(offsets):
            raise SnapshotFormatError("KV checkpoint shard: key and value counts differ")
        if open_ended:
            raise SnapshotFormatError("KV checkpoint shard ends where the cut rule does not cut")
        if max(_lengths(offsets, "value")) > MAX_VALUE_BYTES:
            raise SnapshotFormatError("KV checkpoint value over the size limit")
        # Key offsets that decrease need no check of their own: they cut an empty key after
        # another one, which fails the order check ("" sorts first).
        keys = list(map(kstr.__getitem__, map(slice, kpos, itertools.islice(kpos, 1, None))))
        _check_keys(keys, previous, max(map(len, keys)))
        # The cut rule at the shard's end: a cut key, or a full shard, or the last shard
        # (checked when another follows). Cut keys inside are not looked for here (a CRC
        # per key): the first fold that would reuse the shard checks it (`follows`).
        open_ended = not is_cut(keys[-1], SHARD_KEYS) and len(keys) < MAX_SHARD_KEYS
        if len(keys) > MAX_SHARD_KEYS:
            raise SnapshotFormatError("KV checkpoint shard over the size limit")
        previous = keys[-1]
        del keys
        shards.append(PackedShard.from_packed(kstr, kpos, blob, offsets))
    return shards


def _parse_pairs(body: _Body) -> list[PackedShard]:
    """Versions 1 and 2: arrays of key/value pairs, packed into shards by the cut rule as
    they come."""
    packer = ShardPacker(SHARD_KEYS)
    previous: str | None = None
    for flat in body:
        if not isinstance(flat, list) or len(flat) % 2:
            raise SnapshotFormatError("KV checkpoint chunk is not a list of key/value pairs")
        keys = flat[0::2]
        values = flat[1::2]
        if not keys:
            raise SnapshotFormatError("KV checkpoint holds an empty chunk")
        if set(map(type, keys)) != {str} or set(map(type, values)) != {bytes}:
            raise SnapshotFormatError("KV checkpoint: non-str key or non-bytes value")
        _check_keys(keys, previous, max(map(len, keys)))
        if max(map(len, values)) > MAX_VALUE_BYTES:
            raise SnapshotFormatError("KV checkpoint entry over the size limits")
        previous = keys[-1]
        packer.add(keys, values)
    packer.flush()
    return packer.shards

"""The KV store: a `StateMachine` over a persistent map from `str` keys to `bytes` values.

Owns: command execution (put, get, delete, compare-and-set, prefix scan, multi-key
transaction, versions and the commuting updates of `phalanx.apps.kv_ops`), the KV checkpoint
format, and the `EndorsementHooks` of the KV app (`access` describes puts and updates as
`KeyUpdate`s; `commutes` is `kv_ops.commutes`, PnyxDB's conflict matrix; `versions` per key
as `kv_ops.version_of`; `needs_requirements` every key but those only updated by
`kv_ops.ORDER_FREE_OPS`).

Must not import: consensus cores, storage, trio, clocks.

Invariants:
- A `Txn` is atomic: its compares and the chosen branch's writes run in one `execute`, and
  a refused `Txn` (limits, duplicate keys) changes nothing.
- `apply`/`query` never raise: bytes that do not decode to a KV command, or a command over the
  size limits, get a `KvError` result and change nothing.
- State is a `LayeredState` (`phalanx.apps.kv_state`): a sorted, sharded dict base under
  persistent overlays; `snapshot()` is O(1) and a snapshot never changes.
- Determinism: no behaviour depends on the map's (hash-seeded) iteration order; scans and
  checkpoints sort keys.

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
import itertools
import operator
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence

import immutables
import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps import kv_ops, kv_versions, kv_wire
from phalanx.apps.interface import KeyAccess, KeyUpdate, SnapshotFormatError, Verdict
from phalanx.apps.kv_base import (
    MAX_SHARD_KEYS,
    SHARD_KEYS,
    PackedShard,
    ShardPacker,
    SortedBase,
    is_cut,
)
from phalanx.apps.kv_state import LayeredSnapshot, LayeredState
from phalanx.apps.kv_types import (
    MAX_COMMAND_BYTES,
    MAX_KEY_BYTES,
    MAX_SCAN_LIMIT,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    READ_COMMANDS,
    Add,
    CasResult,
    CompareAndSet,
    Concat,
    Delete,
    Deleted,
    Done,
    Get,
    GetBaseVersion,
    GetVersion,
    GetVersioned,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Mul,
    Put,
    SAdd,
    Scan,
    ScanResult,
    SRem,
    Txn,
    TxnResult,
    Value,
    VersionedValue,
    VersionResult,
)
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
_DONE = Done()
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
        view, meta = self._view, self._meta
        yield msgpack.packb([_MAGIC, _VERSION_META if meta else _VERSION])
        for shard in view.shards(window=WINDOW_KEYS, run=SORT_RUN, step=STEP_KEYS):
            if shard is None:
                yield b""
                continue
            kstr, kpos, blob, offsets = shard.packed()
            yield msgpack.packb([kstr, _offsets_out(kpos), blob, _offsets_out(offsets)])
        for keys in sorted_in_steps(meta.keys(), run=SORT_RUN, step=STEP_KEYS):
            if keys is None:
                yield b""
                continue
            yield msgpack.packb(kv_versions.pack_entries((k, meta[k]) for k in keys),
                                use_bin_type=True)
        yield msgpack.packb(view.count())  # counted by the fold that just ran


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


class KvStateMachine:
    """A replicated key-value store. Keys are `str`, values `bytes` (see `kv_types` limits)."""

    max_command_bytes = MAX_COMMAND_BYTES
    """`Admission`: the largest command `admit` accepts."""

    def __init__(self) -> None:
        # Invariant: every key is a str within MAX_KEY_BYTES, every value bytes within
        # MAX_VALUE_BYTES.
        self._data = LayeredState()
        self._meta: Metadata = immutables.Map()
        """Version metadata of the keys written in transaction mode (`apply_tx`)."""

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> bytes | None:
        """Local read of one key (tests and tools; clients go through `query`)."""
        return self._data.get(key)

    # ---------------------------------------------------------------- StateMachine

    def apply(self, command: bytes) -> bytes:
        return kv_wire.encode_result(self.execute(kv_wire.decode_command(command)))

    def query(self, request: bytes) -> bytes:
        cmd = kv_wire.decode_command(request)
        if not isinstance(cmd, (KvError, *READ_COMMANDS)):
            cmd = KvError(
                code=KvErrorCode.NOT_A_QUERY,
                message=f"{type(cmd).__name__} changes state; submit it as a command",
            )
        return kv_wire.encode_result(self.execute(cmd))

    def snapshot(self) -> KvSnapshot:
        return KvSnapshot(self._data.snapshot(), self._meta)

    def restore(self, data: bytes) -> None:
        base, meta = _parse_checkpoint(data)
        self._data = LayeredState(base)
        self._meta = meta

    def apply_tx(self, tx_id: bytes, command: bytes) -> bytes:
        """`TransactionAware`: apply `command` as transaction `tx_id` (transaction mode),
        advancing the version metadata of every key it may write (`kv_versions.advance`:
        a commuting update that fits the key's run joins it, any other write moves the
        base), whatever its result."""
        cmd = kv_wire.decode_command(command)
        access = self._access_of(cmd)
        if access.writes:
            meta = self._meta.mutate()
            updates = {u.key: u for u in access.updates}
            for key in access.writes:
                meta[key] = kv_versions.advance(meta.get(key), tx_id, updates.get(key))
            self._meta = meta.finish()
        return kv_wire.encode_result(self.execute(cmd))

    def admit(self, command: bytes, read_only: bool) -> str | None:
        """`Admission`: refuse, on arrival, a command over the size limits (the checks
        `validate` repeats at apply time) or over `MAX_COMMAND_BYTES`."""
        size = len(command)
        if size <= MAX_KEY_BYTES:
            return None  # too short to hold an oversized key or value: skip the decode
        if size > MAX_COMMAND_BYTES:
            return f"command of {size} bytes exceeds {MAX_COMMAND_BYTES} bytes"
        cmd = kv_wire.decode_command(command)
        if isinstance(cmd, KvError):
            return None  # malformed: apply answers it with its typed error
        problem = validate(cmd)
        if problem is not None and problem.code in _SIZE_ERRORS:
            return problem.message
        return None

    def maintain(self) -> None:
        """`Housekeeping`: adopt a finished fold, free a few pieces of replaced layers."""
        self._data.maintain()

    # ---------------------------------------------------------------- typed execution

    def execute(self, cmd: KvCommand | KvError) -> KvResult:
        """Execute a typed command (an already-decoded `KvError` is passed through)."""
        if (type(cmd) is Put and len(cmd.value) <= MAX_VALUE_BYTES
                and not _key_too_large(cmd.key)):
            # A valid put, ahead of the general checks and the dispatch below: puts are most
            # of what a node applies and all of a typical WAL replay.
            self._data.set(cmd.key, cmd.value)
            return _DONE
        if isinstance(cmd, KvError):
            return cmd
        problem = validate(cmd)
        if problem is not None:
            return problem
        data = self._data
        match cmd:
            case Put(key=key, value=value):
                data.set(key, value)
                return Done()
            case Get(key=key):
                return Value(value=data.get(key))
            case GetVersion(key=key):
                return VersionResult(version=self._version(key))
            case GetBaseVersion(key=key):
                return VersionResult(version=self.base_versions((key,))[0])
            case GetVersioned(key=key):
                found = data.get(key)
                return VersionedValue(value=found, version=kv_versions.full_version(
                    self._meta.get(key), found))
            case Add() | Mul() | SAdd() | SRem() | Concat():
                new, result = kv_ops.run_update(cmd, data.get(cmd.key))
                if new is not None:
                    data.set(cmd.key, new)
                return result
            case Delete(key=key):
                return Deleted(existed=data.delete(key))
            case CompareAndSet(key=key, expected=expected, new=new):
                current = data.get(key)
                if current != expected:
                    return CasResult(succeeded=False, current=current)
                data.set(key, new)
                return CasResult(succeeded=True, current=new)
            case Scan(prefix=prefix, limit=limit):
                # NB: O(n) in the number of keys: neither layer is ordered. Fine for an
                # example app; an ordered persistent map would make this O(log n + limit).
                matches = data.keys_with_prefix(prefix)
                items = tuple(
                    (k, v) for k in matches[:limit] if (v := data.get(k)) is not None
                )
                return ScanResult(items=items, more=len(matches) > limit)
            case Txn(compares=compares, success=success, failure=failure):
                observed = tuple(data.get(c.key) for c in compares)
                held = all(o == c.expected for o, c in zip(observed, compares, strict=True))
                data.write_all(
                    (w.key, w.value if isinstance(w, Put) else None)
                    for w in (success if held else failure)
                )
                return TxnResult(succeeded=held, observed=observed)

    # ---------------------------------------------------------------- EndorsementHooks

    def access(self, command: bytes) -> KeyAccess:
        return self._access_of(kv_wire.decode_command(command))

    def _access_of(self, cmd: KvCommand | KvError) -> KeyAccess:
        match cmd:
            case Put(key=key, value=value):
                return KeyAccess(writes=(key,), updates=(kv_ops.update_of(None, key=key,
                                                                          value=value),))
            case Add() | Mul() | SAdd() | SRem() | Concat():
                return KeyAccess(writes=(cmd.key,), updates=(kv_ops.update_of(cmd),))
            case Delete(key=key):
                return KeyAccess(writes=(key,))
            case (Get(key=key) | GetVersion(key=key) | GetVersioned(key=key)
                  | GetBaseVersion(key=key)):
                return KeyAccess(reads=(key,))
            case CompareAndSet(key=key):
                return KeyAccess(reads=(key,), writes=(key,))
            case Scan(prefix=prefix):
                return KeyAccess(read_prefixes=(prefix,))
            case Txn(compares=compares, success=success, failure=failure):
                # `KeyAccess` holds sorted unique keys; a txn may name them in any order.
                # A txn that may write counts as writing every key it compares too (its
                # version moves in transaction mode), so it never shares a compared key's
                # version with a later writer of that key (docs/LEADERLESS.md, "A committed
                # read held at the version gate").
                compared = {c.key for c in compares}
                written = {w.key for w in success + failure}
                return KeyAccess(reads=tuple(sorted(compared)),
                                 writes=tuple(sorted(written | compared if written else ())))
            case KvError():
                return KeyAccess()

    def commutes(self, a: KeyUpdate, b: KeyUpdate) -> bool:
        """PnyxDB's conflict matrix over the KV updates (`kv_ops.commutes`)."""
        return kv_ops.commutes(a, b)

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """Each key's version (`kv_ops.version_of`: SHA-512 of the value, b"" if absent;
        the full version of `kv_versions` for a key written in transaction mode)."""
        return tuple(self._version(key) for key in keys)

    def _version(self, key: str) -> bytes:
        meta = self._meta.get(key)
        if meta is not None:
            return kv_versions.full_version(meta, None)
        return kv_ops.version_of(self._data.get(key))

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """Each key's BASE version (`kv_versions.base_version`)."""
        get, meta = self._data.get, self._meta.get
        return tuple(m.base if (m := meta(key)) is not None else kv_ops.version_of(get(key))
                     for key in keys)

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        """The keys `command` writes only by `kv_ops.ORDER_FREE_OPS` updates (sorted): a
        transaction carries a requirement on each, base or full."""
        access = self.access(command)
        need = set(access.writes).difference(self.needs_requirements(command))
        return tuple(sorted(need))

    def fits_run(self, command: bytes, keys: Sequence[str]) -> bool:
        """Whether each commuting update `command` makes to one of `keys` commutes with every
        update of that key's current run (`kv_versions.fits_run`): a transaction that
        requires only the base version of such a key is endorsed only then. State-dependent
        (a local vote, like `check`)."""
        wanted = set(keys)
        meta = self._meta.get
        return all(kv_versions.fits_run(meta(u.key), u)
                   for u in self.access(command).updates if u.key in wanted)

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        """Keys read, and keys written otherwise than only by `kv_ops.ORDER_FREE_OPS`
        updates (a scan's prefix is not listed: see `EndorsementHooks`)."""
        access = self.access(command)
        free = {u.key for u in access.updates if u.op in kv_ops.ORDER_FREE_OPS}
        free.difference_update(u.key for u in access.updates
                               if u.op not in kv_ops.ORDER_FREE_OPS)
        return tuple(sorted({*access.reads, *(k for k in access.writes if k not in free)}))

    def check(self, command: bytes) -> Verdict:
        cmd = kv_wire.decode_command(command)
        if isinstance(cmd, KvError):
            return Verdict(accept=False, reason=cmd.message)
        problem = validate(cmd)
        if problem is not None:
            return Verdict(accept=False, reason=problem.message)
        return Verdict(accept=True)


_SIZE_ERRORS = frozenset({KvErrorCode.KEY_TOO_LARGE, KvErrorCode.VALUE_TOO_LARGE,
                          KvErrorCode.TXN_TOO_LARGE})
"""The `validate` errors `admit` refuses on arrival (the others are answered by `apply`)."""


def _key_too_large(key: str) -> bool:
    # A code point takes at most 4 bytes of UTF-8: skip the encode for short keys.
    if len(key) * 4 <= MAX_KEY_BYTES:
        return False
    return len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES


def _validate_txn(txn: Txn) -> KvError | None:
    if len(txn.compares) > MAX_TXN_OPS or max(len(txn.success), len(txn.failure)) > MAX_TXN_OPS:
        return KvError(
            code=KvErrorCode.TXN_TOO_LARGE,
            message=f"a txn holds at most {MAX_TXN_OPS} compares and {MAX_TXN_OPS} writes "
            "per branch",
        )
    for compare in txn.compares:
        if _key_too_large(compare.key):
            return KvError(
                code=KvErrorCode.KEY_TOO_LARGE, message=f"key exceeds {MAX_KEY_BYTES} bytes"
            )
    for branch in (txn.success, txn.failure):
        seen: set[str] = set()
        for write in branch:
            problem = validate(write)
            if problem is not None:
                return problem
            if write.key in seen:
                return KvError(
                    code=KvErrorCode.DUPLICATE_KEY,
                    message=f"txn branch writes key {write.key!r} twice",
                )
            seen.add(write.key)
    return None


def validate(cmd: KvCommand) -> KvError | None:
    """The size and range checks every command passes before it runs (state-independent)."""
    if isinstance(cmd, Txn):
        return _validate_txn(cmd)
    key = cmd.prefix if isinstance(cmd, Scan) else cmd.key
    if _key_too_large(key):
        return KvError(code=KvErrorCode.KEY_TOO_LARGE, message=f"key exceeds {MAX_KEY_BYTES} bytes")
    value = b""
    match cmd:
        case Put(value=value) | CompareAndSet(new=value) | Concat(suffix=value):
            pass
        case SAdd(member=value) | SRem(member=value):
            pass
        case Add(amount=n) | Mul(factor=n) if not kv_ops.INT64_MIN <= n <= kv_ops.INT64_MAX:
            return KvError(
                code=KvErrorCode.INVALID_ARGUMENT,
                message=f"{type(cmd).__name__}: {n} is outside the signed 64-bit range",
            )
    if len(value) > MAX_VALUE_BYTES:
        return KvError(
            code=KvErrorCode.VALUE_TOO_LARGE, message=f"value exceeds {MAX_VALUE_BYTES} bytes"
        )
    if isinstance(cmd, Scan) and not 1 <= cmd.limit <= MAX_SCAN_LIMIT:
        return KvError(
            code=KvErrorCode.INVALID_LIMIT,
            message=f"scan limit must be in 1..{MAX_SCAN_LIMIT}, got {cmd.limit}",
        )
    return None


def _parse_checkpoint(data: bytes) -> tuple[SortedBase, Metadata]:
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
    if longest * 4 > MAX_KEY_BYTES and any(map(_key_too_large, keys)):
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

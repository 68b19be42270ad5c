"""The KV store's versions in transaction mode (the leaderless core): base and full versions.

Owns: `KeyMeta` (a key's version metadata), `advance` (what an applied transaction does to
it), `full_version`, `base_version`, `fits_run`, and the metadata's checkpoint encoding
(`pack_entries`, `unpack_entries`). The exact definition and the argument are in
docs/KV_STORAGE.md "Versions in transaction mode"; in short, for a key k:

- `base` = b"" until the first non-commuting write of k in transaction mode; then each such
  write (put, delete, cas, concat, a txn branch that may write k, an update that does not
  fit the run, or any update of a key its transaction requires by FULL version: `pinned` in
  `KvStateMachine.apply_tx`) makes it SHA-256(base || tx_id): a hash chain that never
  repeats (no ABA).
- `mix` = b"" after each base change; each commuting update that fits the run XORs in
  SHA-256(tx_id). `run` = the (op, operand) classes of those updates (operand kept only for
  sadd/srem, where the member decides commutativity), sorted, unique.
- full version = `base` when `mix` is b"", else SHA-256(base || mix): order-free over the
  commuting updates, distinct for two identical `add x 1` transactions.
- A key never written in transaction mode has no metadata: its version is b"" when absent,
  else SHA-512 of its value (`kv_ops.version_of`, the versions of Raft and PBFT), and its
  base version the same.

Invariants: metadata changes only through `advance`, at apply time, as a function of the
metadata, the transaction id and the command (so replicas that applied the same
transactions agree, whatever the order of the commuting ones); a deleted key keeps its
metadata (its version never returns to b""). Must not import: consensus cores, storage,
trio, clocks.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from phalanx.apps import kv_ops
from phalanx.apps.interface import KeyUpdate, SnapshotFormatError

RUN_OPS = frozenset({"add", "mul", "sadd", "srem"})
"""The commuting updates (`kv_ops.ORDER_FREE_OPS`): the only ops a run holds."""
_MEMBER_OPS = frozenset({"sadd", "srem"})
_DIGEST = 32

RunClass = tuple[str, bytes]
"""A run member: (op, operand), the operand b"" for add and mul (any two commute)."""


@dataclass(frozen=True, slots=True)
class KeyMeta:
    """A key's version metadata (module docstring)."""

    base: bytes = b""
    mix: bytes = b""
    run: tuple[RunClass, ...] = ()


def run_class(update: KeyUpdate) -> RunClass:
    return (update.op, update.operand if update.op in _MEMBER_OPS else b"")


def fits_run(meta: KeyMeta | None, update: KeyUpdate) -> bool:
    """Whether commuting `update` commutes with every update of the key's current run (an
    absent run fits everything)."""
    if update.op not in RUN_OPS:
        return False
    if meta is None:
        return True
    key = update.key
    return all(kv_ops.commutes(update, KeyUpdate(key=key, op=op, operand=operand))
               for op, operand in meta.run)


def advance(meta: KeyMeta | None, tx_id: bytes, update: KeyUpdate | None) -> KeyMeta:
    """The metadata after transaction `tx_id` wrote the key: by commuting `update` (which
    fits the run: see `fits_run`), or otherwise (`update` None: a non-commuting write)."""
    if update is not None and update.op in RUN_OPS and fits_run(meta, update):
        old = meta or KeyMeta()
        element = hashlib.sha256(tx_id).digest()
        mix = (element if not old.mix
               else (int.from_bytes(old.mix, "big") ^ int.from_bytes(element, "big"))
               .to_bytes(_DIGEST, "big"))
        run = old.run
        cls = run_class(update)
        if cls not in run:
            run = tuple(sorted((*run, cls)))
        return KeyMeta(base=old.base, mix=mix, run=run)
    base = meta.base if meta is not None else b""
    return KeyMeta(base=hashlib.sha256(base + tx_id).digest())


def full_version(meta: KeyMeta | None, value: bytes | None) -> bytes:
    if meta is None:
        return kv_ops.version_of(value)
    return meta.base if not meta.mix else hashlib.sha256(meta.base + meta.mix).digest()


def base_version(meta: KeyMeta | None, value: bytes | None) -> bytes:
    return kv_ops.version_of(value) if meta is None else meta.base


# ------------------------------------------------------------------------------ checkpoints

CHUNK_TAG = "versions"
"""A metadata chunk of the checkpoint: ``["versions", [key, base, mix, run, ...]]``, `run`
the flat list ``[op, operand, ...]``."""


def pack_entries(items: Iterable[tuple[str, KeyMeta]]) -> list[object]:
    """One metadata chunk (keys ascending)."""
    flat: list[object] = []
    for key, meta in items:
        run: list[object] = []
        for op, operand in meta.run:
            run += (op, operand)
        flat += (key, meta.base, meta.mix, run)
    return [CHUNK_TAG, flat]


def unpack_entries(chunk: object, previous: str | None) -> list[tuple[str, KeyMeta]]:
    """The entries of a metadata chunk, checked (keys strictly ascending after `previous`,
    digests of 0 or 32 bytes, runs of known ops, sorted and unique). Raises
    `SnapshotFormatError`."""
    if type(chunk) is not list or len(chunk) != 2 or chunk[0] != CHUNK_TAG:
        raise SnapshotFormatError("KV checkpoint: malformed version chunk")
    flat = chunk[1]
    if type(flat) is not list or not flat or len(flat) % 4:
        raise SnapshotFormatError("KV checkpoint: malformed version entries")
    out: list[tuple[str, KeyMeta]] = []
    for i in range(0, len(flat), 4):
        key, base, mix, run = flat[i:i + 4]
        if type(key) is not str or (previous is not None and not previous < key):
            raise SnapshotFormatError("KV checkpoint: version keys not strictly ascending")
        if type(base) is not bytes or type(mix) is not bytes or len(base) not in (0, _DIGEST) \
                or len(mix) not in (0, _DIGEST) or type(run) is not list or len(run) % 2:
            raise SnapshotFormatError(f"KV checkpoint: malformed version entry of {key!r}")
        if not base and not mix:
            raise SnapshotFormatError(f"KV checkpoint: empty version entry of {key!r}")
        classes = _run(run, key)
        if bool(classes) != bool(mix):
            raise SnapshotFormatError(f"KV checkpoint: run and mix of {key!r} disagree")
        out.append((key, KeyMeta(base=base, mix=mix, run=classes)))
        previous = key
    return out


def _run(flat: Sequence[object], key: str) -> tuple[RunClass, ...]:
    classes: list[RunClass] = []
    for j in range(0, len(flat), 2):
        op, operand = flat[j], flat[j + 1]
        if op not in RUN_OPS or type(op) is not str or type(operand) is not bytes or (
                op not in _MEMBER_OPS and operand):
            raise SnapshotFormatError(f"KV checkpoint: malformed run of {key!r}")
        classes.append((op, operand))
    if any(a >= b for a, b in itertools.pairwise(classes)):
        raise SnapshotFormatError(f"KV checkpoint: run of {key!r} not sorted")
    return tuple(classes)

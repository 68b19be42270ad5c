"""The KV store: a `StateMachine` over a persistent map from `str` keys to `bytes` values.

Owns: command execution (put, get, delete, compare-and-set, prefix scan, multi-key
transaction, versions and the commuting updates of `phalanx.apps.kv_ops`), and the
`EndorsementHooks` of the KV app (`access` describes puts and updates as `KeyUpdate`s;
`commutes` is `kv_ops.commutes`, PnyxDB's conflict matrix; `versions` per key as
`kv_ops.version_of`; `needs_requirements` every key but those only updated by
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

The checkpoint format and its parser live in `phalanx.apps.kv_checkpoint`, the command checks
in `phalanx.apps.kv_validate`, the cluster-sending inbox and outbox rules (the reserved
``cs/in/`` and ``cs/mark/`` prefixes, certificates checked at apply) in
`phalanx.apps.kv_inbox`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import immutables

from phalanx.apps import kv_ops, kv_versions, kv_wire
from phalanx.apps.interface import KeyAccess, KeyUpdate, Verdict
from phalanx.apps.kv_checkpoint import KvSnapshot, Metadata, parse_checkpoint
from phalanx.apps.kv_inbox import (
    GUARDED_PREFIX,
    DeliveryCheck,
    cluster_sending_access,
    reserved_write,
    run_cluster_sending,
)
from phalanx.apps.kv_state import LayeredState
from phalanx.apps.kv_types import (
    MAX_COMMAND_BYTES,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    READ_COMMANDS,
    Add,
    CasResult,
    CompareAndSet,
    Concat,
    CsCompact,
    CsDeliver,
    CsPrune,
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
from phalanx.apps.kv_validate import key_too_large, validate

_DONE = Done()

ACCESS_MEMO = 256
"""Commands whose access sets `KvStateMachine.access` remembers (oldest out first)."""

MEMO_MAX_BYTES = 16 * 1024
"""Only commands up to this size enter the memos below (`ACCESS_MEMO`, `DECODE_MEMO`): they
hold the command bytes as keys, and a command may be ~2 MiB (`MAX_COMMAND_BYTES`); a large
command's decode costs little next to its bytes' handling anyway."""

DECODE_MEMO = 1024
"""Commands whose decode (and `check` verdict) the transaction-mode paths remember (oldest
out first): a leaderless node reads each transaction's command for its access set, its
policy vote (`check`) and its apply (`apply_tx`), one decode before for each."""


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
        self._delivery_check: DeliveryCheck | None = None
        self.refused: dict[str, int] = {}
        """Commands refused at apply by the cluster-sending rules (`phalanx.apps.kv_inbox`),
        by reason: ``reserved_key``, ``uncertified:<why>``, ``compact_not_next``,
        ``prune_gap``... Metrics, not state (not in checkpoints)."""
        self._access_memo: dict[bytes, KeyAccess] = {}
        self._decoded: dict[bytes, KvCommand | KvError] = {}
        """`kv_wire.decode_command` of the last `DECODE_MEMO` commands (`_command`)."""
        self._verdicts: dict[bytes, Verdict] = {}
        """`check` of the last `DECODE_MEMO` commands (a pure function of the command)."""

    def install_delivery_check(self, check: DeliveryCheck | None) -> None:
        """Verify `CsDeliver` certificates and `CsCompact` proofs with `check` (the
        clustersend service installs one at start, from the cluster's link files; without
        one every delivery and compaction is refused)."""
        self._delivery_check = check

    @property
    def delivery_check(self) -> DeliveryCheck | None:
        return self._delivery_check

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
        base, meta = parse_checkpoint(data)
        self._data = LayeredState(base)
        self._meta = meta

    def apply_tx(self, tx_id: bytes, command: bytes, pinned: Sequence[str] = ()) -> bytes:
        """`TransactionAware`: apply `command` as transaction `tx_id` (transaction mode),
        advancing the version metadata of every key it may write (`kv_versions.advance`:
        a commuting update that fits the key's run and whose key is not `pinned` joins it,
        any other write moves the base), whatever its result."""
        cmd = self._command(command)
        access = self.access(command)
        if access.writes:
            meta = self._meta.mutate()
            updates = {u.key: u for u in access.updates if u.key not in pinned}
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
                and not key_too_large(cmd.key) and not cmd.key.startswith(GUARDED_PREFIX)):
            # A valid put, ahead of the general checks and the dispatch below: puts are most
            # of what a node applies and all of a typical WAL replay.
            self._data.set(cmd.key, cmd.value)
            return _DONE
        if isinstance(cmd, KvError):
            return cmd
        problem = validate(cmd) or reserved_write(cmd, self._data.get)
        if problem is not None:
            if problem.code is KvErrorCode.RESERVED_KEY:
                self._count_refusal("reserved_key")
            return problem
        data = self._data
        match cmd:
            case CsDeliver() | CsCompact() | CsPrune():
                result, refusal = run_cluster_sending(data, cmd, self._delivery_check)
                if refusal is not None:
                    self._count_refusal(refusal)
                return result
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

    def _count_refusal(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    # ---------------------------------------------------------------- EndorsementHooks

    def access(self, command: bytes) -> KeyAccess:
        """The command's access set; the last `ACCESS_MEMO` are remembered (a pure function
        of the command, asked several times per transaction: conflicts, requirements,
        base versions, each a decode before)."""
        found = self._access_memo.get(command)
        if found is None:
            found = _remember(self._access_memo, command, ACCESS_MEMO,
                              self._access_of(self._command(command)))
        return found

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
            case CsDeliver() | CsCompact() | CsPrune():
                keys = cluster_sending_access(cmd)
                return KeyAccess(reads=keys, writes=keys)
            case KvError():
                return KeyAccess()

    def commutes(self, a: KeyUpdate, b: KeyUpdate) -> bool:
        """PnyxDB's conflict matrix over the KV updates (`kv_ops.commutes`)."""
        return kv_ops.commutes(a, b)

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """Each key's version (`kv_ops.version_of`: SHA-512 of the value, b"" if absent;
        the full version of `kv_versions` for a key written in transaction mode)."""
        version = self._version
        return tuple([version(key) for key in keys])

    def _version(self, key: str) -> bytes:
        meta = self._meta.get(key)
        if meta is not None:
            return kv_versions.full_version(meta, None)
        return kv_ops.version_of(self._data.get(key))

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """Each key's BASE version (`kv_versions.base_version`)."""
        get, meta = self._data.get, self._meta.get
        return tuple([m.base if (m := meta(key)) is not None else kv_ops.version_of(get(key))
                      for key in keys])

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
        """Accept a well-formed command within the limits; remembered (`_verdicts`)."""
        found = self._verdicts.get(command)
        if found is None:
            found = _remember(self._verdicts, command, DECODE_MEMO,
                              self._check(self._command(command)))
        return found

    @staticmethod
    def _check(cmd: KvCommand | KvError) -> Verdict:
        if isinstance(cmd, KvError):
            return Verdict(accept=False, reason=cmd.message)
        problem = validate(cmd)
        if problem is not None:
            return Verdict(accept=False, reason=problem.message)
        return Verdict(accept=True)

    def _command(self, command: bytes) -> KvCommand | KvError:
        """`kv_wire.decode_command(command)`, remembered (`_decoded`: decoded commands are
        frozen values, shared by the access set, `check` and `apply_tx`). Not on the plain
        `apply` path (a WAL replay decodes each command once)."""
        found = self._decoded.get(command)
        if found is None:
            found = _remember(self._decoded, command, DECODE_MEMO,
                              kv_wire.decode_command(command))
        return found



_V = TypeVar("_V")


def _remember(memo: dict[bytes, _V], command: bytes, cap: int, value: _V) -> _V:
    """`value`, kept in `memo` under `command` (the oldest out first past `cap` entries)
    unless the command is above `MEMO_MAX_BYTES`."""
    if len(command) <= MEMO_MAX_BYTES:
        if len(memo) >= cap:
            del memo[next(iter(memo))]
        memo[command] = value
    return value

_SIZE_ERRORS = frozenset({KvErrorCode.KEY_TOO_LARGE, KvErrorCode.VALUE_TOO_LARGE,
                          KvErrorCode.TXN_TOO_LARGE})
"""The `validate` errors `admit` refuses on arrival (the others are answered by `apply`)."""

"""The KV store's typed commands and results, and their stable wire type ids (400-499).

Owns: the command and result dataclasses of `phalanx.apps.kv`, the size limits, and the
`KV_TYPE_IDS` table the codec registers.

Must not import: consensus cores, storage, trio, clocks. Pure data.

Invariants:
- Keys are `str` (at most `MAX_KEY_BYTES` bytes of UTF-8), values are `bytes` (at most
  `MAX_VALUE_BYTES`). Limits are checked by the state machine, not in `__post_init__`, so an
  oversize command still decodes and gets a typed `KvError` result instead of a decode error.
- Type ids never change once released: they are part of the on-wire and on-disk format.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

MAX_KEY_BYTES = 1024
"""Largest key, in bytes of UTF-8."""
MAX_VALUE_BYTES = 1 << 20
"""Largest value, in bytes."""
MAX_SCAN_LIMIT = 10_000
"""Largest `Scan.limit`."""
MAX_TXN_OPS = 128
"""Most compares, and most writes per branch, in one `Txn`."""
MAX_COMMAND_BYTES = 2 * MAX_VALUE_BYTES + 64 * 1024
"""Largest encoded command a node admits (`KvStateMachine.admit`, on arrival): a
`CompareAndSet` of two maximal values under a maximal key, with room to spare. A `Txn` is
bounded by it as a whole. Checked on arrival only (not by `apply`: commands already in a log
stay valid); it bounds the client port's frame size."""

# --------------------------------------------------------------------------------------------
# Commands


@dataclass(frozen=True, slots=True, kw_only=True)
class Put:
    """Set `key` to `value`. Result: `Done`."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Get:
    """Read `key`. Result: `Value` (value None when absent). A query."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete:
    """Remove `key`. Result: `Deleted(existed=...)`."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareAndSet:
    """Set `key` to `new` iff its current value equals `expected` (None means "absent").

    Result: `CasResult(succeeded, current)` where `current` is the value after the command.
    """

    key: str
    expected: bytes | None
    new: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """Up to `limit` (key, value) pairs whose key starts with `prefix`, in ascending key order
    (by Unicode code point). Result: `ScanResult`. A query."""

    prefix: str
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Compare:
    """One guard of a `Txn`: the value of `key` equals `expected` (None means "absent")."""

    key: str
    expected: bytes | None


TxnWrite: TypeAlias = Put | Delete
"""A write a `Txn` branch may hold."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Txn:
    """An etcd-style transaction, applied atomically in one step.

    If every compare holds, the `success` writes run, else the `failure` writes, in order.
    Result: `TxnResult`. Limits: at most `MAX_TXN_OPS` compares and writes per branch, each
    key and value within the usual limits, and no key written twice in one branch (etcd's
    "duplicate key given in txn request"); otherwise a `KvError` and no effect.
    Ref: etcd API v3, ``Txn`` (compare / success / failure).
    """

    compares: tuple[Compare, ...]
    success: tuple[TxnWrite, ...]
    failure: tuple[TxnWrite, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GetVersion:
    """The version of `key`: SHA-512 of its value, empty when absent (`kv_ops.version_of`);
    in transaction mode, the full version of `phalanx.apps.kv_versions` once the key was
    written there. Result: `VersionResult`. A query."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetBaseVersion:
    """The BASE version of `key` (transaction mode: unchanged by the commuting updates of its
    current run; `phalanx.apps.kv_versions`); outside transaction mode, the version.
    Result: `VersionResult`. A query."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetVersioned:
    """The value of `key` and its version, read together. Result: `VersionedValue`. A query."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Add:
    """Add `amount` to the integer at `key` (absent reads as 0), modulo 2**64 in the signed
    64-bit range (`kv_ops`). Result: `Done`; `KvError(WRONG_TYPE)` if the value is not a
    canonical decimal integer. Commutes with every other `Add`."""

    key: str
    amount: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Mul:
    """Multiply the integer at `key` (absent reads as 0) by `factor`, modulo 2**64 like `Add`.
    Result: `Done`. Commutes with every other `Mul`."""

    key: str
    factor: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SAdd:
    """Add `member` to the set at `key` (absent reads as the empty set; `kv_ops` gives the
    encoding). Result: `Done`; `KvError(WRONG_TYPE)` if the value is not a canonical set."""

    key: str
    member: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SRem:
    """Remove `member` from the set at `key` (absent reads as the empty set). Result: `Done`."""

    key: str
    member: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Concat:
    """Append `suffix` to the value at `key` (absent reads as empty). Result: `Done`."""

    key: str
    suffix: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CsDeliver:
    """Record `value`, linked cluster `src_cluster`'s `seq`-th value to us, at
    ``cs/in/<src_cluster>/<seq, 10 digits>`` if absent, and only if `certificate` (the
    canonical encoding of a `phalanx.clustersend.Certificate`) proves `src_cluster` agreed to
    send it: checked at apply (`phalanx.apps.kv_inbox`). Result: `TxnResult(succeeded=whether
    this apply wrote it, observed=(the entry before,))`, or `KvError(UNCERTIFIED)`."""

    src_cluster: str
    seq: int
    value: bytes
    certificate: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CsCompact:
    """Garbage-collect our outbox: delete ``cs/out/<dst_cluster>/<seq>`` and move the
    cluster's compaction mark past it, only if `seq` is the next slot to compact and `proof`
    (the canonical encoding of a `phalanx.clustersend.AckProof`) shows `dst_cluster`'s f+1
    members acknowledged that slot's value: checked at apply (`phalanx.apps.kv_inbox`).
    Result: `TxnResult(succeeded=whether this apply compacted it, observed=(the value,))`,
    or `KvError(UNCERTIFIED)`."""

    dst_cluster: str
    seq: int
    proof: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CsPrune:
    """Garbage-collect our inbox: delete ``cs/in/<src_cluster>/<k>`` for every k below
    `below` and move the source's delivery mark there, so later copies of those values stay
    no-ops. Refused (no effect) unless every slot from the current mark up to `below` has been
    delivered. Result: `TxnResult(succeeded=whether the mark moved, observed=())`, or
    `KvError(INVALID_ARGUMENT)`."""

    src_cluster: str
    below: int


KvCommand: TypeAlias = (
    Put | Get | Delete | CompareAndSet | Scan | Txn | GetVersion | GetVersioned | Add | Mul
    | SAdd | SRem | Concat | GetBaseVersion | CsDeliver | CsCompact | CsPrune
)
READ_COMMANDS = (Get, Scan, GetVersion, GetVersioned, GetBaseVersion)
"""The commands `KvStateMachine.query` answers (they change nothing)."""
UPDATE_COMMANDS = (Add, Mul, SAdd, SRem, Concat)
"""Read-modify-write commands on one key whose result is `Done` whatever the order."""

# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True, kw_only=True)
class Done:
    """A `Put`, or an update (`UPDATE_COMMANDS`), took effect."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Value:
    """The value of a key, or None when the key is absent."""

    value: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Deleted:
    """A `Delete` took effect; `existed` tells whether the key was present."""

    existed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CasResult:
    """Outcome of a `CompareAndSet`: whether it swapped, and the key's value afterwards."""

    succeeded: bool
    current: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanResult:
    """Matching pairs in ascending key order; `more` is True when the limit cut the scan short."""

    items: tuple[tuple[str, bytes], ...]
    more: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnResult:
    """Outcome of a `Txn`: whether its compares held (so `success` ran; else `failure` ran),
    and the compared keys' values when they were evaluated (before either branch's writes),
    one per compare, in order."""

    succeeded: bool
    observed: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionResult:
    """The version of a key: SHA-512 of its value (64 bytes), or empty when absent."""

    version: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionedValue:
    """A key's value (None when absent) and its version (`VersionResult`), read together."""

    value: bytes | None
    version: bytes


class KvErrorCode(enum.IntEnum):
    """Why a command was refused. The command had no effect."""

    MALFORMED = 1
    """The bytes do not decode to a KV command."""
    KEY_TOO_LARGE = 2
    VALUE_TOO_LARGE = 3
    INVALID_LIMIT = 4
    """`Scan.limit` outside 1..MAX_SCAN_LIMIT."""
    NOT_A_QUERY = 5
    """A write command was sent as a read-only query."""
    TXN_TOO_LARGE = 6
    """A `Txn` with more than `MAX_TXN_OPS` compares or writes in a branch."""
    DUPLICATE_KEY = 7
    """A `Txn` branch writes the same key twice."""
    WRONG_TYPE = 8
    """An `Add`/`Mul` on a value that is not a canonical integer, or an `SAdd`/`SRem` on one
    that is not a canonical set (`kv_ops`)."""
    INVALID_ARGUMENT = 9
    """An operand out of range: an `Add.amount` or `Mul.factor` outside the signed 64-bit
    range."""
    RESERVED_KEY = 10
    """A write to a key under a reserved prefix (``cs/in/``: only `CsDeliver` writes there)."""
    UNCERTIFIED = 11
    """A `CsDeliver` whose certificate does not verify (`phalanx.apps.kv_inbox`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KvError:
    """A typed refusal: `code` for programs, `message` for people."""

    code: KvErrorCode
    message: str


KvResult: TypeAlias = (
    Done | Value | Deleted | CasResult | ScanResult | TxnResult | KvError | VersionResult
    | VersionedValue
)

KV_TYPE_IDS: dict[int, type] = {
    400: Put,
    401: Get,
    402: Delete,
    403: CompareAndSet,
    404: Scan,
    405: Compare,
    406: Txn,
    420: Done,
    421: Value,
    422: Deleted,
    423: CasResult,
    424: ScanResult,
    425: KvError,
    426: TxnResult,
    407: GetVersion,
    408: GetVersioned,
    409: Add,
    410: Mul,
    411: SAdd,
    412: SRem,
    413: Concat,
    414: GetBaseVersion,
    427: VersionResult,
    428: VersionedValue,
    613: CsDeliver,
    614: CsCompact,
    615: CsPrune,
}
"""Stable codec type ids (the 400-499 range is reserved for apps in `phalanx.net.wire`;
`CsDeliver`, `CsCompact`, `CsPrune` take 613-615 of cluster-sending's range, 600-699)."""

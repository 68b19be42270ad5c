"""The KV store's per-key versions and commuting updates (after PnyxDB's data model).

Owns: `version_of` (a key's version), the value encodings of numbers and sets, `run_update`
(what `Add`, `Mul`, `SAdd`, `SRem` and `Concat` do to a value), and the commutativity
relation over their `KeyUpdate` descriptions (`update_of`, `commutes`).

Must not import: consensus cores, storage, trio, clocks.

Versions: a key's version is SHA-512 of its value's bytes (64 bytes); an absent key has the
empty version ``b""``. Computed from the value on demand: nothing is stored, so the state and
checkpoint formats are unchanged, and equal values have equal versions on every replica.

Numbers (`Add`, `Mul`): a value is a number when it is the canonical decimal text of a signed
64-bit integer, in ASCII: ``-?(0|[1-9][0-9]*)``, no ``-0``, no ``+``, no spaces, within
-2**63..2**63-1. An absent key reads as 0. Why integers, not PnyxDB's floats: float addition
is not associative, so replicas adding in different orders could round differently and stop
matching. Why wrap around (arithmetic modulo 2**64, in the signed range, as Go's or C's int64):
integers modulo 2**64 are a commutative ring, so any order of adds (or of muls) gives the same
value, overflow included; failing on overflow would make the outcome depend on the order
(x + big - big overflows in one order and not in the other). Why decimal text: `phalanx kv
get` shows it and `phalanx kv put k 5` makes one, and the canonical form makes equal numbers
equal bytes (and equal versions).

Sets (`SAdd`, `SRem`): a value is a set when it is the msgpack array of its members as bin,
strictly ascending by bytes (so unique), in msgpack's shortest form: exactly the bytes
`encode_set` gives. An absent key reads as the empty set; removing the last member leaves the
empty set (``b"\\x90"``), not an absent key. Canonical, so equal sets are equal bytes.

Invariants:
- `run_update` never raises: a value of the wrong kind gives `KvError(WRONG_TYPE)` and a
  result over `MAX_VALUE_BYTES` gives `KvError(VALUE_TOO_LARGE)`; either way nothing changes.
- Every update answers `Done` on success, never the new value: a reply that showed the value
  would differ between replicas that applied commuting updates in different orders.
- `commutes` is exactly PnyxDB's matrix (`ParallelMatrix`): set/set only with identical data;
  add/add, mul/mul, sadd/sadd and srem/srem always; sadd/srem only with different members;
  every other pair (concat with anything, add with mul, set with add, ...) conflicts. Pairs it
  calls commuting give the same state and the same results in either order, with one
  exception: an `SAdd` that would push a set over `MAX_VALUE_BYTES` is refused, so two
  `SAdd`s near that limit can each be the one refused (the limit is state-dependent).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable

import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps.interface import KeyUpdate
from phalanx.apps.kv_types import (
    MAX_VALUE_BYTES,
    Add,
    Concat,
    Done,
    KvError,
    KvErrorCode,
    Mul,
    SAdd,
    SRem,
)

__all__ = [
    "EMPTY_SET", "INT64_MAX", "INT64_MIN", "NO_VERSION", "ORDER_FREE_OPS", "commutes",
    "decode_int",
    "decode_set", "encode_int", "encode_set", "run_update", "update_of", "version_of",
]

NO_VERSION = b""
"""The version of an absent key."""
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT = re.compile(rb"-?(?:0|[1-9][0-9]{0,18})")
_DONE = Done()

Update = Add | Mul | SAdd | SRem | Concat


def version_of(value: bytes | None) -> bytes:
    """A key's version: SHA-512 of `value`, or `NO_VERSION` when the key is absent."""
    return NO_VERSION if value is None else hashlib.sha512(value).digest()


# ------------------------------------------------------------------------------ encodings


def encode_int(n: int) -> bytes:
    """The canonical decimal text of `n` (a signed 64-bit integer)."""
    if not INT64_MIN <= n <= INT64_MAX:
        raise ValueError(f"{n} is outside the signed 64-bit range")
    return str(n).encode("ascii")


def decode_int(value: bytes | None) -> int | None:
    """The number `value` holds (absent: 0), or None if it is not a canonical one."""
    if value is None:
        return 0
    if _INT.fullmatch(value) is None or value == b"-0":
        return None
    n = int(value)
    return n if INT64_MIN <= n <= INT64_MAX else None


def _wrap(n: int) -> int:
    """`n` modulo 2**64, in the signed 64-bit range."""
    return (n - INT64_MIN) % 2**64 + INT64_MIN


EMPTY_SET = msgpack.packb([], use_bin_type=True)


def encode_set(members: frozenset[bytes] | set[bytes]) -> bytes:
    """The canonical encoding of a set of byte strings."""
    return msgpack.packb(sorted(members), use_bin_type=True)  # type: ignore[no-any-return]


def decode_set(value: bytes | None) -> list[bytes] | None:
    """The members `value` holds, ascending (absent: none), or None if it is not a canonical
    set."""
    if value is None:
        return []
    if not value or value[0] not in _ARRAY_HEADS:
        return None
    try:
        members = msgpack.unpackb(value, raw=False, use_list=True, max_ext_len=0, max_map_len=0,
                                  max_str_len=0)
    except Exception:  # any malformed msgpack: not a set
        return None
    if type(members) is not list or not all(type(m) is bytes for m in members):
        return None
    if any(a >= b for a, b in itertools.pairwise(members)):
        return None
    if msgpack.packb(members, use_bin_type=True) != value:  # not the shortest form
        return None
    return members


_ARRAY_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
"""First bytes of a msgpack array (fixarray, array 16, array 32): a cheap pre-check."""


# ------------------------------------------------------------------------------ updates


def run_update(cmd: Update, current: bytes | None) -> tuple[bytes | None, Done | KvError]:
    """The new value of the key (None: unchanged) and the result, for `cmd` applied to the
    key's `current` value (None: absent). The caller has run `kv.validate` on `cmd`."""
    new: bytes
    match cmd:
        case Add(amount=operand) | Mul(factor=operand):
            n = decode_int(current)
            if n is None:
                return None, _wrong(cmd, "a canonical 64-bit decimal integer")
            n = n + operand if isinstance(cmd, Add) else n * operand
            new = encode_int(_wrap(n))
        case SAdd(member=member) | SRem(member=member):
            members = decode_set(current)
            if members is None:
                return None, _wrong(cmd, "a canonical set")
            present = set(members)
            if isinstance(cmd, SAdd):
                present.add(member)
            else:
                present.discard(member)
            new = encode_set(present)
        case Concat(suffix=suffix):
            new = (current or b"") + suffix
    if len(new) > MAX_VALUE_BYTES:
        return None, KvError(code=KvErrorCode.VALUE_TOO_LARGE,
                             message=f"the result would exceed {MAX_VALUE_BYTES} bytes")
    return new, _DONE


def _wrong(cmd: Update, kind: str) -> KvError:
    return KvError(code=KvErrorCode.WRONG_TYPE,
                   message=f"{type(cmd).__name__}: the value of {cmd.key!r} is not {kind}")


# ------------------------------------------------------------------------------ commutativity


def update_of(cmd: Update | None, *, key: str = "", value: bytes = b"") -> KeyUpdate:
    """The `KeyUpdate` describing `cmd` (None: a put of `value` at `key`)."""
    match cmd:
        case None:
            return KeyUpdate(key=key, op="set", operand=value)
        case Add(key=k, amount=n):
            return KeyUpdate(key=k, op="add", operand=_operand_int(n))
        case Mul(key=k, factor=n):
            return KeyUpdate(key=k, op="mul", operand=_operand_int(n))
        case SAdd(key=k, member=m):
            return KeyUpdate(key=k, op="sadd", operand=m)
        case SRem(key=k, member=m):
            return KeyUpdate(key=k, op="srem", operand=m)
        case Concat(key=k, suffix=s):
            return KeyUpdate(key=k, op="concat", operand=s)


def _operand_int(n: int) -> bytes:
    # Out of range operands still get a description (the command is refused anyway).
    return str(n).encode("ascii")


def _always(a: bytes, b: bytes) -> bool:
    return True


def _if_equal(a: bytes, b: bytes) -> bool:
    return a == b


def _if_different(a: bytes, b: bytes) -> bool:
    return a != b


COMMUTING: dict[tuple[str, str], Callable[[bytes, bytes], bool]] = {
    ("set", "set"): _if_equal,
    ("add", "add"): _always,
    ("mul", "mul"): _always,
    ("sadd", "sadd"): _always,
    ("srem", "srem"): _always,
    ("sadd", "srem"): _if_different,
    ("srem", "sadd"): _if_different,
}
"""PnyxDB's `ParallelMatrix`: for each ordered pair of operations that may commute, the test
on their operands. A pair not listed never commutes."""


ORDER_FREE_OPS = frozenset({"add", "mul", "sadd", "srem"})
"""The updates a transaction may apply to a key without a requirement on its version
(`EndorsementHooks.needs_requirements`): the same ones applied in any order reach the same
value (a conflicting pair, sadd and srem of one member, is ordered by the conflict
relation). A set, a concat or a delete overwrites or depends on the order: they need one."""


def commutes(a: KeyUpdate, b: KeyUpdate) -> bool:
    """Whether updates `a` and `b` commute (module docstring). Updates of different keys
    always do; symmetric; never raises."""
    if a.key != b.key:
        return True
    test = COMMUTING.get((a.op, b.op))
    return test is not None and test(a.operand, b.operand)

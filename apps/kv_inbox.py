"""The KV store's cluster-sending inbox: `CsDeliver`, checked when it APPLIES.

Owns: how `CsDeliver` (`phalanx.apps.kv_types`, wire id 613: "put the value linked cluster
`src_cluster` sent as its `seq`-th value into our inbox", with the sending cluster's
certificate) applies (`deliver`), and the garbage collection commands `CsCompact` (614,
`compact`) and `CsPrune` (615, `prune`); the reserved key prefixes (`reserved_write`),
the `DeliveryCheck` hook the KV app calls to verify a certificate, and the credit format
(`credit_value`, `parse_credit`) whose effect the app derives from the certified value.

Why at apply: the receiving cluster's consensus orders whatever its proposer (a PBFT primary,
or any client) submits. A check made before submitting (by the clustersend service) does not
stop a Byzantine primary or member from ordering a forged inbox write; a check every replica
makes when the write applies does. So:

- An outbox slot ``cs/out/<dst>/<seq, 10 digits>`` is written once: a command that would
  change a slot holding a value (a put of another value, a delete, a cas, an update; a
  `Txn` in the branch its compares select) is refused (`RESERVED_KEY`): members sign a slot's
  value when they apply it, so a second value would be a second, conflicting send of the same
  seq. Only `CsCompact` removes a slot.
- The inbox key ``cs/in/<src>/<seq, 10 digits>`` is written by `CsDeliver` only: a `Put`,
  `Delete`, `CompareAndSet`, update or `Txn` that writes a key under ``cs/in/`` is refused at
  apply (`KvErrorCode.RESERVED_KEY`), whoever ordered it.
- `CsDeliver` applies only if the installed `DeliveryCheck` accepts its certificate for
  exactly (src_cluster, seq, value); otherwise `KvErrorCode.UNCERTIFIED` and no effect. A KV
  machine with no check installed (no clustersend service: no links) refuses every one.
- Exactly once by (src_cluster, seq): the first certified delivery writes the entry, later
  ones (copies submitted by other members, replays) change nothing (`TxnResult(succeeded=
  False)`, the entry's value observed). The duplicate test comes first: it changes nothing
  whatever the certificate, and spares the signature checks of the n-1 copies.
- The only other write is DERIVED from the certified value, never taken from the submitter:
  a `credit_value(key, amount)` adds `amount` to the decimal number at `key` in the same
  step (absent reads as 0; a key that is not a number, under ``cs/`` or too large is not
  credited, the entry is still recorded). A submitter cannot add writes of its own.

Garbage collection, checked at apply too: `CsCompact` deletes our outbox slot
``cs/out/<dst>/<k>`` only if k is the next to compact (mark ``cs/mark/out/<dst>``) and the
destination's acknowledgement proof of that slot's value verifies; a compacted slot can
never be written again. `CsPrune` deletes delivered inbox entries below ``below`` once every
slot from the mark ``cs/mark/in/<src>`` up is delivered; a `CsDeliver` below the mark is a
no-op, so dedup holds. ``cs/mark/`` is reserved like ``cs/in/``.

Determinism: the check's input is the command plus the linked clusters' public material each
replica loaded at start from the cluster's static link files (`phalanx.services.
clustersend_node` installs it); with identical link files every honest replica decides
identically (docs/CLUSTER_SENDING.md says what happens when they differ).

Must not import: consensus cores, storage, trio, clocks, `phalanx.clustersend` (the check
is injected: the certificate is opaque bytes here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from phalanx.apps.kv_state import LayeredState
from phalanx.apps.kv_types import (
    MAX_KEY_BYTES,
    Add,
    CompareAndSet,
    Concat,
    CsCompact,
    CsDeliver,
    CsPrune,
    Delete,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Mul,
    Put,
    SAdd,
    SRem,
    Txn,
    TxnResult,
)

GUARDED_PREFIX = "cs/"
"""Writes under this prefix take `reserved_write`'s look (the KV fast path skips them)."""
INBOX_PREFIX = "cs/in/"
OUTBOX_PREFIX = "cs/out/"
MARK_PREFIX = "cs/mark/"
RESERVED_PREFIXES = (INBOX_PREFIX, MARK_PREFIX)
"""Key prefixes only `CsDeliver`, `CsCompact` and `CsPrune` write."""
MAX_PRUNE = 4096
"""Most inbox slots one `CsPrune` deletes."""


def inbox_key(src_cluster: str, seq: int) -> str:
    return f"{INBOX_PREFIX}{src_cluster}/{seq:010d}"


def outbox_key(dst_cluster: str, seq: int) -> str:
    return f"{OUTBOX_PREFIX}{dst_cluster}/{seq:010d}"


def in_mark_key(src_cluster: str) -> str:
    """Where `src_cluster`'s delivery mark lives: its slots below it were delivered (and
    their entries may be pruned)."""
    return f"{MARK_PREFIX}in/{src_cluster}"


def out_mark_key(dst_cluster: str) -> str:
    """Where our compaction mark for `dst_cluster` lives: our outbox slots below it were
    confirmed received there (f+1 acknowledgements verified at apply) and deleted."""
    return f"{MARK_PREFIX}out/{dst_cluster}"


def read_mark(get: Callable[[str], bytes | None], key: str) -> int:
    """A mark's value (0 when absent; only this module writes marks)."""
    value = get(key)
    return int(value) if value is not None and value.isdigit() else 0


class DeliveryCheck(Protocol):
    """Verifies cluster-sending proofs against the linked clusters' public material (None
    to accept, else the refusal reason). Must be a pure function of its arguments (and of
    material loaded at start), identical on every replica, and never raise."""

    def certificate(self, cmd: CsDeliver) -> str | None:
        """Does `cmd.certificate` prove `cmd.src_cluster` sent `cmd.value` as `cmd.seq`?"""

    def ack_proof(self, cmd: CsCompact, value: bytes) -> str | None:
        """Does `cmd.proof` show `cmd.dst_cluster` got our `cmd.seq`-th value, `value`?"""

CREDIT = b"phalanx-credit\x00"
"""A value that starts with this carries an increment (`credit_value`): applying it adds the
amount to a KV number in the same step as the inbox entry (exactly once)."""


def credit_value(key: str, amount: int, note: str = "") -> bytes:
    """A cluster-sent value that credits `amount` to the number at `key` on arrival."""
    return CREDIT + f"{key}\x00{amount}\x00{note}".encode()


def parse_credit(value: bytes) -> tuple[str, int] | None:
    """(key, amount) of a `credit_value`, or None (another value, or malformed)."""
    if not value.startswith(CREDIT):
        return None
    try:
        key, amount, _ = value[len(CREDIT):].decode().split("\x00", 2)
        return key, int(amount)
    except (UnicodeDecodeError, ValueError):
        return None


def reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIXES)


def _written(cmd: KvCommand, get: Callable[[str], bytes | None]) -> tuple[str, ...]:
    """The keys `cmd` would write in the current state (a `Txn`: the branch its compares
    select, evaluated as apply will: same state, same step)."""
    match cmd:
        case Txn(compares=compares, success=success, failure=failure):
            held = all(get(c.key) == c.expected for c in compares)
            return tuple(w.key for w in (success if held else failure))
        case Put(key=key) | Delete(key=key) | CompareAndSet(key=key):
            return (key,)
        case Add(key=key) | Mul(key=key) | SAdd(key=key) | SRem(key=key) | Concat(key=key):
            return (key,)
    return ()


def _outbox_slot(key: str) -> tuple[str, int] | None:
    dst, _, digits = key[len(OUTBOX_PREFIX):].rpartition("/")
    if not dst or not digits.isascii() or not digits.isdigit():
        return None
    seq = int(digits)
    return (dst, seq) if key == outbox_key(dst, seq) else None


def reserved_write(cmd: KvCommand, get: Callable[[str], bytes | None]) -> KvError | None:
    """`RESERVED_KEY` if `cmd` may write (either branch of a `Txn` counts, whichever would
    run) a key under a reserved prefix, or an outbox slot already compacted (refilling it
    would make the sending cluster send a second value for a seq already received); else
    None. `get` reads the current state."""
    for key in _written(cmd, get):
        if not key.startswith(GUARDED_PREFIX):
            continue
        if reserved(key):
            return KvError(code=KvErrorCode.RESERVED_KEY,
                           message=f"{key!r}: keys under {INBOX_PREFIX!r} and {MARK_PREFIX!r} "
                           "are written only by certified cluster-sending commands")
        slot = _outbox_slot(key) if key.startswith(OUTBOX_PREFIX) else None
        if slot is not None and slot[1] < (mark := read_mark(get, out_mark_key(slot[0]))):
            return KvError(code=KvErrorCode.RESERVED_KEY,
                           message=f"{key!r}: this outbox slot was sent, confirmed and "
                           f"compacted; the next free slot is {mark} or later")
        if slot is not None and (held := get(key)) is not None and not _same_put(cmd, key, held):
            return KvError(code=KvErrorCode.RESERVED_KEY,
                           message=f"{key!r}: an outbox slot is written once (its value may "
                           "already be signed and sent); use the next free slot")
    return None


def _same_put(cmd: KvCommand, key: str, held: bytes) -> bool:
    """Whether every write of `cmd` to `key` puts the value it already holds (a retried put
    is harmless; anything else would change a slot members may already have signed)."""
    writes: tuple[KvCommand, ...] = (
        cmd.success + cmd.failure if isinstance(cmd, Txn) else (cmd,))
    return all(isinstance(w, Put) and w.value == held
               for w in writes if getattr(w, "key", None) == key)


def _credit(data: LayeredState, value: bytes) -> tuple[str, bytes] | None:
    """The write a credit value makes now, or None (not a credit, or not creditable)."""
    credit = parse_credit(value)
    if credit is None:
        return None
    key, amount = credit
    if key.startswith(GUARDED_PREFIX) or not key or len(key.encode()) > MAX_KEY_BYTES:
        return None  # never into cluster-sending's own keys (nor our outbox)
    current = data.get(key)
    try:
        balance = int(current.decode("ascii")) if current is not None else 0
    except (UnicodeDecodeError, ValueError):
        return None  # not a number: the value is recorded, nothing credited
    return key, str(balance + amount).encode()


def deliver(data: LayeredState, cmd: CsDeliver, check: DeliveryCheck | None
            ) -> tuple[KvResult, str | None]:
    """Apply `cmd` to `data` (see the module docstring): the result and, when refused, the
    reason. Never raises (`check` must not)."""
    key = inbox_key(cmd.src_cluster, cmd.seq)
    existing = data.get(key)
    if existing is not None:  # exactly once: later copies change nothing
        return TxnResult(succeeded=False, observed=(existing,)), None
    if cmd.seq < read_mark(data.get, in_mark_key(cmd.src_cluster)):  # delivered, pruned
        return TxnResult(succeeded=False, observed=(None,)), None
    reason = "no_linked_cluster" if check is None else check.certificate(cmd)
    if reason is not None:
        return KvError(code=KvErrorCode.UNCERTIFIED,
                       message=f"{key}: refused: its certificate does not verify ({reason}); "
                       "only a value a linked cluster certified is delivered"), reason
    writes = [(key, cmd.value)]
    credit = _credit(data, cmd.value)
    if credit is not None:
        writes.append(credit)
    data.write_all(writes)
    return TxnResult(succeeded=True, observed=(None,)), None


def compact(data: LayeredState, cmd: CsCompact, check: DeliveryCheck | None
            ) -> tuple[KvResult, str | None]:
    """Apply `cmd` (`CsCompact`): the result and, when refused, the reason."""
    mark_key = out_mark_key(cmd.dst_cluster)
    mark = read_mark(data.get, mark_key)
    if cmd.seq < mark:  # compacted already (a copy from another member)
        return TxnResult(succeeded=False, observed=(None,)), None
    key = outbox_key(cmd.dst_cluster, cmd.seq)
    value = data.get(key)
    if cmd.seq > mark or value is None:
        return KvError(code=KvErrorCode.INVALID_ARGUMENT,
                       message=f"{key}: not the next slot to compact (that is {mark}, and it "
                       "must hold a value)"), "compact_not_next"
    reason = "no_linked_cluster" if check is None else check.ack_proof(cmd, value)
    if reason is not None:
        return KvError(code=KvErrorCode.UNCERTIFIED,
                       message=f"{key}: not compacted: its acknowledgement proof does not "
                       f"verify ({reason})"), reason
    data.write_all(((key, None), (mark_key, str(cmd.seq + 1).encode())))
    return TxnResult(succeeded=True, observed=(value,)), None


def prune(data: LayeredState, cmd: CsPrune) -> tuple[KvResult, str | None]:
    """Apply `cmd` (`CsPrune`): the result and, when refused, the reason. Needs no proof: it
    only forgets entries of values already delivered, and the mark keeps them no-ops."""
    mark_key = in_mark_key(cmd.src_cluster)
    mark = read_mark(data.get, mark_key)
    if cmd.below <= mark:
        return TxnResult(succeeded=False, observed=()), None
    if cmd.below - mark > MAX_PRUNE:
        return KvError(code=KvErrorCode.INVALID_ARGUMENT,
                       message=f"prune at most {MAX_PRUNE} slots at once (from {mark})"), \
            "prune_too_many"
    for seq in range(mark, cmd.below):
        if data.get(inbox_key(cmd.src_cluster, seq)) is None:
            return KvError(code=KvErrorCode.INVALID_ARGUMENT,
                           message=f"cannot prune {cmd.src_cluster} below {cmd.below}: slot "
                           f"{seq} is not delivered yet"), "prune_gap"
    writes: list[tuple[str, bytes | None]] = [
        (inbox_key(cmd.src_cluster, seq), None) for seq in range(mark, cmd.below)]
    writes.append((mark_key, str(cmd.below).encode()))
    data.write_all(writes)
    return TxnResult(succeeded=True, observed=()), None


def run_cluster_sending(data: LayeredState, cmd: CsDeliver | CsCompact | CsPrune,
                        check: DeliveryCheck | None) -> tuple[KvResult, str | None]:
    """Apply `cmd`: the result and, when refused, the name to count it under
    (``uncertified:<reason>`` for a proof that does not verify, else the reason)."""
    if isinstance(cmd, CsDeliver):
        result, reason = deliver(data, cmd, check)
    elif isinstance(cmd, CsCompact):
        result, reason = compact(data, cmd, check)
    else:
        result, reason = prune(data, cmd)
    if reason is None:
        return result, None
    uncertified = isinstance(result, KvError) and result.code is KvErrorCode.UNCERTIFIED
    return result, f"uncertified:{reason}" if uncertified else reason


def cluster_sending_access(cmd: CsDeliver | CsCompact | CsPrune) -> tuple[str, ...]:
    """The keys `cmd` reads and may write, sorted (a prune's slots below the new mark are not
    listed; the leaderless core, which reads access, does not run cluster-sending)."""
    match cmd:
        case CsDeliver(src_cluster=src, seq=seq, value=value):
            keys = {inbox_key(src, seq), in_mark_key(src)}
            credit = parse_credit(value)
            if credit is not None and not credit[0].startswith(GUARDED_PREFIX):
                keys.add(credit[0])
        case CsCompact(dst_cluster=dst, seq=seq):
            keys = {outbox_key(dst, seq), out_mark_key(dst)}
        case CsPrune(src_cluster=src):
            keys = {in_mark_key(src)}
    return tuple(sorted(keys))


__all__ = ["CREDIT", "GUARDED_PREFIX", "INBOX_PREFIX", "MARK_PREFIX", "MAX_PRUNE",
           "OUTBOX_PREFIX", "RESERVED_PREFIXES", "DeliveryCheck", "cluster_sending_access",
           "compact", "credit_value", "deliver", "in_mark_key", "inbox_key", "out_mark_key",
           "outbox_key", "parse_credit", "prune", "read_mark", "reserved", "reserved_write",
           "run_cluster_sending"]

"""The KV store's cluster-sending inbox: `CsDeliver`, checked when it APPLIES.

Owns: how `CsDeliver` (`phalanx.apps.kv_types`, wire id 613: "put the value linked cluster
`src_cluster` sent as its `seq`-th value into our inbox", with the sending cluster's
certificate) applies (`deliver`), the reserved key prefix ``cs/in/`` (`reserved_write`),
the `DeliveryCheck` hook the KV app calls to verify a certificate, and the credit format
(`credit_value`, `parse_credit`) whose effect the app derives from the certified value.

Why at apply: the receiving cluster's consensus orders whatever its proposer (a PBFT primary,
or any client) submits. A check made before submitting (by the clustersend service) does not
stop a Byzantine primary or member from ordering a forged inbox write; a check every replica
makes when the write applies does. So:

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
  step (absent reads as 0; a key that is not a number, is reserved or too large is not
  credited, the entry is still recorded). A submitter cannot add writes of its own.

Determinism: the check's input is the command plus the linked clusters' public material each
replica loaded at start from the cluster's static link files (`phalanx.services.
clustersend_node` installs it); with identical link files every honest replica decides
identically (docs/CLUSTER_SENDING.md says what happens when they differ).

Must not import: consensus cores, storage, trio, clocks, `phalanx.clustersend` (the check
is injected: the certificate is opaque bytes here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from phalanx.apps.kv_state import LayeredState
from phalanx.apps.kv_types import (
    MAX_KEY_BYTES,
    Add,
    CompareAndSet,
    Concat,
    CsDeliver,
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

INBOX_PREFIX = "cs/in/"
RESERVED_PREFIXES = (INBOX_PREFIX,)
"""Key prefixes no command but `CsDeliver` may write."""


def inbox_key(src_cluster: str, seq: int) -> str:
    return f"{INBOX_PREFIX}{src_cluster}/{seq:010d}"


DeliveryCheck: TypeAlias = Callable[[CsDeliver], str | None]
"""Verifies a delivery's certificate against the linked clusters' public material: None to
accept, else the refusal reason. Must be a pure function of its argument (and of material
loaded at start), identical on every replica, and never raise."""

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


def _written(cmd: KvCommand) -> tuple[str, ...]:
    match cmd:
        case Txn(success=success, failure=failure):
            return tuple(w.key for w in success + failure)
        case Put(key=key) | Delete(key=key) | CompareAndSet(key=key):
            return (key,)
        case Add(key=key) | Mul(key=key) | SAdd(key=key) | SRem(key=key) | Concat(key=key):
            return (key,)
    return ()


def reserved_write(cmd: KvCommand) -> KvError | None:
    """`RESERVED_KEY` if `cmd` may write a key under a reserved prefix (either branch of a
    `Txn` counts, whichever would run), else None."""
    for key in _written(cmd):
        if reserved(key):
            return KvError(code=KvErrorCode.RESERVED_KEY,
                           message=f"{key!r}: keys under {INBOX_PREFIX!r} are written only by "
                           "a certified cluster-sent value (CsDeliver)")
    return None


def _credit(data: LayeredState, value: bytes) -> tuple[str, bytes] | None:
    """The write a credit value makes now, or None (not a credit, or not creditable)."""
    credit = parse_credit(value)
    if credit is None:
        return None
    key, amount = credit
    if reserved(key) or not key or len(key.encode()) > MAX_KEY_BYTES:
        return None
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
    reason = "no_linked_cluster" if check is None else check(cmd)
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


def delivery_access(cmd: CsDeliver) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(reads, writes) of `cmd`, sorted: the inbox key, and the credited key if any."""
    keys = {inbox_key(cmd.src_cluster, cmd.seq)}
    credit = parse_credit(cmd.value)
    if credit is not None and not reserved(credit[0]):
        keys.add(credit[0])
    return tuple(sorted(keys)), tuple(sorted(keys))


__all__ = ["CREDIT", "INBOX_PREFIX", "RESERVED_PREFIXES", "DeliveryCheck",
           "credit_value", "deliver", "delivery_access", "inbox_key", "parse_credit",
           "reserved", "reserved_write"]

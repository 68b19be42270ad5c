"""Client-port operator calls beside membership (issue 21, items 4 and 7): backups and
certificate reloads. `BackupCall`/`BackupReply` and `ReloadCall`/`ReloadReply`.

Owns: the four wire types, ids 712-715 (the client-admin range 710-719 of
`phalanx.net.wire`; 716-719 stay free), and `refusal` (the ERROR answer of the right type,
for a node that answers no operator calls).

Semantics: exactly one reply per call, with the same nonce; both need the admin role.
    * `BackupCall(min_index)`: the node waits (a few seconds at most) until it has applied
      `min_index`, then writes its state at its applied index as a checkpoint of its own
      into ``DATA_DIR/backup/`` (the checkpoint store's format, v3 with packs; the node's
      own checkpoints are untouched) and answers OK with the checkpoint's `index`, `term`,
      metadata, data length and SHA-256; ERROR (`message` says why) when it did not get
      there in time or the write failed. `BackupCall(index, offset, length)` then reads
      that checkpoint's data piecewise (ERROR once a newer backup replaced it).
      `phalanx.runtime.operator_ops` answers both.
    * `ReloadCall`: the node reads its certificate, key and CA bundle files again; new
      connections (peer and client) use them, open ones keep theirs. OK with the loaded
      certificate's expiry (`not_after`, ISO 8601 UTC); ERROR when a file is unreadable or
      does not match (the node keeps the credentials it had).

Rules: pure data, frozen slotted keyword-only dataclasses; `register()` is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message
from phalanx.net import wire
from phalanx.net.client_protocol import ReplyStatus

MAX_BACKUP_CHUNK = 1 << 20
"""The most data bytes one `BackupReply` carries (a `BackupCall` asking more gets less)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupCall(Message):
    """`index` 0: write a backup checkpoint at an applied index >= `min_index`. Else: read
    `length` bytes (at most `MAX_BACKUP_CHUNK`) at `offset` of backup `index`'s data."""

    nonce: int
    min_index: int = 0
    index: int = 0
    offset: int = 0
    length: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupReply(Message):
    """The answer to the `BackupCall` with the same nonce: the backup's `index`, `term`,
    `meta` (its `SnapshotMeta` record), data length and SHA-256 (hex); for a read, the
    bytes at `offset` in `chunk`."""

    nonce: int
    status: ReplyStatus
    message: str = ""
    node: str = ""
    index: int = 0
    term: int = 0
    meta: bytes = b""
    data_bytes: int = 0
    data_sha256: str = ""
    offset: int = 0
    chunk: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadCall(Message):
    """Load the node's certificate, key and CA files again (for new connections)."""

    nonce: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadReply(Message):
    """The answer to the `ReloadCall` with the same nonce."""

    nonce: int
    status: ReplyStatus
    message: str = ""
    node: str = ""
    not_after: str = ""


OPS_MESSAGES: dict[int, type] = {712: BackupCall, 713: BackupReply, 714: ReloadCall,
                                 715: ReloadReply}
OpsCall = BackupCall | ReloadCall
OpsReply = BackupReply | ReloadReply


def refusal(call: OpsCall, node: str, message: str,
            status: ReplyStatus = ReplyStatus.ERROR) -> OpsReply:
    """The answer of `call`'s type with `status` and `message`."""
    if isinstance(call, BackupCall):
        return BackupReply(nonce=call.nonce, status=status, message=message, node=node)
    return ReloadReply(nonce=call.nonce, status=status, message=message, node=node)


def register() -> None:
    """Register the operator calls in the default registry (safe to call repeatedly)."""
    wire.register_all(OPS_MESSAGES)

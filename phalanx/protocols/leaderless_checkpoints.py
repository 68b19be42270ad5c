"""The leaderless core's view of replica checkpoints, for its state transfer
(`phalanx.consensus.leaderless.state_transfer`, docs/LEADERLESS.md "State transfer").

Owns: `EnvelopeFormat`, the core's `CheckpointFormat` over the replica checkpoint envelope
(`phalanx.apps.envelope`, version 3: a replica in transaction mode), and the definitions of
the two digests a `CheckpointDescriptor` carries:
- `state_digest`: SHA-256 of the checkpoint rebased to applied index 0. Replicas number their
  entries locally, so the index is the one part of a checkpoint that differs between two
  correct replicas holding the same applied set; the rest (transaction table, application
  state) is a deterministic function of that set (the simulator's convergence check).
- `applied_digest`: SHA-256 of the sum mod 2^256 of SHA-256(tx id) over the transaction
  table's ids: order-free, so any two replicas holding the same applied set agree on it.

Rules: pure functions of their arguments; malformed bytes give None (peer input), never an
exception. Must not import: trio, sockets, `phalanx.runtime`.
"""

from __future__ import annotations

import hashlib

from phalanx.apps.envelope import parse_envelope, rebased_header, split_header
from phalanx.apps.interface import SnapshotFormatError
from phalanx.consensus.core import SnapshotData, snapshot_bytes
from phalanx.consensus.leaderless.state_transfer import Described
from phalanx.consensus.leaderless.transfer_messages import CheckpointDescriptor

_MOD = 1 << 256


def applied_digest(tx_ids: list[bytes]) -> bytes:
    """The order-free digest of a set of transaction ids (module docstring)."""
    total = 0
    for tx_id in tx_ids:
        total += int.from_bytes(hashlib.sha256(tx_id).digest(), "big")
    return hashlib.sha256((total % _MOD).to_bytes(32, "big")).digest()


class EnvelopeFormat:
    """`CheckpointFormat` over replica checkpoint envelopes (module docstring)."""

    __slots__ = ()

    def describe(self, data: SnapshotData) -> Described | None:
        raw = snapshot_bytes(data)
        try:
            parsed = parse_envelope(raw)
            header, offset = split_header(raw)
        except SnapshotFormatError:
            return None
        if parsed.version != 3:
            return None
        canonical = rebased_header(header, 0)
        digest = hashlib.sha256(canonical)
        digest.update(memoryview(raw)[offset:])
        return Described(descriptor=CheckpointDescriptor(
            applied_digest=applied_digest(list(parsed.transactions.keys())),
            state_digest=digest.digest(), size=len(canonical) + len(raw) - offset,
            tx_count=len(parsed.transactions), max_deadline_ms=parsed.max_deadline_ms),
            header=canonical, body=offset)

    def applied(self, data: bytes) -> dict[bytes, int] | None:
        try:
            parsed = parse_envelope(data)
        except SnapshotFormatError:
            return None
        if parsed.version != 3:
            return None
        return {tx_id: record.deadline_ms for tx_id, record in parsed.transactions.items()}

    def rebase(self, data: bytes, index: int) -> bytes | None:
        try:
            header, offset = split_header(data)
        except SnapshotFormatError:
            return None
        return rebased_header(header, index) + data[offset:]

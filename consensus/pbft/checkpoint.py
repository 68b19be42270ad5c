"""Checkpoint stability tracking (Castro-Liskov §4.3).

Owns: `CheckpointTracker`: this replica's own checkpoints (seq -> digest, data), the latest
checkpoint vote of every replica, and the last stable checkpoint with its certificate (a
quorum of matching signed `Checkpoint` messages). Pure: signatures are verified by the
core before a vote gets here.
Must not import: the core, crypto, anything outside `phalanx.consensus`.

Invariants:
- `stable_seq` only grows; `stable_proof` holds >= quorum checkpoints from distinct replicas
  for (stable_seq, stable_digest), or is empty at seq 0.
- Memory is bounded: at most one vote per replica (its highest seq) and own checkpoints
  above the stable one, plus the stable one's data (to serve state transfer).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.pbft.messages import Checkpoint
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class StableCheckpoint:
    seq: int
    digest: bytes
    proof: tuple[Checkpoint, ...]


class CheckpointTracker:
    """Collects checkpoint votes and reports when a new checkpoint becomes stable."""

    __slots__ = ("_latest", "_own", "_quorum", "stable")

    def __init__(self, *, quorum: int, stable: StableCheckpoint | None = None) -> None:
        self._quorum = quorum
        self.stable = (
            stable if stable is not None else StableCheckpoint(seq=0, digest=b"", proof=())
        )
        self._latest: dict[NodeId, Checkpoint] = {}
        self._own: dict[int, tuple[bytes, bytes]] = {}

    # Own checkpoints -----------------------------------------------------------------

    def record_own(self, seq: int, digest: bytes, data: bytes) -> None:
        if seq >= self.stable.seq:
            self._own[seq] = (digest, data)

    def own_digest(self, seq: int) -> bytes | None:
        found = self._own.get(seq)
        return None if found is None else found[0]

    def own_data(self, seq: int) -> bytes | None:
        found = self._own.get(seq)
        return None if found is None else found[1]

    # Votes --------------------------------------------------------------------------

    def add_vote(self, cp: Checkpoint) -> StableCheckpoint | None:
        """Record `cp` (already authenticated); return the new stable checkpoint it makes,
        if any. Votes at or below the stable seq, or older than the replica's latest, are
        ignored."""
        if cp.seq <= self.stable.seq:
            return None
        old = self._latest.get(cp.replica)
        if old is not None and old.seq >= cp.seq:
            return None
        self._latest[cp.replica] = cp
        matching = tuple(
            self._latest[r]
            for r in sorted(self._latest)
            if self._latest[r].seq == cp.seq and self._latest[r].digest == cp.digest
        )
        if len(matching) < self._quorum:
            return None
        new = StableCheckpoint(seq=cp.seq, digest=cp.digest, proof=matching[: self._quorum])
        self.adopt(new)
        return new

    def adopt(self, stable: StableCheckpoint) -> bool:
        """Make `stable` (a verified certificate) the stable checkpoint if it is newer;
        garbage-collect what it covers. Returns whether it moved."""
        if stable.seq <= self.stable.seq:
            return False
        self.stable = stable
        for seq in [s for s in self._own if s < stable.seq]:
            del self._own[seq]
        for r in [r for r, c in self._latest.items() if c.seq <= stable.seq]:
            del self._latest[r]
        return True

"""SafetyRules: the only holder of a PBFT replica's signing key (after Aptos' safety-rules).

Owns: signing. Every pre-prepare and prepare is signed here, and only after it is recorded:
the replica never signs two different pre-prepares, nor two different prepares, for the
same (view, seq), even across a restart, because the record (`SafetyData`) is persisted
through `Ready.core_state` in the same Ready as the first message carrying the signature
(the driver persists before it sends). An identical repeat returns the recorded signature.

Must not import: the core, the log, or anything that decides *what* to sign.

Invariants:
- For each (kind, view, seq) at most one digest is ever signed.
- The record only forgets seqs at or below `floor`, the stable checkpoint: nothing at or
  below a stable checkpoint is ever voted on again (those seqs are outside the water marks).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from phalanx.consensus.crypto import Signer
from phalanx.consensus.pbft.messages import (
    Prepare,
    PrePrepare,
    SafetyData,
    SignedVote,
    VoteKind,
)
from phalanx.consensus.types import LocalProtocolError

_V = TypeVar("_V", PrePrepare, Prepare)


class SafetyViolation(LocalProtocolError):
    """The core asked to sign a vote that conflicts with one already signed (or one at or
    below the floor). The core catches it when the request came from peer input."""


class SafetyRules:
    """Signs votes, recording each before returning its signature."""

    __slots__ = ("_data", "_dirty", "_floor", "_signer", "_votes")

    def __init__(self, signer: Signer, data: SafetyData | None = None) -> None:
        self._signer = signer
        data = data if data is not None else SafetyData()
        self._floor = data.floor
        self._votes: dict[tuple[VoteKind, int, int], SignedVote] = {
            (v.kind, v.view, v.seq): v for v in data.votes
        }
        self._dirty = False
        self._data: SafetyData | None = None  # `data`, until the record changes

    @property
    def data(self) -> SafetyData:
        """The record to persist (deterministic order)."""
        if self._data is None:
            votes = tuple(self._votes[k] for k in sorted(self._votes))
            self._data = SafetyData(floor=self._floor, votes=votes)
        return self._data

    def take_dirty(self) -> bool:
        """Whether the record changed since the last call (it must then be persisted)."""
        dirty, self._dirty = self._dirty, False
        return dirty

    def sign_pre_prepare(self, pre_prepare: PrePrepare) -> PrePrepare:
        """`pre_prepare` signed by this replica (the primary of its view).

        Raises:
            SafetyViolation: another digest was already pre-prepared at (view, seq), or seq
                is at or below the floor.
        """
        if pre_prepare.replica != self._signer.node_id:
            raise LocalProtocolError("a replica only signs its own pre-prepares")
        return self._vote(VoteKind.PRE_PREPARE, pre_prepare)

    def sign_prepare(self, prepare: Prepare) -> Prepare:
        """`prepare` signed by this replica. Raises `SafetyViolation` as `sign_pre_prepare`."""
        if prepare.replica != self._signer.node_id:
            raise LocalProtocolError("a replica only signs its own prepares")
        return self._vote(VoteKind.PREPARE, prepare)

    def sign(self, obj: object) -> bytes:
        """A signature for a message that is not a vote (checkpoint, view change, new view):
        signing those twice differently is harmless, so nothing is recorded."""
        return self._signer.sign(obj)

    def prune(self, floor: int) -> None:
        """Forget votes at or below `floor` (a new stable checkpoint)."""
        if floor <= self._floor:
            return
        self._floor = floor
        for key in [k for k in self._votes if k[2] <= floor]:
            del self._votes[key]
        self._dirty = True
        self._data = None

    def _vote(self, kind: VoteKind, msg: _V) -> _V:
        if msg.seq <= self._floor:
            raise SafetyViolation(f"{kind.name} at seq {msg.seq} <= floor {self._floor}")
        key = (kind, msg.view, msg.seq)
        previous = self._votes.get(key)
        if previous is not None:
            if previous.digest != msg.digest:
                raise SafetyViolation(
                    f"refusing a second {kind.name} at view {msg.view} seq {msg.seq}"
                )
            return _with_signature(msg, previous.signature)
        signature = self._signer.sign(msg)
        self._votes[key] = SignedVote(
            kind=kind, view=msg.view, seq=msg.seq, digest=msg.digest, signature=signature
        )
        self._dirty = True
        self._data = None
        return _with_signature(msg, signature)


def _with_signature(msg: _V, signature: bytes) -> _V:
    return dataclasses.replace(msg, signature=signature)

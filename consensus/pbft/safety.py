"""SafetyRules: the only holder of a PBFT replica's signing key (after Aptos' safety-rules).

Owns: signing, and the record of what was signed (`SafetyData`, persisted through
`Ready.core_state`). The rule it keeps: the replica never signs two different pre-prepares,
nor two different prepares, for the same (view, seq), even across a restart.

Two ways a vote may leave, and why each keeps the rule:
- **Recorded first** (the default): the vote is recorded here and the record is persisted in
  the same Ready as the first message carrying the signature (`Ready.messages`; the driver
  persists before it sends). After a restart the record refuses a conflicting vote and
  returns the recorded signature for an identical repeat.
- **Early** (`early=True`; the vote goes in `Ready.early_messages` and the core counts it
  at once, which takes the pre-prepare and prepare persists off PBFT's critical path, and
  most of them off the disk): allowed only in a view `v` for which `early_view = v` is
  already durable (`open_early(v)`, then the core waits for the `Persisted` of that Ready).
  The vote is recorded in memory (a conflicting one is refused in this incarnation) and
  reaches the disk only with the next record written for another reason, so a crash may
  lose it. Hence a replica restarted from a record with `early_view = e` is **fenced**: it
  signs no pre-prepare or prepare in any view <= e. Every vote it sent early was in a view
  <= e (views only grow, and `early_view` was durable before the vote left), so no vote
  signed after the restart can contradict one sent before it. Counting an early vote of
  our own at once is safe for the same reason: nothing we say later in that view can
  contradict it, and every certificate built on it is itself made durable before the
  commit it justifies leaves. The fenced replica takes part in
  view e again only with commits (a commit needs a prepared certificate, which is made
  durable before the commit leaves, see `PbftCore`), checkpoints and view changes, and
  fully from the next view on; `early_view` is only ever raised, so the fence survives
  further restarts. Only votes go early: commits, checkpoints, view changes and new views
  never do (a view change must report every certificate whose commit left; forgetting one
  could let a committed request be dropped, so that persist stays on the path).

Must not import: the core, the log, or anything that decides *what* to sign.

Invariants:
- For each (kind, view, seq) at most one digest is ever signed, across restarts.
- Nothing is signed in a view <= `fence` (the `early_view` this instance started from).
- The record only forgets seqs at or below `floor`, the stable checkpoint: nothing at or
  below a stable checkpoint is ever voted on again (those seqs are outside the water marks).
- `early_view` never decreases.
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
    signed_part,
)
from phalanx.consensus.types import LocalProtocolError

_V = TypeVar("_V", PrePrepare, Prepare)


class SafetyViolation(LocalProtocolError):
    """The core asked to sign a vote that conflicts with one already signed (or one at or
    below the floor). The core catches it when the request came from peer input."""


class SafetyRules:
    """Signs votes, recording each before returning its signature."""

    __slots__ = ("_data", "_dirty", "_early_view", "_fence", "_floor", "_signer", "_votes")

    def __init__(self, signer: Signer, data: SafetyData | None = None) -> None:
        self._signer = signer
        data = data if data is not None else SafetyData()
        self._floor = data.floor
        self._early_view = data.early_view
        self._fence = data.early_view
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
            self._data = SafetyData(floor=self._floor, votes=votes, early_view=self._early_view)
        return self._data

    @property
    def early_view(self) -> int:
        """The highest view in which votes may go before they are durable (-1: none)."""
        return self._early_view

    def fenced(self, view: int) -> bool:
        """Whether this replica may sign no pre-prepare or prepare in `view` (it restarted
        after possibly sending votes early in it, see the module docstring)."""
        return view <= self._fence

    def open_early(self, view: int) -> bool:
        """Record that votes of `view` may be sent before they are durable. The caller must
        not send any until the record (`data`, now dirty) is durable. Returns False (nothing
        recorded) when `view` is fenced or not above the current `early_view`."""
        if view <= self._early_view or self.fenced(view):
            return False
        self._early_view = view
        self._dirty = True
        self._data = None
        return True

    def take_dirty(self) -> bool:
        """Whether the record changed since the last call (it must then be persisted)."""
        dirty, self._dirty = self._dirty, False
        return dirty

    def sign_pre_prepare(self, pre_prepare: PrePrepare, *, early: bool = False) -> PrePrepare:
        """`pre_prepare` signed by this replica (the primary of its view). `early`: it
        leaves before any record of it is durable (the caller checked that `early_view`,
        which must be its view, is); it is recorded in memory only, the fence covers it.

        Raises:
            SafetyViolation: another digest was already pre-prepared at (view, seq), seq
                is at or below the floor, or the view is fenced.
        """
        if pre_prepare.replica != self._signer.node_id:
            raise LocalProtocolError("a replica only signs its own pre-prepares")
        return self._vote(VoteKind.PRE_PREPARE, pre_prepare, early)

    def sign_prepare(self, prepare: Prepare, *, early: bool = False) -> Prepare:
        """`prepare` signed by this replica. `early` and `SafetyViolation` as for
        `sign_pre_prepare`."""
        if prepare.replica != self._signer.node_id:
            raise LocalProtocolError("a replica only signs its own prepares")
        return self._vote(VoteKind.PREPARE, prepare, early)

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

    def _vote(self, kind: VoteKind, msg: _V, early: bool) -> _V:
        if early and msg.view != self._early_view:
            raise LocalProtocolError(
                f"an early {kind.name} in view {msg.view}, but early_view is {self._early_view}"
            )
        if msg.view <= self._fence:
            raise SafetyViolation(
                f"{kind.name} in view {msg.view}: fenced up to view {self._fence} (restarted)"
            )
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
        signature = self._signer.sign(signed_part(msg))
        self._votes[key] = SignedVote(
            kind=kind, view=msg.view, seq=msg.seq, digest=msg.digest, signature=signature
        )
        self._dirty = self._dirty or not early  # an early vote needs no persist of its own
        self._data = None
        return _with_signature(msg, signature)


def _with_signature(msg: _V, signature: bytes) -> _V:
    return dataclasses.replace(msg, signature=signature)

"""PBFT messages and durable records, after Castro and Liskov (OSDI'99; TOCS'02).

Owns: every message the PBFT core sends or receives, the records it persists
(`SignedVote`, `SafetyData`, `PbftDurableState`, the journal's `PbftStateDelta`), the closed
union `PbftMessage` and the stable codec ids `PBFT_MESSAGES` (200-299, see `phalanx.net.wire`).

Must not import: `phalanx.net` (the codec registers these classes, not the reverse), trio,
clocks, random.

Authentication (who signs what, and why):
- Messages that travel as proofs are signed (Ed25519 in production): `PrePrepare` and
  `Prepare` (they form the prepared certificates carried by `ViewChange`), `Checkpoint`
  (stable-checkpoint certificates), `ViewChange` and `NewView` (which names its view changes
  by digest; a `RelayedViewChange` carries the signer's signature, whoever relays it).
- What a signature covers is `signed_part(message)`: the message itself, except for a
  `PrePrepare`, whose signature covers only its header <PRE-PREPARE, v, n, d>
  (`PrePrepareHeader`), the batch m travelling alongside as in Castro-Liskov §4.2. The
  digest d binds m: every place that accepts a pre-prepare (on arrival, inside a prepared
  certificate, in a NewView's O set) checks d = D(m) itself, so a relay cannot swap m.
- `Commit` never travels as a proof, so it carries an HMAC `auth` over the key shared by
  sender and receiver (Castro-Liskov §3.2 authenticators; one Send per receiver carries
  that receiver's MAC). This is the cheap normal-case path.
- State-transfer and forwarding messages are unauthenticated beyond the transport's
  sender authentication: their contents are checked against certificates (checkpoint
  data against a stable-checkpoint digest) or by f+1 matching replies.

Invariants: every class is a frozen, slotted, keyword-only dataclass whose fields are ints,
strs, bytes, bools, tuples, IntEnums or nested such dataclasses. A signature or MAC covers
the canonical bytes of the message with `signature`/`auth` emptied.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeAlias

from phalanx.consensus.types import ClientRequest, Message, NodeId, omit_default_repr

_OPTIONAL = {"wire_optional": True}
"""Field metadata: the codec leaves the field off the wire at its default."""


def _short(digest: bytes) -> str:
    return digest[:2].hex()


@dataclass(frozen=True, slots=True, kw_only=True)
class PrePrepare(Message):
    """<PRE-PREPARE, v, n, d>_sig(p) with the batch m (Castro-Liskov §4.2). An empty batch is the
    null request that a NewView uses to fill a gap (§4.4).

    `timestamp` and `proposer` are the batch's block stamp (`stamp.py`: the original
    primary's clock and id, covered by d); 0 and "" (left off the wire) when stamps are off.
    """

    view: int
    seq: int
    digest: bytes
    batch: tuple[ClientRequest, ...]
    replica: NodeId
    signature: bytes = b""
    timestamp: int = field(default=0, metadata=_OPTIONAL)
    proposer: str = field(default="", metadata=_OPTIONAL)

    __repr__ = omit_default_repr

    def __str__(self) -> str:
        return (
            f"PrePrepare v={self.view} n={self.seq} d={_short(self.digest)} |m|={len(self.batch)}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PrePrepareHeader:
    """<PRE-PREPARE, v, n, d> of replica `replica`: what a pre-prepare's signature covers."""

    view: int
    seq: int
    digest: bytes
    replica: NodeId


def signed_part(message: object) -> object:
    """What `message`'s signature covers: a pre-prepare's header, any other message whole."""
    if isinstance(message, PrePrepare):
        return PrePrepareHeader(
            view=message.view, seq=message.seq, digest=message.digest, replica=message.replica
        )
    return message


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepare(Message):
    """<PREPARE, v, n, d, i>_sig(i) (Castro-Liskov §4.2)."""

    view: int
    seq: int
    digest: bytes
    replica: NodeId
    signature: bytes = b""

    def __str__(self) -> str:
        return f"Prepare v={self.view} n={self.seq} d={_short(self.digest)} i={self.replica}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(Message):
    """<COMMIT, v, n, D(m), i>_mac(i), authenticated by a pairwise MAC (Castro-Liskov §4.2)."""

    view: int
    seq: int
    digest: bytes
    replica: NodeId
    auth: bytes = b""

    def __str__(self) -> str:
        return f"Commit v={self.view} n={self.seq} d={_short(self.digest)} i={self.replica}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Message):
    """<CHECKPOINT, n, d, i>_sig(i): the state digest after executing seq n (Castro-Liskov §4.3)."""

    seq: int
    digest: bytes
    replica: NodeId
    signature: bytes = b""

    def __str__(self) -> str:
        return f"Checkpoint n={self.seq} d={_short(self.digest)} i={self.replica}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedProof:
    """A prepared certificate Pm: the pre-prepare and 2f matching prepares from distinct
    backups (Castro-Liskov §4.4)."""

    pre_prepare: PrePrepare
    prepares: tuple[Prepare, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChange(Message):
    """<VIEW-CHANGE, v+1, n, C, P, i>_sig(i) (Castro-Liskov §4.4): the stable checkpoint seq n
    with its proof C (2f+1 checkpoints) and the prepared certificates P above n."""

    new_view: int
    stable_seq: int
    checkpoint_proof: tuple[Checkpoint, ...]
    prepared_proofs: tuple[PreparedProof, ...]
    replica: NodeId
    signature: bytes = b""

    def __str__(self) -> str:
        return (
            f"ViewChange v={self.new_view} n={self.stable_seq} "
            f"|P|={len(self.prepared_proofs)} i={self.replica}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChangeRef:
    """One entry of a NewView's V: the replica whose ViewChange it is and the digest of that
    ViewChange's canonical encoding (`view_change.view_change_digest`), signature included."""

    replica: NodeId
    digest: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class NewView(Message):
    """<NEW-VIEW, v+1, V, O>_sig(p) (Castro-Liskov §4.4, TOCS §5.2 digest form): V names 2f+1
    view changes by (replica, digest) and O holds the pre-prepares the new primary re-issues
    for the sequence numbers above min-s. Replicas broadcast their ViewChange to all, so a
    backup checks V against the ones it holds and fetches the others (`FetchViewChanges`);
    the NewView stays small whatever the prepared certificates weigh."""

    view: int
    view_changes: tuple[ViewChangeRef, ...]
    pre_prepares: tuple[PrePrepare, ...]
    replica: NodeId
    signature: bytes = b""

    def __str__(self) -> str:
        return f"NewView v={self.view} |V|={len(self.view_changes)} |O|={len(self.pre_prepares)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchViewChanges(Message):
    """Ask for the ViewChanges of view `view` that a NewView names and the asker lacks (sent
    to the new primary, which holds V, and to each signer for its own)."""

    view: int
    wanted: tuple[ViewChangeRef, ...]
    replica: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayedViewChange(Message):
    """A ViewChange sent on by `replica` (which need not be its signer: its signature is the
    signer's), in answer to `FetchViewChanges`."""

    view_change: ViewChange
    replica: NodeId

    def __str__(self) -> str:
        return f"RelayedViewChange ({self.view_change}) by {self.replica}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardRequest(Message):
    """A client request a backup relays to the primary (Castro-Liskov §4.1)."""

    request: ClientRequest
    replica: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchCheckpoint(Message):
    """State transfer: ask for the checkpoint data at `seq` (Castro-Liskov TOCS §5.3).
    `view` is the asker's view: a primary of a later view answers a lagging asker with its
    NewView too (whose checkpoint certificate may name a newer, still available state)."""

    seq: int
    replica: NodeId
    view: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointData(Message):
    """State transfer: the checkpoint data at `seq`; the receiver checks its digest against
    the stable-checkpoint certificate it holds."""

    seq: int
    data: bytes
    replica: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchCommitted(Message):
    """State transfer: ask for the committed batches from `from_seq` on. `view` is the
    asker's view: a primary of a later view answers a lagging asker with its NewView too."""

    from_seq: int
    replica: NodeId
    view: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedBatch(Message):
    """State transfer: the batch committed at `seq` (in `view`), with its block stamp (0 and
    "" when unstamped); accepted once f+1 distinct replicas report the same view and digest
    (which covers the batch and the stamp)."""

    seq: int
    view: int
    digest: bytes
    batch: tuple[ClientRequest, ...]
    replica: NodeId
    timestamp: int = field(default=0, metadata=_OPTIONAL)
    proposer: str = field(default="", metadata=_OPTIONAL)

    __repr__ = omit_default_repr


PbftMessage: TypeAlias = (
    PrePrepare
    | Prepare
    | Commit
    | Checkpoint
    | ViewChange
    | NewView
    | FetchViewChanges
    | RelayedViewChange
    | ForwardRequest
    | FetchCheckpoint
    | CheckpointData
    | FetchCommitted
    | CommittedBatch
)

# --------------------------------------------------------------------------------------------
# Durable records


class VoteKind(enum.IntEnum):
    PRE_PREPARE = 0
    PREPARE = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedVote:
    """One pre-prepare or prepare this replica signed, as SafetyRules records it."""

    kind: VoteKind
    view: int
    seq: int
    digest: bytes
    signature: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SafetyData:
    """SafetyRules' persisted record: every vote signed for a seq above `floor`, sorted by
    (kind, view, seq), and `early_view`: the highest view in which this replica may have
    sent a pre-prepare or prepare before recording it (-1: none). A replica restarted from
    this record signs no pre-prepare or prepare in any view <= `early_view` (the fence)."""

    floor: int = 0
    votes: tuple[SignedVote, ...] = ()
    early_view: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftDurableState:
    """What a PBFT replica must find again after a crash (the `Ready.core_state` record).

    Attributes:
        view: the current view (the highest view this replica moved to).
        view_active: False while waiting for the NewView of `view`.
        stable_seq, stable_digest, stable_proof: the last stable checkpoint and its
            certificate (2f+1 signed checkpoints; empty at seq 0).
        safety: what SafetyRules signed.
        prepared: the prepared certificates above the stable checkpoint (they go into the
            next ViewChange: forgetting one could let a committed request be dropped).
    """

    view: int = 0
    view_active: bool = True
    stable_seq: int = 0
    stable_digest: bytes = b""
    stable_proof: tuple[Checkpoint, ...] = ()
    safety: SafetyData = SafetyData()
    prepared: tuple[PreparedProof, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftStateDelta:
    """What changed from one `PbftDurableState` to the next.

    Replay (`PbftDeltaRules.apply`): take the scalars as they are; replace the stable proof
    when `stable_proof` is not None; drop the votes with seq <= `prune_votes_upto` and the
    votes keyed (kind, view, seq) in `dropped_votes` (flattened triples), then add or
    replace `votes`; drop the certificates with seq <= `prune_prepared_upto` and the seqs in
    `dropped_prepared`, then add or replace `prepared` (keyed by the pre-prepare's seq).
    """

    view: int
    view_active: bool
    stable_seq: int
    stable_digest: bytes
    stable_proof: tuple[Checkpoint, ...] | None
    safety_floor: int
    prune_votes_upto: int
    dropped_votes: tuple[int, ...]
    votes: tuple[SignedVote, ...]
    prune_prepared_upto: int
    dropped_prepared: tuple[int, ...]
    prepared: tuple[PreparedProof, ...]
    safety_early_view: int = -1


PBFT_MESSAGES: dict[int, type] = {
    200: PrePrepare,
    201: Prepare,
    202: Commit,
    203: Checkpoint,
    204: PreparedProof,
    205: ViewChange,
    206: NewView,
    207: ForwardRequest,
    208: FetchCheckpoint,
    209: CheckpointData,
    210: FetchCommitted,
    211: CommittedBatch,
    212: PrePrepareHeader,
    213: ViewChangeRef,
    214: FetchViewChanges,
    215: RelayedViewChange,
    220: SignedVote,
    221: SafetyData,
    222: PbftDurableState,
    223: PbftStateDelta,
}
"""Stable codec type ids (never renumber): register with `phalanx.net.wire.register_all`."""

"""What the veto procedure's checkpoints and votes are (`veto.py`'s building blocks).

Owns: `checkpoint_id` (the name of a checkpoint: the digest of its sorted ids, and of its
round in the ordered mode), `VetoEffects` (what a checkpoint machine hands the core at each
drain, in both modes), `VetoCheckpoint` (the veto mode's per-checkpoint record: its ids,
this node's own vote, the votes delivered so far, the decision), `VoteJudge` (the
validity of a vote and its proofs) and `DecisionLog` (the veto mode's decisions for the
durable record, `LeaderlessDurableState.veto_decisions`).

Invariants: `VoteJudge` judges a vote on its own content only (membership, ids, checkpoint
id, signature, self-certifying proofs), never on local state, so every correct node gives a
vote the same verdict (docs/LEADERLESS.md "Checkpoints and the veto procedure", rule 5:
a KEEP decided on a veto one node finds valid is decided alike everywhere). Pure and
deterministic: no clocks, no randomness; peer input never raises here (a verdict is a reason
string the caller counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
)
from phalanx.consensus.types import NodeId

MAX_TX_ID_BYTES = 64
"""Longer ids are malformed (a transaction id is a 32-byte SHA-256 digest)."""

ProofOf = Callable[[TxId], TransactionProof | None]
VerifyProof = Callable[[TransactionProof], bool]


def checkpoint_id(crypto: Crypto, tx_ids: tuple[TxId, ...], round_no: int = 0) -> bytes:
    """The checkpoint of `tx_ids` (sorted, unique): the digest of their concatenation, each
    id prefixed with its one-byte length so that two id lists never concatenate alike. A
    re-checkpoint round r > 0 (the ordered mode) prefixes a zero byte and r in 4 bytes (a
    length byte is never 0: the names never meet)."""
    body = b"".join(bytes((len(t),)) + t for t in tx_ids)
    return crypto.digest(b"\0" + round_no.to_bytes(4, "big") + body if round_no else body)


@dataclass(frozen=True, slots=True, kw_only=True)
class VetoEffects:
    """What the core must do after feeding the machine (drained by `drain`).

    Attributes:
        sends: messages to send, after the durable record is synced when `sync`.
        votes: this node's new signed votes (in `votes()` until decided).
        sync: own votes, broadcast choices or decisions changed: persist `votes()`,
            `relays()` and `veto_decisions()` (synced) before any send.
        dropped: ids of checkpoints decided DROP (in decision order, each checkpoint's ids
            sorted); final.
        kept: the verified proofs of vetoes that decided KEEP (feed them to the store).
    """

    sends: tuple[Send, ...] = ()
    votes: tuple[VetoChoice, ...] = ()
    sync: bool = False
    dropped: tuple[TxId, ...] = ()
    kept: tuple[TransactionProof, ...] = ()


@dataclass(slots=True)
class VetoCheckpoint:
    """One checkpoint the veto-mode machine remembers (until `gc`)."""

    tx_ids: tuple[TxId, ...]
    delivered: dict[NodeId, VetoChoice] = field(default_factory=dict)
    """The reliably delivered vote of each voter."""
    own: VetoChoice | None = None
    drop: bool | None = None
    """The decision: True drop, False keep, None undecided."""
    kept: frozenset[TxId] = frozenset()
    """On KEEP, the ids the deciding veto carried a verified proof of: the others of the
    checkpoint were not shown applicable, and may be queued again (`CheckpointMachine.queue`)."""


class VoteJudge:
    """The validity of id lists, votes and their proofs (see the module docstring)."""

    __slots__ = ("_batch", "_crypto", "_members", "_tx_id_of", "_verify_proof")

    def __init__(self, *, members: frozenset[NodeId], crypto: Crypto, batch: int,
                 tx_id_of: Callable[[Transaction], TxId], verify_proof: VerifyProof) -> None:
        self._members = members
        self._crypto = crypto
        self._batch = batch
        self._tx_id_of = tx_id_of
        self._verify_proof = verify_proof

    def valid_ids(self, tx_ids: tuple[TxId, ...], *, limit: int | None = None) -> bool:
        """Non-empty, at most `limit` (the batch) ids, each 1..MAX_TX_ID_BYTES bytes, sorted
        and unique."""
        if not isinstance(tx_ids, tuple) \
                or not 1 <= len(tx_ids) <= (self._batch if limit is None else limit):
            return False
        if not all(isinstance(t, bytes) and 1 <= len(t) <= MAX_TX_ID_BYTES for t in tx_ids):
            return False
        return all(a < b for a, b in pairwise(tx_ids))

    def verified(self, msg: VetoChoice) -> tuple[TransactionProof, ...]:
        """The proofs of `msg` that are about one of its ids and verify."""
        if len(msg.proofs) > len(msg.tx_ids):
            return ()
        ids = set(msg.tx_ids)
        return tuple(p for p in msg.proofs if isinstance(p, TransactionProof)
                     and self._tx_id_of(p.tx) in ids and self._verify_proof(p))

    def problem(self, msg: VetoChoice) -> str | None:
        """Why vote `msg` is invalid, or None; the same answer at every correct node
        (membership, ids, signature, self-certifying proofs: never local state)."""
        if msg.voter not in self._members:
            return "not_a_member"
        if not self.valid_ids(msg.tx_ids):
            return "bad_id_list"
        if msg.checkpoint != checkpoint_id(self._crypto, msg.tx_ids):
            return "bad_checkpoint_id"
        if not self._crypto.verify(msg.voter, msg, msg.signature):
            return "bad_signature"
        if msg.drop:
            return "bad_drop_vote" if msg.proofs else None
        return None if self.verified(msg) else "forged_veto"


class DecisionLog:
    """The decisions of the checkpoints a veto-mode machine remembers, in decision order,
    as the durable record holds them: `record()` is the same tuple object until a decision
    is added or forgotten (the record's delta finds an unchanged category by identity)."""

    __slots__ = ("_by_checkpoint", "_record")

    def __init__(self) -> None:
        self._by_checkpoint: dict[bytes, CheckpointDecision] = {}
        self._record: tuple[CheckpointDecision, ...] | None = ()

    def add(self, cid: bytes, decision: CheckpointDecision) -> None:
        self._by_checkpoint[cid] = decision
        self._record = None

    def forget(self, cid: bytes) -> None:
        if self._by_checkpoint.pop(cid, None) is not None:
            self._record = None

    def record(self) -> tuple[CheckpointDecision, ...]:
        if self._record is None:
            self._record = tuple(self._by_checkpoint.values())
        return self._record

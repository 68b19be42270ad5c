"""What the veto procedure's checkpoints and votes are (`veto.py`'s building blocks).

Owns: `checkpoint_id` (the name of a checkpoint: the digest of its sorted ids and of its
round), `valid_round`, `next_round` (the veto mode's rule for queueing an id again: rounds),
`VetoEffects` (what a checkpoint machine hands the core at each
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

from collections.abc import Callable, Iterable
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

MAX_ROUND = 2**32 - 1
"""Rounds travel in 4 bytes of a checkpoint's name."""

ProofOf = Callable[[TxId], TransactionProof | None]
VerifyProof = Callable[[TransactionProof], bool]


def checkpoint_id(crypto: Crypto, tx_ids: tuple[TxId, ...], round_no: int = 0) -> bytes:
    """The checkpoint of `tx_ids` (sorted, unique): the digest of their concatenation, each
    id prefixed with its one-byte length so that two id lists never concatenate alike. A
    re-checkpoint round r > 0 (both modes) prefixes a zero byte and r in 4 bytes (a length
    byte is never 0: the names never meet). `round_no` must be `valid_round`."""
    body = b"".join(bytes((len(t),)) + t for t in tx_ids)
    return crypto.digest(b"\0" + round_no.to_bytes(4, "big") + body if round_no else body)


def valid_round(round_no: object) -> bool:
    """A re-checkpoint round (docs/LEADERLESS.md "Kept, then stuck"): an int in 0..2^32-1."""
    return type(round_no) is int and 0 <= round_no <= MAX_ROUND


def retry_wait(period: int, round_no: int) -> int:
    """Ticks a stuck id kept on its own proof in round `round_no` waits after the last
    decision naming it before it goes out in round `round_no` + 1: two checkpoint periods,
    doubling with the round up to 64 times."""
    return (2 * period) << min(round_no, 6)


def next_round(tx_id: TxId, holders: Iterable[VetoCheckpoint], *, ticks: int, period: int,
               no_rounds: bool = False) -> int | None:
    """The round of the next checkpoint of stuck `tx_id` (veto mode), None while none may
    start. `holders`: the remembered checkpoints naming it. None of them: round 0. Any
    undecided, or decided DROP: none. All KEEP, none on `tx_id`'s own proof: at once, in
    the highest round r among them (a new id list: "Kept on another's proof"). Kept on its
    own proof: round r + 1 once the last decision is `retry_wait(period, r)` ticks old
    (`no_rounds`, the deliberate bug `veto_no_rounds`: never, the rule before). The
    started checkpoint's round is the highest of its ids' (`CheckpointMachine.tick`), so
    its name is one this node never decided: a decided KEEP of the same ids and round kept
    one of them on its own proof, whose next round is higher."""
    last, own, decided_at, seen = 0, False, 0, False
    for cp in holders:
        if cp.drop is not False:
            return None
        seen = True
        last = max(last, cp.round)
        decided_at = max(decided_at, cp.decided_at)
        own = own or tx_id in cp.kept
    if not seen or not own:
        return last
    if no_rounds or last >= MAX_ROUND or ticks - decided_at < retry_wait(period, last):
        return None
    return last + 1


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
    round: int = 0
    delivered: dict[NodeId, VetoChoice] = field(default_factory=dict)
    """The reliably delivered vote of each voter."""
    own: VetoChoice | None = None
    drop: bool | None = None
    """The decision: True drop, False keep, None undecided."""
    kept: frozenset[TxId] = frozenset()
    """On KEEP, the ids the deciding veto carried a verified proof of: the others of the
    checkpoint were not shown applicable, and may be queued again (`CheckpointMachine.queue`)."""
    decided_at: int = 0
    """The machine's tick of the decision (of the restart, for a restored one)."""


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

    def name_problem(self, msg: VetoChoice) -> str | None:
        """Why `msg` does not name its checkpoint (ids, round, checkpoint id), or None."""
        if not self.valid_ids(msg.tx_ids):
            return "bad_id_list"
        if not valid_round(msg.round):
            return "bad_round"
        if msg.checkpoint != checkpoint_id(self._crypto, msg.tx_ids, msg.round):
            return "bad_checkpoint_id"
        return None

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
        name = self.name_problem(msg)
        if name is not None:
            return name
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

"""Checkpoints and the veto procedure (PnyxDB §1.8's BVP), as a sans-IO sub-machine.

Owns: `CheckpointMachine`: the queue of stuck transactions, one record per checkpoint
(its sorted ids, the first signed choice of every voter, this node's own vote, the
decision), the periodic start and resend, and the counters of dropped inputs. The core
owns the transactions: it answers `proof_of` (a proof that a transaction is applicable or
committed, or None) and `verify_proof`, persists `VetoEffects.votes` before sending, and
applies `dropped`/`kept`.

Rules (docs/LEADERLESS.md, "Checkpoints and the veto procedure"):
- A checkpoint is identified by `checkpoint_id` of its sorted unique ids.
- A correct node votes once per checkpoint, across restarts too (`restored_votes`, and a
  relayed copy of its own old vote is adopted rather than re-voted): veto with a proof when
  `proof_of` knows one of the ids applicable, drop otherwise.
- DROP is decided on signed drop votes of all n members (unanimity, as the reference);
  KEEP on one veto whose proof verifies, from anyone (relayed votes count: the signature,
  not the sender, says who voted). A decision is final.
- `blocked(t)`: this node voted drop in an undecided checkpoint containing t; the core must
  not commit t meanwhile (so a drop decided elsewhere never meets a commit here).

Invariants: deterministic (insertion-ordered dicts, sorted ids; no clocks, no randomness);
peer input is counted in `dropped_counts`, never raised; memory is bounded by
`max_open` undecided checkpoints plus the decided ones `gc` has not collected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.leaderless.messages import (
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    transaction_id,
)
from phalanx.consensus.types import LocalProtocolError, Message, NodeId

MAX_TX_ID_BYTES = 64
"""Longer ids are malformed (a transaction id is a 32-byte SHA-256 digest)."""

ProofOf = Callable[[TxId], TransactionProof | None]
VerifyProof = Callable[[TransactionProof], bool]


def checkpoint_id(crypto: Crypto, tx_ids: tuple[TxId, ...]) -> bytes:
    """The checkpoint of `tx_ids` (sorted, unique): the digest of their concatenation, each
    id prefixed with its one-byte length so that two id lists never concatenate alike."""
    return crypto.digest(b"".join(bytes((len(t),)) + t for t in tx_ids))


@dataclass(frozen=True, slots=True, kw_only=True)
class VetoEffects:
    """What the core must do after feeding the machine (drained by `drain`).

    Attributes:
        sends: messages to send, after `votes` are durable.
        votes: this node's new signed votes; persist them before any send.
        dropped: ids of checkpoints decided DROP (in decision order, each checkpoint's ids
            sorted); final.
        kept: the verified proofs of vetoes that decided KEEP (feed them to the store).
    """

    sends: tuple[Send, ...] = ()
    votes: tuple[VetoChoice, ...] = ()
    dropped: tuple[TxId, ...] = ()
    kept: tuple[TransactionProof, ...] = ()


@dataclass(slots=True)
class _Checkpoint:
    tx_ids: tuple[TxId, ...]
    votes: dict[NodeId, VetoChoice] = field(default_factory=dict)
    """The first validly signed choice of each voter (drop votes, and vetoes whose proof
    verified)."""
    own: VetoChoice | None = None
    drop: bool | None = None
    """The decision: True drop, False keep, None undecided."""
    veto: VetoChoice | None = None
    """The veto that decided KEEP (resent to peers that may have missed it)."""


class CheckpointMachine:
    """The checkpoint batcher and the veto procedure of one node."""

    __slots__ = (
        "_batch", "_by_tx", "_checkpoints", "_crypto", "_dropped", "_dropped_counts",
        "_kept", "_max_open", "_members", "_new_votes", "_nodes", "_period", "_queued",
        "_sends", "_ticks", "_tx_id_of", "fenced", "node_id",
    )

    def __init__(
        self,
        *,
        node_id: NodeId,
        nodes: tuple[NodeId, ...],
        crypto: Crypto,
        checkpoint_ticks: int,
        batch: int,
        restored_votes: tuple[VetoChoice, ...] = (),
        max_open: int = 1024,
        tx_id_of: Callable[[Transaction], TxId] | None = None,
    ) -> None:
        if node_id not in nodes or len(set(nodes)) != len(nodes):
            raise LocalProtocolError(f"{node_id!r} must be one of the unique nodes {nodes!r}")
        if checkpoint_ticks < 1 or batch < 1 or max_open < 1:
            raise LocalProtocolError(
                f"checkpoint_ticks, batch and max_open must be >= 1 "
                f"({checkpoint_ticks}, {batch}, {max_open})")
        self.node_id = node_id
        self._nodes = tuple(sorted(nodes))
        self._members = frozenset(nodes)
        self._crypto = crypto
        self._period = checkpoint_ticks
        self._batch = batch
        self._max_open = max_open
        # The core's transaction id (`transaction_id` over the codec's encoding); the
        # default hashes `crypto.encode`, which is the codec only where they coincide.
        self._tx_id_of = tx_id_of or (lambda tx: transaction_id(tx, crypto.encode))
        self._ticks = 0
        self._queued: dict[TxId, None] = {}
        self._checkpoints: dict[bytes, _Checkpoint] = {}
        self._by_tx: dict[TxId, dict[bytes, None]] = {}
        self._sends: list[Send] = []
        self._new_votes: list[VetoChoice] = []
        self._dropped: list[TxId] = []
        self._kept: list[TransactionProof] = []
        self._dropped_counts: dict[str, int] = {}
        self.fenced = False
        """The amnesia fence (`fence.py`): record and tally, start and vote nothing."""
        for vote in restored_votes:
            self._restore(vote)

    # Inputs --------------------------------------------------------------------------

    def queue(self, tx_id: TxId) -> None:
        """Ask for a checkpoint that drops `tx_id` (ignored when a checkpoint this node
        remembers already contains it)."""
        if tx_id not in self._by_tx:
            self._queued[tx_id] = None

    def tick(self, proof_of: ProofOf) -> None:
        """Every `checkpoint_ticks` ticks: resend what peers may have lost, then start a
        checkpoint of the first `batch` queued ids (sorted)."""
        self._ticks += 1
        if self._ticks % self._period:
            return
        for cp in self._checkpoints.values():
            evidence = cp.veto if cp.drop is False else cp.own
            if evidence is not None:
                self._broadcast(evidence)
        queued = sorted(t for t in self._queued if t not in self._by_tx)
        self._queued = dict.fromkeys(queued)
        if not queued or self._open() >= self._max_open or self.fenced:
            return
        tx_ids = tuple(queued[: self._batch])
        for t in tx_ids:
            del self._queued[t]
        self._broadcast(StartCheckpoint(tx_ids=tx_ids))
        self._start(tx_ids, proof_of)

    def on_start(self, src: NodeId, msg: StartCheckpoint, proof_of: ProofOf) -> None:
        """A peer proposes a checkpoint: vote on it once."""
        if src not in self._members:
            self._drop("not_a_member")
        elif not self._valid_ids(msg.tx_ids):
            self._drop("bad_id_list")
        else:
            self._start(msg.tx_ids, proof_of)

    def on_choice(
        self, src: NodeId, msg: VetoChoice, verify_proof: VerifyProof, proof_of: ProofOf,
    ) -> None:
        """A signed vote (the voter's own, or relayed by `src`)."""
        if src not in self._members or msg.voter not in self._members:
            self._drop("not_a_member")
            return
        known = self._checkpoints.get(msg.checkpoint)
        if known is not None and known.votes.get(msg.voter) == msg:
            return  # a resend or relay of a vote already verified: skip the crypto
        if not self._valid_ids(msg.tx_ids):
            self._drop("bad_id_list")
            return
        if msg.checkpoint != checkpoint_id(self._crypto, msg.tx_ids):
            self._drop("bad_checkpoint_id")
            return
        if not self._crypto.verify(msg.voter, msg, msg.signature):
            self._drop("bad_signature")
            return
        proofs: tuple[TransactionProof, ...] = ()
        if msg.drop:
            if msg.proofs:
                self._drop("bad_drop_vote")
                return
        else:
            proofs = self._verified(msg, verify_proof)
            if not proofs:
                self._drop("forged_veto")
                return
        cp = self._checkpoints.get(msg.checkpoint)
        if msg.voter == self.node_id:
            if cp is not None and cp.own is not None:
                return
            cp = self._adopt(msg)  # our own vote from before a restart: never vote again
        elif cp is None or cp.own is None:
            # Not voted yet: vote now. Having seen a verified veto, this node vetoes with its
            # proof, so its vote can never complete a DROP elsewhere.
            cp = self._start(msg.tx_ids, proof_of, known=proofs[0] if proofs else None)
            if cp is None:
                return
        first = cp.votes.setdefault(msg.voter, msg)
        if first is not msg and (first.drop, first.proofs) != (msg.drop, msg.proofs):
            self._drop("equivocation")
        if cp.drop is None:
            if not msg.drop:
                self._decide_keep(cp, msg, proofs)
            else:
                self._maybe_decide_drop(cp)
        elif cp.drop and not msg.drop:
            self._drop("veto_after_drop")  # an agreement gap: see docs/LEADERLESS.md

    # Queries -------------------------------------------------------------------------

    def blocked(self, tx_id: TxId) -> bool:
        """Whether this node voted drop in an undecided checkpoint containing `tx_id`."""
        for cid in self._by_tx.get(tx_id, ()):
            cp = self._checkpoints[cid]
            if cp.drop is None and cp.own is not None and cp.own.drop:
                return True
        return False

    def votes(self) -> tuple[VetoChoice, ...]:
        """This node's votes of undecided checkpoints (for the durable record)."""
        return tuple(cp.own for cp in self._checkpoints.values()
                     if cp.drop is None and cp.own is not None)

    def dropped_counts(self) -> Mapping[str, int]:
        return dict(self._dropped_counts)

    def __len__(self) -> int:
        """How many checkpoints this node remembers."""
        return len(self._checkpoints)

    def drain(self) -> VetoEffects:
        """The effects accumulated since the last drain."""
        effects = VetoEffects(sends=tuple(self._sends), votes=tuple(self._new_votes),
                              dropped=tuple(self._dropped), kept=tuple(self._kept))
        self._sends, self._new_votes, self._dropped, self._kept = [], [], [], []
        return effects

    def gc(self, live: Callable[[TxId], bool]) -> None:
        """Forget decided checkpoints none of whose ids is `live` (the core still acts on)."""
        dead = [cid for cid, cp in self._checkpoints.items()
                if cp.drop is not None and not any(live(t) for t in cp.tx_ids)]
        for cid in dead:
            self._forget(cid)

    # Internals -----------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        self._dropped_counts[reason] = self._dropped_counts.get(reason, 0) + 1

    def _valid_ids(self, tx_ids: tuple[TxId, ...], *, limit: int | None = None) -> bool:
        """Non-empty, at most `limit` (the batch) ids, each 1..MAX_TX_ID_BYTES bytes, sorted
        and unique."""
        if not 1 <= len(tx_ids) <= (self._batch if limit is None else limit):
            return False
        if not all(isinstance(t, bytes) and 1 <= len(t) <= MAX_TX_ID_BYTES for t in tx_ids):
            return False
        return all(a < b for a, b in pairwise(tx_ids))

    def _verified(self, msg: VetoChoice, verify_proof: VerifyProof) -> tuple[TransactionProof, ...]:
        """The proofs of `msg` that are about one of its ids and verify."""
        if len(msg.proofs) > len(msg.tx_ids):
            return ()
        ids = set(msg.tx_ids)
        return tuple(p for p in msg.proofs
                     if self._tx_id_of(p.tx) in ids and verify_proof(p))

    def _open(self) -> int:
        return sum(1 for cp in self._checkpoints.values() if cp.drop is None)

    def _broadcast(self, msg: Message) -> None:
        self._sends.extend(Send(to=peer, message=msg)
                           for peer in self._nodes if peer != self.node_id)

    def _record(self, cid: bytes, tx_ids: tuple[TxId, ...]) -> _Checkpoint:
        cp = self._checkpoints[cid] = _Checkpoint(tx_ids=tx_ids)
        for t in tx_ids:
            self._by_tx.setdefault(t, {})[cid] = None
            self._queued.pop(t, None)
        return cp

    def _forget(self, cid: bytes) -> None:
        cp = self._checkpoints.pop(cid)
        for t in cp.tx_ids:
            holders = self._by_tx[t]
            del holders[cid]
            if not holders:
                del self._by_tx[t]

    def _start(self, tx_ids: tuple[TxId, ...], proof_of: ProofOf, *,
               known: TransactionProof | None = None) -> _Checkpoint | None:
        """Vote on checkpoint `tx_ids` unless this node already did: veto with `known` (a
        verified proof) or `proof_of`'s first proof, drop when there is none."""
        cid = checkpoint_id(self._crypto, tx_ids)
        cp = self._checkpoints.get(cid)
        if cp is None:
            if self._open() >= self._max_open:
                self._drop("too_many_open_checkpoints")
                return None
            cp = self._record(cid, tx_ids)
        if cp.own is not None or self.fenced:
            return cp
        proof = known or next((p for p in map(proof_of, tx_ids) if p is not None), None)
        vote = VetoChoice(checkpoint=cid, tx_ids=tx_ids, voter=self.node_id,
                          drop=proof is None, proofs=() if proof is None else (proof,))
        vote = dataclasses.replace(vote, signature=self._crypto.sign(vote))
        cp.own = vote
        cp.votes[self.node_id] = vote
        self._new_votes.append(vote)
        self._broadcast(vote)
        if cp.drop is None:
            if vote.drop:
                self._maybe_decide_drop(cp)
            else:
                self._decide_keep(cp, vote, vote.proofs, relay=False)
        return cp

    def _adopt(self, vote: VetoChoice) -> _Checkpoint:
        """Take `vote` (this node's, signature verified) as its own vote of that checkpoint.
        Never capped by `max_open`: forgetting an own vote could let this node vote twice."""
        cp = self._checkpoints.get(vote.checkpoint)
        if cp is None:
            cp = self._record(vote.checkpoint, vote.tx_ids)
        cp.own = vote
        cp.votes.setdefault(self.node_id, vote)
        return cp

    def _restore(self, vote: VetoChoice) -> None:
        if vote.voter != self.node_id or not vote.drop or vote.proofs \
                or not self._valid_ids(vote.tx_ids, limit=len(vote.tx_ids)) \
                or vote.checkpoint != checkpoint_id(self._crypto, vote.tx_ids):
            # Only drop votes are persisted: an own veto decides KEEP at once.
            raise LocalProtocolError(
                f"restored vote is not an undecided drop vote of {self.node_id!r}: {vote!r}")
        if vote.checkpoint not in self._checkpoints:
            self._adopt(vote)

    def _decide_keep(self, cp: _Checkpoint, veto: VetoChoice,
                     proofs: tuple[TransactionProof, ...], *, relay: bool = True) -> None:
        cp.drop = False
        cp.veto = veto
        self._kept.extend(proofs)
        if relay:
            self._broadcast(veto)

    def _maybe_decide_drop(self, cp: _Checkpoint) -> None:
        if sum(1 for v in cp.votes.values() if v.drop) < len(self._nodes):
            return
        cp.drop = True
        self._dropped.extend(cp.tx_ids)
        # Relay the certificate once, so a node a Byzantine voter withheld its vote from
        # (or that lost one) decides too.
        for vote in sorted(cp.votes.values(), key=lambda v: v.voter):
            if vote.voter != self.node_id:
                self._sends.extend(Send(to=peer, message=vote) for peer in self._nodes
                                   if peer not in (self.node_id, vote.voter))

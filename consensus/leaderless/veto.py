"""Checkpoints and the veto procedure (PnyxDB §1.8's BVP), as a sans-IO sub-machine.

Owns: `CheckpointMachine`: the queue of stuck transactions, one record per checkpoint
(its sorted ids, this node's own vote, the votes delivered so far, the decision), the
periodic start and pull, and the counters of dropped inputs; votes travel by Bracha's
reliable broadcast (`reliable_broadcast.VoteBroadcast`, owned here). Checkpoint names, the
per-checkpoint record, the effects and the judge of a vote's validity are in `veto_votes.py`
(re-exported here: `checkpoint_id`, `VetoEffects`, `ProofOf`). The core owns the
transactions: it answers `proof_of` (a proof that a transaction is applicable or
committed, or None) and `verify_proof` (deterministic: signatures and quorum only),
persists `votes()`, `relays()` and `veto_decisions()` before sending (`VetoEffects.sync`), and
applies `dropped`/`kept`.

Rules (docs/LEADERLESS.md, "Checkpoints and the veto procedure"):
- A checkpoint is identified by `checkpoint_id` of its sorted unique ids and its round; a
  still-stuck id a KEEP kept on its own proof goes out again in the next round (`next_round`).
- A correct node votes once per checkpoint, across restarts too (`restored_votes`, and its
  own old vote, seen in a full echo or fetched on f+1 echoes of its digest, is adopted
  rather than re-voted): veto with a proof when
  `proof_of` knows one of the ids applicable (or it holds a valid veto), drop otherwise;
  abstain (no vote) when one of the ids is `unprovable` (committed here without a proof,
  after a restart; or held nothing of and possibly committed and forgotten: the core's
  `memory.py`), until a delivered veto brings a proof or the core learns more.
- Decisions come ONLY from reliably delivered votes: DROP when the delivered votes of all
  n members are drops; KEEP on the first delivered veto (valid: every correct node judges a
  vote alike). Each voter's delivered vote is unique and the same at every correct node,
  so no correct node delivers n drops while another delivers a veto. A decision is final.
- `blocked(t)`: this node voted drop in an undecided checkpoint containing t, or a
  remembered checkpoint containing t was decided DROP; the core must not commit (nor
  endorse) t meanwhile, so a drop decided anywhere never meets a commit here. The second
  half is defence in depth: a dropped id is dropped by the core anyway, but no path (a
  cascade from another drop in the same drain, a proof replayed later) may commit it.
- Durable until `gc`, decided or not: `votes()` and `relays()` cover every remembered
  checkpoint, so a decider restarted from its record never votes again and still answers a
  lagging peer's pull with its READYs (Bracha's totality across restarts), and
  `veto_decisions()` holds each decision (synced before anything it unblocks leaves): a
  restarted decider is decided again at once (`restored_decisions`: its drops and kept
  proofs re-applied, no vote, no pull), even when every peer has collected the checkpoint.

Invariants: deterministic (insertion-ordered dicts, sorted ids; no clocks, no randomness);
peer input is counted in `dropped_counts`, never raised; memory is bounded by
`max_open` undecided checkpoints plus the decided ones `gc` has not collected, each with
n broadcast instances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    FetchVote,
    OrderingEnvelope,
    OrderingRecord,
    OrderingSubmit,
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    VoteBatch,
    VoteBody,
    VoteDigestBatch,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
    VoteRelay,
    transaction_id,
)
from phalanx.consensus.leaderless.reliable_broadcast import MAX_BATCH_ITEMS, Key, VoteBroadcast
from phalanx.consensus.leaderless.veto_votes import (
    MAX_TX_ID_BYTES,
    DecisionLog,
    ProofOf,
    VerifyProof,
    VetoCheckpoint,
    VetoEffects,
    VoteJudge,
    checkpoint_id,
    next_round,
    valid_round,
)
from phalanx.consensus.types import LocalProtocolError, NodeId

__all__ = ["MAX_TX_ID_BYTES", "CheckpointMachine", "ProofOf", "VerifyProof", "VetoEffects",
           "checkpoint_id"]


class CheckpointMachine:
    """The checkpoint batcher and the veto procedure of one node."""

    __slots__ = (
        "_answered", "_batch", "_by_tx", "_checkpoints", "_crypto", "_decided_once", "_decisions",
        "_dropped", "_dropped_counts", "_judge", "_kept", "_max_open", "_members", "_new_votes",
        "_no_rounds", "_nodes", "_period", "_queued", "_rb", "_sends", "_sync", "_ticks",
        "_tx_id_of", "node_id", "old_unblock", "unprovable",
    )

    def __init__(
        self,
        *,
        node_id: NodeId,
        nodes: tuple[NodeId, ...],
        crypto: Crypto,
        checkpoint_ticks: int,
        batch: int,
        verify_proof: VerifyProof,
        faults: int | None = None,
        restored_votes: tuple[VetoChoice, ...] = (),
        restored_relays: tuple[VoteRelay, ...] = (),
        max_open: int = 1024,
        tx_id_of: Callable[[Transaction], TxId] | None = None,
        vote_batch_ticks: int = 0,
        decided_once: bool = False,
        restored_decisions: tuple[CheckpointDecision, ...] = (),
        no_rounds: bool = False,
    ) -> None:
        """`restored_*`: the durable record (`votes()`, `relays()`, `veto_decisions()`).
        `decided_once`: the deliberate bug `veto_decided_once` (bugs.py): never queue an id
        a remembered checkpoint names, the rule before `VetoCheckpoint.kept`. `no_rounds`:
        `veto_no_rounds`, never queue again an id kept on its own proof (before rounds)."""
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
        self._decided_once = decided_once
        self._no_rounds = no_rounds
        # The core's transaction id (`transaction_id` over the codec's encoding); the
        # default hashes `crypto.encode`, which is the codec only where they coincide.
        self._tx_id_of = tx_id_of or (lambda tx: transaction_id(tx, crypto.encode))
        self._judge = VoteJudge(members=self._members, crypto=crypto, batch=batch,
                                tx_id_of=self._tx_id_of, verify_proof=verify_proof)
        self._rb = VoteBroadcast(
            node_id=node_id, nodes=nodes,
            faults=(len(nodes) - 1) // 3 if faults is None else faults,
            hasher=crypto, restored=restored_relays, batch_ticks=vote_batch_ticks)
        self._ticks = 0
        self._queued: dict[TxId, None] = {}
        self._checkpoints: dict[bytes, VetoCheckpoint] = {}
        self._decisions = DecisionLog()
        self._by_tx: dict[TxId, dict[bytes, None]] = {}
        self._answered: dict[tuple[NodeId, bytes], None] = {}
        self._sends: list[Send] = []
        self._new_votes: list[VetoChoice] = []
        self._sync = False
        self._dropped: list[TxId] = []
        self._kept: list[TransactionProof] = []
        self._dropped_counts: dict[str, int] = {}
        self.unprovable: Callable[[TxId], bool] = lambda _t: False
        self.old_unblock = False  # `cascade_in_drain` (bugs.py): blocked ends at the decision
        """Never vote drop on it, and no proof to veto with: committed here without a proof
        (after a restart), or possibly committed and forgotten (the core's `memory.py`).
        The node does not vote until a veto's proof arrives or this changes (retried on
        every start, pull and vote it hears)."""
        for vote in restored_votes:
            self._restore(vote)
        for decision in restored_decisions:
            self._restore_decision(decision)

    @property
    def fenced(self) -> bool:
        """The amnesia fence (`fence.py`): start, vote, echo and ready nothing (a node that
        lost its record no longer knows what it voted and echoed); record and deliver."""
        return self._rb.fenced

    @fenced.setter
    def fenced(self, value: bool) -> None:
        self._rb.fenced = value

    # Inputs --------------------------------------------------------------------------

    def queue(self, tx_id: TxId) -> None:
        """Ask for a checkpoint that drops stuck `tx_id` (the core asks again every period
        while it stays stuck): ignored while a checkpoint this node remembers is undecided
        on it or dropped it. A checkpoint kept on ANOTHER id's proof says nothing of
        `tx_id` (a veto shows one id applicable, the batch rides along): it goes out again
        at once, in a new id list ("Kept on another's proof"). One kept on its own proof
        goes out in the next ROUND, after a wait doubling with the round (KEEP only says
        "not dropped now": docs/LEADERLESS.md "Rounds in the veto mode"; `next_round`)."""
        if self._next_round(tx_id) is not None:
            self._queued[tx_id] = None

    def _next_round(self, tx_id: TxId) -> int | None:
        holders = self._by_tx.get(tx_id)
        if holders and self._decided_once:
            return None
        return next_round(tx_id, (self._checkpoints[cid] for cid in holders or ()),
                          ticks=self._ticks, period=self._period, no_rounds=self._no_rounds)

    def tick(self, proof_of: ProofOf) -> None:
        """Every `checkpoint_ticks` ticks: pull what this node lacks of its undecided
        checkpoints (a `StartCheckpoint` again: peers answer), then start a checkpoint of
        the first `batch` queued ids (sorted). Batched broadcast: flush its echoes and
        readies every `vote_batch_ticks` ticks."""
        self._rb.tick()
        self._ticks += 1
        if self._ticks % self._period:
            return
        self._answered.clear()
        self._rb.refetch()
        for cp in self._checkpoints.values():
            if cp.drop is None:
                self._broadcast(StartCheckpoint(tx_ids=cp.tx_ids, round=cp.round,
                                                delivered=tuple(sorted(cp.delivered))))
        rounds = {t: r for t in sorted(self._queued) if (r := self._next_round(t)) is not None}
        self._queued = dict.fromkeys(rounds)
        if not rounds or self._open() >= self._max_open or self.fenced:
            return
        tx_ids = tuple(rounds)[: self._batch]
        for t in tx_ids:
            del self._queued[t]
        round_no = max(rounds[t] for t in tx_ids)  # a name this node never decided
        self._broadcast(StartCheckpoint(tx_ids=tx_ids, round=round_no))
        self._start(tx_ids, proof_of, round_no)

    def on_start(self, src: NodeId, msg: StartCheckpoint, proof_of: ProofOf) -> None:
        """A peer proposes a checkpoint (or pulls one it has not decided): vote on it once,
        and answer with this node's broadcast messages of the votes `src` lacks (once per
        period per peer and checkpoint)."""
        if src not in self._members:
            self._drop("not_a_member")
            return
        if not self._judge.valid_ids(msg.tx_ids):
            self._drop("bad_id_list")
            return
        if not valid_round(msg.round):
            self._drop("bad_round")
            return
        cid = checkpoint_id(self._crypto, msg.tx_ids, msg.round)
        new = cid not in self._checkpoints
        cp = self._start(msg.tx_ids, proof_of, msg.round)
        if cp is None:
            return
        if new and msg.delivered:
            # Learnt from a pull: this node missed votes its peers hold; pull them now
            # rather than a period later (they know the checkpoint: no pull back again).
            self._broadcast(StartCheckpoint(tx_ids=msg.tx_ids, round=msg.round))
        if (src, cid) in self._answered:
            return
        self._answered[(src, cid)] = None
        have = set(msg.delivered) if isinstance(msg.delivered, tuple) else set()
        for voter in self._nodes:
            if voter not in have:
                self._sends += self._rb.answer((voter, cid), src)

    def on_choice(self, src: NodeId, msg: VetoChoice, proof_of: ProofOf) -> None:
        """A voter's signed vote: the SEND of its reliable broadcast (only from the voter)."""
        if src != msg.voter:
            self._drop("relayed_vote")
            return
        cp = self._enter(src, msg, proof_of)
        if cp is not None:
            self._rb.on_send(src, msg, self._judge.problem)
            self._collect()

    def on_echo(self, src: NodeId, msg: VoteEcho, proof_of: ProofOf) -> None:
        """An older peer's full ECHO of a vote (possibly this node's own old vote:
        adopted); correct nodes now echo by digest (`on_relay`)."""
        cp = self._enter(src, msg.vote, proof_of)
        if cp is not None:
            self._rb.on_echo(src, msg, self._judge.problem)
            self._collect()

    def on_ready(self, src: NodeId, msg: VoteReady) -> None:
        """A peer's READY (a digest): counted only for a checkpoint this node knows."""
        if src not in self._members or msg.voter not in self._members:
            self._drop("not_a_member")
        elif not self._rb.known((msg.voter, msg.checkpoint)):
            self._drop("unknown_checkpoint")  # the sender sends it again when pulled
        else:
            self._rb.on_ready(src, msg)
            self._collect()

    def on_batch(self, src: NodeId, msg: VoteBatch, proof_of: ProofOf) -> None:
        """A peer's batched ECHOes and READYs: each item handled exactly as the lone
        `VoteEcho`/`VoteReady` it stands for (a bad one is dropped and counted, the others
        count); a batch over `MAX_BATCH_ITEMS` of either, or not of tuples, is dropped."""
        echoes, readies = msg.echoes, msg.readies
        items: tuple[object, ...] = readies  # peer input: checked
        if not isinstance(echoes, tuple) or not isinstance(readies, tuple) \
                or len(echoes) > MAX_BATCH_ITEMS or len(readies) > MAX_BATCH_ITEMS:
            self._drop("bad_vote_batch")
            return
        for vote in echoes:
            self.on_echo(src, VoteEcho(vote=vote), proof_of)
        for ready in items:
            if isinstance(ready, VoteReady):
                self.on_ready(src, ready)
            else:
                self._drop("bad_vote_batch_item")

    def on_relay(self, src: NodeId,
                 msg: VoteEchoDigest | VoteDigestBatch | FetchVote | VoteBody,
                 proof_of: ProofOf) -> None:
        """The broadcast's digest-only messages (docs/LEADERLESS.md "Echoes by digest"): an
        ECHO by digest, a batch of them and READYs of one checkpoint, a fetch of a body,
        the fetched body."""
        if src not in self._members:
            self._drop("not_a_member")
        elif isinstance(msg, VoteDigestBatch):
            self._on_digest_batch(src, msg)
        elif isinstance(msg, VoteEchoDigest):
            self._relay_item(src, msg.voter, msg.checkpoint, msg.digest, echo=True)
        elif isinstance(msg, FetchVote):
            if msg.voter not in self._members:
                self._drop("not_a_member")
            elif self._rb.known((msg.voter, msg.checkpoint)):
                self._rb.on_fetch(src, msg)
            else:
                self._drop("unknown_checkpoint")  # forgotten (decided, collected) or never
        else:
            vote = msg.vote
            if not isinstance(vote, VetoChoice) or vote.voter not in self._members:
                self._drop("not_a_member")
            elif self._rb.expects(vote):  # before any signature check (else counted)
                cp = self._enter(src, vote, proof_of)
                if cp is not None:
                    self._rb.on_body(vote, self._judge.problem)
        self._collect()

    def _on_digest_batch(self, src: NodeId, msg: VoteDigestBatch) -> None:
        """Each item exactly as the lone `VoteEchoDigest`/`VoteReady` it stands for; a batch
        whose fields are not parallel tuples of at most `MAX_BATCH_ITEMS`, or whose
        checkpoint is not bytes, is dropped whole (`bad_vote_batch`)."""
        cid, ev, ed, rv, rd = (msg.checkpoint, msg.echo_voters, msg.echo_digests,
                               msg.ready_voters, msg.ready_digests)
        if not isinstance(cid, bytes) or not all(isinstance(t, tuple) for t in (ev, ed, rv, rd)) \
                or len(ev) != len(ed) or len(rv) != len(rd) \
                or len(ev) > MAX_BATCH_ITEMS or len(rv) > MAX_BATCH_ITEMS:
            self._drop("bad_vote_batch")
            return
        self._rb.on_digest_items(src, cid, ev, ed, echo=True)  # in bulk: no call per item
        self._rb.on_digest_items(src, cid, rv, rd, echo=False)

    def _relay_item(self, src: NodeId, voter: object, cid: bytes, digest: object, *,
                    echo: bool) -> None:
        """One ECHO or READY by digest from member `src` (peer input: types checked)."""
        if not isinstance(voter, str) or not isinstance(digest, bytes) \
                or not isinstance(cid, bytes):
            self._drop("bad_vote_batch_item")
        elif voter not in self._members:
            self._drop("not_a_member")
        elif not self._rb.known((NodeId(voter), cid)):
            self._drop("unknown_checkpoint")  # the sender sends it again when pulled
        elif echo:
            self._rb.on_echo_digest(src, (NodeId(voter), cid), digest)
        else:
            self._rb.on_ready_digest(src, (NodeId(voter), cid), digest)

    def on_envelope(self, src: NodeId, msg: OrderingEnvelope | OrderingSubmit) -> None:
        """The ordered resolution's message: not this mode's (counted)."""
        self._drop("ordering_in_veto_mode")

    def stamp(self, number: int) -> None:
        """Nothing to map (the ordered resolution maps its PBFT's Ready numbers)."""

    def persisted(self, number: int) -> None:
        """Nothing to count (see `stamp`)."""

    def record(self) -> OrderingRecord | None:
        """The ordered resolution's record: none in this mode."""
        return None

    # Queries -------------------------------------------------------------------------

    def blocked(self, tx_id: TxId) -> bool:
        """Whether this node voted drop in an undecided checkpoint containing `tx_id`, or a
        checkpoint it remembers containing `tx_id` was decided DROP (see the module
        docstring)."""
        for cid in self._by_tx.get(tx_id, ()):
            cp = self._checkpoints[cid]
            if (cp.drop and not self.old_unblock) or (
                    cp.drop is None and cp.own is not None and cp.own.drop):
                return True
        return False

    def undecided(self) -> dict[bytes, VetoCheckpoint]:
        """The undecided checkpoints remembered here, by id (a copy: inspection only)."""
        return {cid: cp for cid, cp in self._checkpoints.items() if cp.drop is None}

    def votes(self) -> tuple[VetoChoice, ...]:
        """This node's votes of the checkpoints it remembers, decided ones too until `gc`
        (for the durable record: a restarted node never votes again on a checkpoint a
        lagging peer still asks about)."""
        return tuple(cp.own for cp in self._checkpoints.values() if cp.own is not None)

    def relays(self) -> tuple[VoteRelay, ...]:
        """This node's echo/ready choices in the vote broadcasts of the checkpoints it
        remembers, decided ones too until `gc` (and restored ones of checkpoints it has not
        heard of again), for the durable record: after a restart its READYs still answer a
        lagging peer's pull."""
        keys: list[Key] = [(v, cid) for cid in self._checkpoints for v in self._nodes]
        keys += self._rb.orphans(self._checkpoints.__contains__)
        return self._rb.relays(keys)

    def veto_decisions(self) -> tuple[CheckpointDecision, ...]:
        """The decisions of the checkpoints this node remembers, in decision order, for the
        durable record (the same tuple object until one is added or collected): a restarted
        node is decided on them again at once, with no vote, pull or delivery."""
        return self._decisions.record()

    def dropped_counts(self) -> Mapping[str, int]:
        counts = dict(self._dropped_counts)
        for reason, n in self._rb.dropped_counts().items():
            counts[reason] = counts.get(reason, 0) + n
        return counts

    def __len__(self) -> int:
        """How many checkpoints this node remembers."""
        return len(self._checkpoints)

    def drain(self) -> VetoEffects:
        """The effects accumulated since the last drain."""
        self._collect()
        effects = VetoEffects(sends=tuple(self._sends), votes=tuple(self._new_votes),
                              sync=self._sync, dropped=tuple(self._dropped),
                              kept=tuple(self._kept))
        self._sends, self._new_votes, self._dropped, self._kept = [], [], [], []
        self._sync = False
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

    def _enter(self, src: NodeId, vote: VetoChoice, proof_of: ProofOf) -> VetoCheckpoint | None:
        """The checkpoint of a vote this node hears of (SEND or ECHO), recorded and voted on
        when new; None (counted) when the vote is malformed or the machine is full."""
        if src not in self._members or not isinstance(vote, VetoChoice) \
                or vote.voter not in self._members:
            self._drop("not_a_member")
            return None
        name = self._judge.name_problem(vote)  # bad_id_list, bad_round, bad_checkpoint_id
        if name is not None:
            self._drop(name)
            return None
        cp = self._checkpoints.get(vote.checkpoint)
        if cp is not None and cp.own is not None:
            return cp  # the broadcast checks the rest once per content
        problem = self._judge.problem(vote)  # before voting on it or adopting it
        if problem is not None:
            self._drop(problem)
            return None
        if vote.voter == self.node_id:
            return self._adopt(vote)  # our own vote from before a restart: never vote again
        # Not voted yet: vote now. Holding a valid veto, vote veto with its proof (the
        # safe side: such a vote never completes a DROP).
        known = None if vote.drop else self._judge.verified(vote)[0]
        return self._start(vote.tx_ids, proof_of, vote.round, known=known)

    def _open(self) -> int:
        return sum(1 for cp in self._checkpoints.values() if cp.drop is None)

    def _broadcast(self, msg: StartCheckpoint) -> None:
        self._sends.extend(Send(to=peer, message=msg)
                           for peer in self._nodes if peer != self.node_id)

    def _record(self, cid: bytes, tx_ids: tuple[TxId, ...], round_no: int) -> VetoCheckpoint:
        cp = self._checkpoints[cid] = VetoCheckpoint(tx_ids=tx_ids, round=round_no)
        for t in tx_ids:
            self._by_tx.setdefault(t, {})[cid] = None
            self._queued.pop(t, None)
        for voter in self._nodes:
            self._rb.open((voter, cid))
        return cp

    def _forget(self, cid: bytes) -> None:
        cp = self._checkpoints.pop(cid)
        self._decisions.forget(cid)
        for voter in self._nodes:
            self._rb.forget((voter, cid))
        for t in cp.tx_ids:
            holders = self._by_tx[t]
            del holders[cid]
            if not holders:
                del self._by_tx[t]

    def _start(self, tx_ids: tuple[TxId, ...], proof_of: ProofOf, round_no: int, *,
               known: TransactionProof | None = None) -> VetoCheckpoint | None:
        """Vote on checkpoint (`tx_ids`, `round_no`) unless this node already did: veto with
        `known` (a verified proof) or `proof_of`'s first proof, drop when there is none."""
        cid = checkpoint_id(self._crypto, tx_ids, round_no)
        cp = self._checkpoints.get(cid)
        if cp is None:
            if self._open() >= self._max_open:
                self._drop("too_many_open_checkpoints")
                return None
            cp = self._record(cid, tx_ids, round_no)
        if cp.own is not None or self.fenced:
            return cp
        proof = known or next((p for p in map(proof_of, tx_ids) if p is not None), None)
        if proof is None and any(self.unprovable(t) for t in tx_ids):
            return cp  # committed here without a proof: abstain (never a drop vote)
        vote = VetoChoice(checkpoint=cid, tx_ids=tx_ids, voter=self.node_id, round=round_no,
                          drop=proof is None, proofs=() if proof is None else (proof,))
        vote = dataclasses.replace(vote, signature=self._crypto.sign(vote))
        cp.own = vote
        self._new_votes.append(vote)
        self._sync = True
        self._rb.broadcast(vote)
        self._collect()
        return cp

    def _adopt(self, vote: VetoChoice) -> VetoCheckpoint:
        """Take `vote` (this node's, signature verified) as its own vote of that checkpoint
        and broadcast it again (a correct node's vote is one value: the same digest).
        Never capped by `max_open`: forgetting an own vote could let this node vote twice."""
        cp = self._checkpoints.get(vote.checkpoint)
        if cp is None:
            cp = self._record(vote.checkpoint, vote.tx_ids, vote.round)
        cp.own = vote
        self._sync = True
        self._rb.on_send(self.node_id, vote, lambda _v: None)
        return cp

    def _restore(self, vote: VetoChoice) -> None:
        if vote.voter != self.node_id or bool(vote.proofs) == vote.drop \
                or not self._judge.valid_ids(vote.tx_ids, limit=len(vote.tx_ids)) \
                or not valid_round(vote.round) \
                or vote.checkpoint != checkpoint_id(self._crypto, vote.tx_ids, vote.round):
            raise LocalProtocolError(
                f"restored vote is not an undecided vote of {self.node_id!r}: {vote!r}")
        if vote.checkpoint not in self._checkpoints:
            self._adopt(vote)

    def _restore_decision(self, decision: CheckpointDecision) -> None:
        """A decision of the durable record: the checkpoint is decided again at once (its
        drops or kept proofs go to the core at the next drain, which applies them
        idempotently); no vote, no pull, no delivery needed (its peers may have collected
        it: asked, they would abstain)."""
        ids = decision.tx_ids
        if not self._judge.valid_ids(ids, limit=len(ids)) or (decision.drop and decision.kept) \
                or not valid_round(decision.round) or not all(
                    isinstance(p, TransactionProof) and self._tx_id_of(p.tx) in ids
                    for p in decision.kept):
            raise LocalProtocolError(f"restored decision is malformed: {decision!r}")
        cid = checkpoint_id(self._crypto, ids, decision.round)
        cp = self._checkpoints.get(cid)
        if cp is None:
            cp = self._record(cid, ids, decision.round)
        if cp.drop is None:
            self._decide(cid, cp, decision)

    def _decide(self, cid: bytes, cp: VetoCheckpoint, decision: CheckpointDecision) -> None:
        """Checkpoint `cid` is decided (final): DROP hands the core its ids, KEEP the deciding
        veto's verified proofs; the decision goes to the durable record."""
        cp.drop, cp.decided_at = decision.drop, self._ticks
        cp.kept = frozenset(self._tx_id_of(p.tx) for p in decision.kept)
        if decision.drop:
            self._dropped.extend(cp.tx_ids)
        else:
            self._kept.extend(decision.kept)
        self._decisions.add(cid, decision)

    def _collect(self) -> None:
        """Take the broadcast's effects: its sends, its choices to persist, and decide on
        newly delivered votes."""
        sends, delivered, dirty = self._rb.drain()
        self._sends += sends
        self._sync = self._sync or dirty
        for vote in delivered:
            cp = self._checkpoints.get(vote.checkpoint)
            if cp is None:
                continue
            cp.delivered[vote.voter] = vote
            if cp.drop is None:
                if not vote.drop:
                    self._decide(vote.checkpoint, cp, CheckpointDecision(
                        tx_ids=cp.tx_ids, drop=False, kept=self._judge.verified(vote),
                        round=cp.round))
                    self._sync = True  # durable before what the decision unblocks leaves
                elif len(cp.delivered) == len(self._nodes) and all(
                        v.drop for v in cp.delivered.values()):
                    self._decide(vote.checkpoint, cp, CheckpointDecision(
                        tx_ids=cp.tx_ids, drop=True, round=cp.round))
                    self._sync = True
            elif cp.drop and not vote.drop:
                self._drop("veto_after_drop")  # impossible with at most f faulty members

"""Intake of peer messages for `LeaderlessCore` (a mixin over the core's state: see
`parts.py`): dispatch of each peer message to its handler, the checks (`checks.py`) with
drops counted by reason, endorsements and refusals into the store and the tally, fetched
proofs (a commit certificate commits), fetches of unknown transactions, and veto messages
handed to the checkpoint machine.

Rules: re-sent endorsements and refusals equal to the ones held, and any of a decided
transaction (committed or dropped here), are recognised BEFORE a signature is verified
(`status().duplicate`); a peer's `EndorsementBatch` is verified once for all its items; an
endorsement of an unknown transaction is buffered and the transaction fetched; a refusal of
an unknown or decided one is not tallied.

Must not import: trio, sockets, clocks, global random, `phalanx.net`.
"""

from __future__ import annotations

from phalanx.consensus.leaderless.checks import endorsement_problem, refusal_problem
from phalanx.consensus.leaderless.endorsement_batch import expand, malformed
from phalanx.consensus.leaderless.messages import (
    CommittedDigest,
    EndorsedTx,
    Endorsement,
    EndorsementBatch,
    FetchTransactions,
    FetchVote,
    OrderingEnvelope,
    OrderingSubmit,
    Refusal,
    SignatureResend,
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
)
from phalanx.consensus.leaderless.parts import CoreParts, Outbox
from phalanx.consensus.leaderless.recovery import MAX_FETCH_IDS, MAX_RESEND_ITEMS
from phalanx.consensus.leaderless.store import TxRecord, TxState
from phalanx.consensus.types import Message, NodeId


class PeerIntake(CoreParts):
    """The peer-message handlers of `LeaderlessCore`."""

    def _on_receive(self, src: NodeId, msg: Message, out: Outbox) -> None:
        if src not in self._config.nodes or src == self._config.node_id:
            self._drop("unknown_sender")
        elif isinstance(msg, Transaction):
            problem = self._accept_tx(self._tx_id(msg), msg, out)
            if problem is not None:
                self._drop(problem)
        elif isinstance(msg, EndorsementBatch):
            self._on_batch(src, msg, out)
        elif isinstance(msg, Endorsement):
            self._on_endorsement(src, msg, out)
        elif isinstance(msg, SignatureResend):
            self._on_resend(src, msg, out)
        elif isinstance(msg, Refusal):
            self._on_refusal(msg, out)
        elif isinstance(msg, TransactionProof):
            self._on_proof(src, msg, out)
        elif isinstance(msg, FetchTransactions):
            self._on_fetch(src, msg, out)
        elif isinstance(msg, CommittedDigest):
            out.sends += self._recovery.on_digest(src, msg.tx_ids, self._store, self._ticks)
            for tx_id in msg.tx_ids[:MAX_FETCH_IDS]:
                if isinstance(tx_id, bytes) and tx_id in self._store.records and (
                        self._store.state_of(tx_id) is TxState.PENDING):
                    # Committed at a peer, pending here: ask every peer each period, as
                    # for an overdue one (the sender may lack the signature it needs).
                    self._expired[tx_id] = None
        elif isinstance(msg, StartCheckpoint):
            if self._memory.learn(msg, self._tx_id, lambda t: self._store.state_of(t)
                                  is not None):  # bodies first: they may let it vote
                self._drop("bad_checkpoint_body")
            self._checkpoints.on_start(src, msg, self._proof_of)
        elif isinstance(msg, VetoChoice):
            self._checkpoints.on_choice(src, msg, self._proof_of)
        elif isinstance(msg, VoteEcho):
            self._checkpoints.on_echo(src, msg, self._proof_of)
        elif isinstance(msg, VoteReady):
            self._checkpoints.on_ready(src, msg)
        elif isinstance(msg, VoteBatch):
            self._checkpoints.on_batch(src, msg, self._proof_of)
        elif isinstance(msg, VoteDigestBatch | VoteEchoDigest | FetchVote | VoteBody):
            self._checkpoints.on_relay(src, msg, self._proof_of)
        elif isinstance(msg, OrderingEnvelope | OrderingSubmit):
            self._checkpoints.on_envelope(src, msg)
        else:
            self._drop("unknown_message")

    def _on_proof(self, src: NodeId | None, proof: TransactionProof, out: Outbox) -> None:
        problem = self._accept_tx(self._tx_id(proof.tx), proof.tx, out)
        if problem not in (None, "duplicate_tx", "decided_tx"):
            self._drop(problem or "")
            if problem == "stale_tx":
                self._stale_certified(proof)  # missed for good here: ask for a checkpoint
            return
        for e in proof.endorsements:
            if isinstance(e, Endorsement):
                self._on_endorsement(src, e, out)
        for r in proof.refusals:
            if isinstance(r, Refusal):
                self._on_refusal(r, out)
        record = self._store.get(self._tx_id(proof.tx))
        if record is not None and record.state is TxState.PENDING:
            self._commit_certificate(record, proof, out)

    def _commit_certificate(self, record: TxRecord, proof: TransactionProof,
                            out: Outbox) -> None:
        """A proof whose own endorsements make `record` committable commits it, even where
        an equivocating endorser's other endorsement was kept here (the record keeps one per
        endorser: without this, a node that kept the conditional one of an equivocator's
        two never commits what the others committed with the unconditional one). Counting
        either of a Byzantine endorser's endorsements is what a node that received that one
        first would do."""
        valid: dict[NodeId, Endorsement] = {}
        dropped = TxState.DROPPED
        state_of = self._store.state_of
        for e in proof.endorsements:
            if (not isinstance(e, Endorsement) or e.tx_id != record.tx_id or e.endorser in valid
                    or not all(state_of(c) is dropped for c in e.conditions)):
                continue
            held = record.endorsements.get(e.endorser)
            if held == e or (e.endorser != self._config.node_id and endorsement_problem(
                    e, self._config.nodes, self._crypto, self._roots) is None):
                valid[e.endorser] = e
        # An answer leaves out what this node said it holds (`FetchTransactions.held`): the
        # held endorsements count as they would inside the proof (verified on arrival).
        for endorser, e in record.endorsements.items():
            if endorser not in valid and all(state_of(c) is dropped for c in e.conditions):
                valid[endorser] = e
        if (len(valid) < self._rules.quorum(record) or self._rules.committable(record)
                or self._checkpoints.blocked(record.tx_id)):
            return
        self._commit(record, tuple(valid[n] for n in sorted(valid)), out)

    def _on_batch(self, src: NodeId, batch: EndorsementBatch, out: Outbox) -> None:
        """A peer's endorsements of one step under one signature: verified once (only when
        one of them is news here), then each handled as `_on_endorsement` (whose signature
        check then finds the root verified). A forged, malformed or non-member batch is one
        drop; a replayed one counts each item as the duplicate it is."""
        if batch.endorser not in self._config.nodes:
            self._drop("unknown_endorser")
            return
        if malformed(batch):
            self._drop("malformed_endorsement_batch")
            return
        olds = [self._old_item(batch, i, item) for i, item in enumerate(batch.items)]
        if None not in olds:  # nothing news: no Merkle tree, no signature check
            for old in olds:
                if old:
                    self._drop(old)
            return
        expanded = expand(batch)
        if expanded is None:
            self._drop("malformed_endorsement_batch")
            return
        root, endorsements = expanded
        news = []
        for e in endorsements:
            old = self._old_endorsement(e)
            if old is None:
                news.append(e)
            elif old:
                self._drop(old)
        if news and not self._roots.verify(self._crypto, batch.endorser, root, batch.signature):
            self._drop("bad_endorsement_batch_signature")
            return
        for e in news:  # the checks of `endorsement_problem` passed for all of them above
            self._on_endorsement(src, e, out, checked=True)

    def _on_resend(self, src: NodeId, msg: SignatureResend, out: Outbox) -> None:
        """A peer's re-sent signatures: each as if it came alone (duplicates are
        recognised before any signature check); an oversized one is one drop."""
        if len(msg.endorsements) + len(msg.refusals) > MAX_RESEND_ITEMS:
            self._drop("oversized_resend")
            return
        for e in msg.endorsements:
            self._on_endorsement(src, e, out)
        for r in msg.refusals:
            self._on_refusal(r, out)

    def _old_item(self, batch: EndorsementBatch, index: int, item: EndorsedTx) -> str | None:
        """`_old_endorsement` of item `index` of a well-formed `batch`, judged before its
        tree is built: "" (our own), the benign drop reason when its transaction is
        decided here (an equal endorsement held: "duplicate_endorsement", as
        `_old_endorsement` says; equal signature and position mean the same root and path
        short of a SHA-256 collision, and either way the item is dropped), or None (it
        may be news: the batch is expanded and each item judged by `_old_endorsement`)."""
        if batch.endorser == self._config.node_id and self._kernel.endorsement(
                item.tx_id) is not None:
            return ""
        record = self._store.get(item.tx_id)
        if record is None:
            return "decided_endorsement" if self._store.decided(item.tx_id) else None
        if record.state is TxState.PENDING:
            return None
        held = record.endorsements.get(batch.endorser)
        if (held is not None and held.signature == batch.signature and held.index == index
                and held.conditions == item.conditions):
            return "duplicate_endorsement"
        return "decided_endorsement"

    def _old_endorsement(self, e: Endorsement) -> str | None:
        """Why `e` needs no signature check: "" (our own, echoed back), the benign drop
        reason (held already, or of a transaction decided here), or None (news)."""
        if e.endorser == self._config.node_id and self._kernel.endorsement(e.tx_id) is not None:
            return ""  # our own, echoed back in a proof
        # An own signature the safety kernel does not hold was lost with our record
        # (amnesia): it is counted like a peer's, verified (docs/LEADERLESS.md "Amnesia
        # fence"); without it a certificate that needs it never commits here.
        # Re-sends and fetched proofs repeat what is held: recognised before any signature
        # is verified (an equal endorsement is the one verified when it first arrived).
        record = self._store.get(e.tx_id)
        if record is not None:
            if record.endorsements.get(e.endorser) == e:
                return "duplicate_endorsement"
            if record.state is not TxState.PENDING:
                # Committed here: nothing about it can change any more (the endorsers past
                # the quorum arrive after the commit; verifying them was a third of the
                # signature checks).
                return "decided_endorsement"
        elif self._store.decided(e.tx_id):
            return "decided_endorsement"  # nothing about it can change any more
        elif self._store.buffered.get(e.tx_id, {}).get(e.endorser) == e:
            return "duplicate_endorsement"
        return None

    def _on_endorsement(self, src: NodeId | None, e: Endorsement, out: Outbox, *,
                        checked: bool = False) -> None:
        """`checked`: an item of a batch `_on_batch` verified (member, well-formed, its
        root signed): not hashed up its path again."""
        old = self._old_endorsement(e)
        if old is not None:
            if old:
                self._drop(old)
            return
        record = self._store.get(e.tx_id)
        problem = None if checked else endorsement_problem(
            e, self._config.nodes, self._crypto, self._roots)
        if problem is not None:
            self._drop(problem)
            return
        if record is None:
            if self._store.buffer(e) and src is not None:
                out.sends += self._recovery.fetch_named(
                    src, e.tx_id, self._ticks,
                    self._recovery.held_of(self._store, body_only=True))
            return
        self._add_endorsement(record, e, src, out)

    def _add_endorsement(self, record: TxRecord, e: Endorsement, src: NodeId | None,
                         out: Outbox) -> None:
        have = record.endorsements.get(e.endorser)
        if have is not None:
            self._drop("duplicate_endorsement" if have == e else "equivocating_endorsement")
            return
        if record.state is not TxState.PENDING:
            return
        record.endorsements[e.endorser] = e
        self._rules.invalidate()
        if src is not None:
            for c in e.conditions:
                if self._store.state_of(c) is None:
                    self._fetch(src, c, out)
        self._try_commit(record, out)

    def _on_refusal(self, r: Refusal, out: Outbox) -> None:
        if r.endorser == self._config.node_id and self._kernel.refusal(r.tx_id) is not None:
            return  # our own, echoed back in a proof (a lost one is tallied, verified)
        record = self._store.get(r.tx_id)
        if record is None or record.state is not TxState.PENDING:
            # Unknown: not tallied (memory stays bounded); the refuser re-sends it.
            # Decided: nothing about it can change. Neither needs its signature checked.
            return
        if self._tally.holds(r):
            self._drop("duplicate_refusal")
            return
        problem = refusal_problem(r, self._config.nodes, self._crypto)
        if problem is not None:
            self._drop(problem)
            return
        self._tally.add(r)
        self._check_certificate(record, out)

    def _check_certificate(self, record: TxRecord, out: Outbox) -> None:
        """Drop `record` on an abort certificate: `threshold` (n-Q+1+f) distinct nodes that
        refused it, or that endorsed it only on a condition committed here (`Rules.dead`:
        such an endorsement is definitely valid at no correct node, and a correct node signs
        one endorsement of a transaction, never with a refusal), so at most Q-1 correct
        nodes can count towards its commit anywhere (`refusals.py`; docs/LEADERLESS.md
        "Dead endorsements abort"). Kept as the answer to a peer's fetch."""
        if record.state is not TxState.PENDING:
            return
        certificate = self._tally.certificate(record.tx_id)
        if certificate:
            self._recovery.aborted(record.tx_id, TransactionProof(
                tx=record.tx, refusals=tuple(sorted(certificate, key=lambda r: r.endorser))))
            self._drop_tx(record, "aborted: enough nodes refused it past its deadline", out)
            return
        if "no_dead_abort" in self._bugs or not record.endorsements:  # the deliberate bug (bugs.py)
            return
        dead = {e.endorser: e for e in self._rules.dead(record)}
        refusals = {r.endorser: r for r in self._tally.refusals(record.tx_id)
                    if r.endorser not in dead}
        if not dead or len(dead) + len(refusals) < self._tally.threshold:
            return
        self._recovery.aborted(record.tx_id, TransactionProof(
            tx=record.tx, endorsements=tuple(dead[n] for n in sorted(dead)),
            refusals=tuple(refusals[n] for n in sorted(refusals))))
        self._drop_tx(record, "aborted: its endorsements name a committed transaction", out)

    def _on_fetch(self, src: NodeId, msg: FetchTransactions, out: Outbox) -> None:
        if len(msg.tx_ids) > MAX_FETCH_IDS:
            self._drop("oversized_fetch")
        held = self._recovery.masks.split(msg.held, len(msg.tx_ids))
        if held is None:
            self._drop("malformed_fetch_held")  # answered in full, as a fetch without one
        out.sends += self._recovery.answer(src, msg.tx_ids, self._store, self._kernel, held)

    def _fetch(self, src: NodeId, tx_id: TxId, out: Outbox) -> None:
        out.sends += self._recovery.fetch(src, (tx_id,), self._ticks,
                                          self._recovery.held_of(self._store))


"""The leaderless conditional-endorsement core (PnyxDB, docs/LEADERLESS.md): a sans-IO
`phalanx.consensus.core.Core`.

Owns: dispatching inputs, intake of client and peer input (checks in `checks.py`, drops
counted by reason), dissemination (new client transactions and own endorsements and
refusals to every peer, periodic re-sends, fetches of unknown transactions), and turning
each step's outbox into a `Ready`. State lives in the sub-machines:
`store.TxStore` (transactions, endorsements, tombstones, GC), `rules.Rules`
(applicability, commit), `safety.SafetyKernel` (the only signer of endorsements and
refusals), `release.ReleaseGate` (version-gated release), the checkpoint/veto machine and
the refusal tally (`veto.py`, `refusals.py`). The endorsement decision is `endorse.py`.
Deliberate bugs arrive as `bugs` names (`bugs.BUG_NAMES`); only this module and the
sub-machines it configures read them.

Must not import: trio, sockets, clocks, global random, `phalanx.net`. Crypto is injected.

Invariants:
- Peer and client input never raises: it is dropped and counted in `status().dropped`.
- Every own endorsement, refusal and veto vote leaves in `Ready.messages` of a Ready whose
  `core_state` (with `must_sync`) records it; never in `early_messages`.
- Released transactions go out in `Ready.entries` and `Ready.committed` of one Ready, local
  indexes gap-free from `app.applied()` at construction.
- Time comes only from `Tick.now_ms` (None decides nothing time-based); every iteration is
  over insertion-ordered dicts or sorted values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import assert_never

from phalanx.consensus.core import (
    Abort,
    CheckpointInstalled,
    CheckpointTaken,
    Input,
    Persisted,
    Ready,
    Receive,
    Rejection,
    Send,
    Submit,
    Tick,
)
from phalanx.consensus.crypto import Crypto, Verifier
from phalanx.consensus.leaderless.app_view import AppView
from phalanx.consensus.leaderless.bugs import check_bugs
from phalanx.consensus.leaderless.checks import (
    ProofChecker,
    endorsement_problem,
    refusal_problem,
    tx_problem,
)
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.endorse import Endorser
from phalanx.consensus.leaderless.fence import Fence
from phalanx.consensus.leaderless.messages import (
    CommittedDigest,
    DecidedTx,
    Endorsement,
    FetchTransactions,
    LeaderlessDurableState,
    Refusal,
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    VoteEcho,
    VoteReady,
    transaction_id,
)
from phalanx.consensus.leaderless.recovery import MAX_FETCH_IDS, Recovery
from phalanx.consensus.leaderless.refusals import RefusalTally
from phalanx.consensus.leaderless.release import Committed, ReleaseGate
from phalanx.consensus.leaderless.rules import Rules
from phalanx.consensus.leaderless.safety import SafetyKernel
from phalanx.consensus.leaderless.schedule import DueHeap
from phalanx.consensus.leaderless.status import BENIGN_DUPLICATES, REASONS, LeaderlessStatus
from phalanx.consensus.leaderless.store import TxRecord, TxState, TxStore
from phalanx.consensus.leaderless.tx_codec import TxCodec
from phalanx.consensus.leaderless.veto import CheckpointMachine
from phalanx.consensus.types import ClientRequest, Entry, Message, NodeId

__all__ = ["MAX_FETCH_IDS", "LeaderlessCore", "LeaderlessStatus"]



@dataclass(slots=True)
class _Outbox:
    sends: list[Send] = field(default_factory=list)
    signed: bool = False
    dirty: bool = False
    entries: list[Entry] = field(default_factory=list)
    replayed: list[Entry] = field(default_factory=list)
    aborted: list[Abort] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


class LeaderlessCore:
    """One node of the leaderless protocol (see the module docstring)."""

    def __init__(self, config: LeaderlessConfig, *, crypto: Crypto, client_keys: Verifier,
                 app: AppView, codec: TxCodec, restored: LeaderlessDurableState | None = None,
                 bugs: frozenset[str] = frozenset(), recovering: bool = False,
                 restored_entries: Sequence[Entry] = ()) -> None:
        """`recovering`: this node lost its durable record (amnesia): it starts fenced
        (`fence.py`), signing nothing until the fence's end. `restored_entries`: the WAL
        after the replica's checkpoint (`DurableState.entries`): every one is committed; those
        beyond `app.applied()` go out again in the first Ready's `committed`."""
        self._config = config
        self._crypto = crypto
        self._client_keys = client_keys
        self._app = app
        self._codec = codec
        self._bugs = check_bugs(bugs)
        self._peers = config.peers()
        self._store = TxStore(max_buffered=config.max_pending)
        self._rules = Rules(self._store, config.quorum_for)
        self._gate = ReleaseGate(app, start_index=app.applied(),
                                 no_gate="no_version_gate" in self._bugs)
        self._tally = RefusalTally(n=config.n, f=config.faults, quorum=config.quorum)
        self._verify_proof = ProofChecker(
            nodes=config.nodes, crypto=crypto, client_keys=client_keys,
            quorum_for=config.quorum_for, tx_id=self._tx_id)
        self._checkpoints = CheckpointMachine(
            node_id=config.node_id, nodes=config.nodes, crypto=crypto,
            checkpoint_ticks=config.checkpoint_ticks, batch=config.checkpoint_batch,
            verify_proof=self._verify_proof, faults=config.faults,
            restored_votes=restored.votes if restored is not None else (),
            restored_relays=restored.relays if restored is not None else (),
            tx_id_of=self._tx_id)
        self._checkpoints.unprovable = self._unprovable
        self._dropped: dict[str, int] = {}
        self._duplicates: dict[str, int] = {}
        self._queued: dict[TxId, None] = {}
        self._recovery = Recovery(peers=self._peers, every=config.rebroadcast_ticks,
                                  max_entries=config.max_pending)
        self._now: int | None = None
        self._ticks = 0
        self._number = 0
        self._committed = 0
        self._dropped_txs = 0
        self._aborted = 0
        self._restart: list[Committed] = []
        self._replay: list[Entry] = []
        self._sync_numbers: list[int] = []
        self._deadlines = DueHeap()  # pending transactions by deadline
        self._wakeups = DueHeap()  # far-future deadlines, by when they come within the lead
        self._resends = DueHeap()  # own signatures of pending transactions, by re-send tick
        self._resend_every: dict[TxId, int] = {}
        self._expired: dict[TxId, None] = {}  # pending, past their deadline
        self._to_refuse: dict[TxId, None] = {}
        self._waiting: dict[TxId, None] = {}  # pending, neither endorsed nor refused here
        self._wake = False
        self._seen_applied = app.applied()
        self._fenced = False
        self._fence = Fence(recovering=recovering, length_ms=(
            config.max_deadline_lead_ms + config.gc_horizon_ms), restored_until_ms=(
            restored.fence_until_ms if restored is not None else 0))
        self._checkpoints.fenced = self._fence.active(None)
        known: dict[TxId, Transaction] = {}
        if restored is not None:
            known = {self._tx_id(tx): tx for tx in restored.known}
        self._kernel = SafetyKernel(crypto, config.node_id, restored, known)
        self._kernel.unsafe = "endorse_despite_conflict" in self._bugs
        self._endorser = Endorser(
            config=config, app=app, store=self._store, kernel=self._kernel, gate=self._gate,
            unconditional_always="endorse_despite_conflict" in self._bugs)
        self._endorser.skip_requirements = "skip_requirements" in self._bugs
        self._rules.count_conditional = "count_conditional" in self._bugs
        if restored is not None or restored_entries:
            self._restore(restored or LeaderlessDurableState(), known, restored_entries)

    @property
    def node_id(self) -> NodeId:
        return self._config.node_id

    # ------------------------------------------------------------------------------ restore

    def _restore(self, state: LeaderlessDurableState, known: dict[TxId, Transaction],
                 entries: Sequence[Entry]) -> None:
        """Rebuild from the durable record and the WAL suffix (`durable.py` argues the crash
        cases): a WAL entry is a committed transaction released at its index (re-applied
        by the driver when beyond `applied()`); a released proof of the record past the
        WAL's end is released again at its index; gated proofs wait at the gate."""
        self._store.horizon = state.gc_horizon_ms
        for stone in state.decided:
            self._store.tombstones[stone.tx_id] = stone
            self._store.index(stone.tx_id, stone.deadline_ms)
        applied = self._app.applied()
        in_wal: dict[TxId, int] = {}
        for entry in entries:
            if entry.index > applied:
                self._replay.append(entry)
            for request in entry.requests:
                tx = self._codec.decode(request.command)
                if tx is None:
                    continue
                tx_id = self._tx_id(tx)
                in_wal[tx_id] = entry.index
                if tx_id not in self._store.records:
                    record = self._new_record(tx_id, tx)
                    record.state = TxState.COMMITTED
                    self._store.records[tx_id] = record
                    self._store.index(tx_id, tx.deadline_ms)
                    self._store.tombstones.setdefault(tx_id, DecidedTx(
                        tx_id=tx_id, deadline_ms=tx.deadline_ms, committed=True))
                    self._gate.restore_wal(Committed(
                        tx_id=tx_id, proof=None, request_command=request.command,
                        writes=record.writes, index=entry.index))
        wal_last = max([applied] + [e.index for e in entries])
        self._gate.last_index = max(self._gate.last_index, wal_last)
        indexes = state.released_at if len(state.released_at) == state.released else ()
        for i, proof in enumerate(state.committed):
            tx_id = self._tx_id(proof.tx)
            record = self._new_record(tx_id, proof.tx)
            for e in proof.endorsements:
                record.endorsements.setdefault(e.endorser, e)
            record.state = TxState.COMMITTED
            self._store.records[tx_id] = record
            self._store.index(tx_id, record.deadline)
            item = self._committed_item(record, proof)
            if tx_id in in_wal:
                item.index = in_wal[tx_id]
                self._gate.restore_wal(item)
            elif i < len(indexes) and indexes[i] <= wal_last:
                item.index = indexes[i]  # applied and compacted out of the WAL
                self._gate.restore_wal(item)
            elif i < state.released:
                self._restart.append(item)
            else:
                self._gate.add(item)
        self._gate.sort_released()
        for tx_id, tx in known.items():
            if self._store.state_of(tx_id) is None:
                record = self._new_record(tx_id, tx)
                own = self._kernel.endorsement(tx_id)
                if own is not None:
                    record.endorsements[own.endorser] = own
                self._store.records[tx_id] = record
                self._store.index(tx_id, record.deadline)
                self._deadlines.push(record.deadline, tx_id)
                self._resend_later(tx_id)
                refusal = self._kernel.refusal(tx_id)
                if refusal is not None:
                    self._tally.add(refusal)

    # ------------------------------------------------------------------------------ step

    def step(self, inp: Input, /) -> Ready:
        out = _Outbox()
        if self._replay:
            out.replayed, self._replay = self._replay, []
        if self._restart:
            out.entries += [self._gate.release_now(item) for item in self._restart]
            self._restart = []
        if isinstance(inp, Receive):
            self._on_receive(inp.src, inp.message, out)
        elif isinstance(inp, Tick):
            if inp.now_ms is not None and self._fence.on_clock(inp.now_ms):
                out.dirty = True  # the fence's end is part of the record
            self._checkpoints.fenced = self._fence.active(inp.now_ms)
            self._on_tick(inp.now_ms, out)
        elif isinstance(inp, Submit):
            self._on_submit(inp.request, out)
        elif isinstance(inp, Persisted):
            self._on_persisted(inp.number)
        elif isinstance(inp, (CheckpointTaken, CheckpointInstalled)):
            pass  # the app view reads checkpoints
        else:
            assert_never(inp)
        self._drain_checkpoints(out)
        out.entries += self._gate.release()
        if out.entries:
            out.dirty = True
        return self._ready(out)

    def _on_persisted(self, number: int) -> None:
        """Own signatures count at once (see safety.py). Releases covered by a fsynced
        `Persisted` are known durable in the WAL (`ReleaseGate.mark_synced`), but their
        proofs stay in the record until GC: dropping them there lost commits in the
        simulator's restart sweep (seed 10; docs/LEADERLESS.md "The hot path")."""
        while self._sync_numbers and self._sync_numbers[0] <= number:
            self._sync_numbers.pop(0)

    def _ready(self, out: _Outbox) -> Ready:
        core_state = self.durable_state() if (out.dirty or out.signed) else None
        number = 0
        if core_state is not None or out.entries:
            self._number += 1
            number = self._number
            self._gate.stamp(number)
            if out.signed:
                self._sync_numbers.append(number)
        entries = tuple(out.entries)
        committed = tuple(out.replayed) + entries if out.replayed else entries
        return Ready(number=number, entries=entries, committed=committed, core_state=core_state,
                     must_sync=out.signed, messages=tuple(out.sends),
                     rejected=tuple(out.rejected), aborted=tuple(out.aborted))

    def durable_state(self) -> LeaderlessDurableState:
        """The durable record as of now (what `Ready.core_state` carries)."""
        endorsed, refused, known = self._kernel.record_parts()
        proofs, released_at = self._gate.proofs()
        return LeaderlessDurableState(
            endorsed=endorsed, refused=refused, votes=self._checkpoints.votes(),
            decided=self._store.tombstone_tuple(), committed=proofs,
            gc_horizon_ms=self._store.horizon, known=known, released=len(released_at),
            released_at=released_at, fence_until_ms=self._fence.until_ms,
            relays=self._checkpoints.relays())

    def _drop(self, reason: str) -> None:
        if reason in BENIGN_DUPLICATES:
            self._duplicates[reason] = self._duplicates.get(reason, 0) + 1
            return
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _broadcast(self, message: Message, out: _Outbox) -> None:
        out.sends += [Send(to=peer, message=message) for peer in self._peers]

    # ------------------------------------------------------------------------------ intake

    def _tx_id(self, tx: Transaction) -> TxId:
        return transaction_id(tx, self._codec.encode)

    def _new_record(self, tx_id: TxId, tx: Transaction) -> TxRecord:
        request = ClientRequest(client_id=tx.client_id, request_no=tx.request_no,
                                command=self._codec.encode(tx), read_only=tx.read_only)
        return TxRecord(tx_id=tx_id, tx=tx, request=request, writes=self._app.writes(tx.command),
                        needs=self._app.needs_requirements(tx.command),
                        needs_base=self._app.needs_base(tx.command))

    def _on_submit(self, request: ClientRequest, out: _Outbox) -> None:
        tx = self._codec.decode(request.command)
        if tx is None:
            self._reject(request, "undecodable_submit", out)
            return
        if (tx.client_id != request.client_id or tx.request_no != request.request_no
                or tx.read_only != request.read_only):
            self._reject(request, "submit_mismatch", out)
            return
        tx_id = self._tx_id(tx)
        state = self._store.state_of(tx_id)
        if state is TxState.DROPPED:
            self._drop("submit_dropped")
            out.aborted.append(Abort(request=request, reason="transaction was dropped"))
            self._aborted += 1
            return
        record = self._store.get(tx_id)
        if record is not None:  # a client retry: peers may have lost it
            self._drop("duplicate_submit")
            if record.state is TxState.PENDING:
                self._broadcast(record.tx, out)
            return
        if state is not None:
            self._drop("duplicate_submit")  # committed and collected: the replica answers
            return
        if self._now is not None and tx.deadline_ms < self._now:
            self._reject(request, "submit_expired", out)
            return
        problem = self._accept_tx(tx_id, tx, out)
        if problem is not None:
            self._reject(request, problem, out)
            return
        self._broadcast(tx, out)

    def _reject(self, request: ClientRequest, reason: str, out: _Outbox) -> None:
        self._drop(reason)
        text = REASONS.get(reason, reason.replace("_", " "))
        out.rejected.append(Rejection(request=request, reason=text))

    def _accept_tx(self, tx_id: TxId, tx: Transaction, out: _Outbox) -> str | None:
        """Take a transaction into the store (from a client or a peer); the drop reason, or
        None when it was new and valid (then it was endorsed if the rules allow)."""
        if tx_id in self._store.records:
            return "duplicate_tx"
        if tx_id in self._store.tombstones:
            return "decided_tx"
        if tx.deadline_ms < self._store.horizon:
            return "stale_tx"
        problem = tx_problem(tx, self._client_keys)
        if problem is not None:
            return problem
        committed = len(self._gate.gated) + len(self._gate.released)
        if len(self._store.records) - committed >= self._config.max_pending:
            return "overloaded"
        record = self._new_record(tx_id, tx)
        buffered = self._store.add(record)
        self._kernel.learn(tx_id, tx)
        self._recovery.learned(tx_id)
        self._rules.invalidate()
        self._deadlines.push(record.deadline, tx_id)
        for endorsement in buffered.values():
            self._add_endorsement(record, endorsement, None, out)
        self._try_endorse(record, out)
        self._try_commit(record, out)
        if record.state is TxState.PENDING and not self._kernel.touched(tx_id):
            self._waiting[tx_id] = None
            lead = record.deadline - self._config.max_deadline_lead_ms
            if self._now is None or lead > self._now:  # endorsable from then on
                self._wakeups.push(lead, tx_id)
        return None

    def _on_receive(self, src: NodeId, msg: Message, out: _Outbox) -> None:
        if src not in self._config.nodes or src == self._config.node_id:
            self._drop("unknown_sender")
        elif isinstance(msg, Transaction):
            problem = self._accept_tx(self._tx_id(msg), msg, out)
            if problem is not None:
                self._drop(problem)
        elif isinstance(msg, Endorsement):
            self._on_endorsement(src, msg, out)
        elif isinstance(msg, Refusal):
            self._on_refusal(msg, out)
        elif isinstance(msg, TransactionProof):
            self._on_proof(src, msg, out)
        elif isinstance(msg, FetchTransactions):
            self._on_fetch(src, msg, out)
        elif isinstance(msg, CommittedDigest):
            out.sends += self._recovery.on_digest(src, msg.tx_ids, self._store, self._ticks)
        elif isinstance(msg, StartCheckpoint):
            self._checkpoints.on_start(src, msg, self._proof_of)
        elif isinstance(msg, VetoChoice):
            self._checkpoints.on_choice(src, msg, self._proof_of)
        elif isinstance(msg, VoteEcho):
            self._checkpoints.on_echo(src, msg, self._proof_of)
        elif isinstance(msg, VoteReady):
            self._checkpoints.on_ready(src, msg)
        else:
            self._drop("unknown_message")

    def _on_proof(self, src: NodeId | None, proof: TransactionProof, out: _Outbox) -> None:
        problem = self._accept_tx(self._tx_id(proof.tx), proof.tx, out)
        if problem not in (None, "duplicate_tx", "decided_tx"):
            self._drop(problem or "")
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
                            out: _Outbox) -> None:
        """A proof whose own endorsements make `record` committable commits it, even where
        an equivocating endorser's other endorsement was kept here (the record keeps one per
        endorser: without this, a node that kept the conditional one of an equivocator's
        two never commits what the others committed with the unconditional one). Counting
        either of a Byzantine endorser's endorsements is what a node that received that one
        first would do."""
        valid: dict[NodeId, Endorsement] = {}
        dropped = TxState.DROPPED
        for e in proof.endorsements:
            if (not isinstance(e, Endorsement) or e.tx_id != record.tx_id or e.endorser in valid
                    or not all(self._store.state_of(c) is dropped for c in e.conditions)):
                continue
            held = record.endorsements.get(e.endorser)
            if held == e or (e.endorser != self._config.node_id and endorsement_problem(
                    e, self._config.nodes, self._crypto) is None):
                valid[e.endorser] = e
        if (len(valid) < self._rules.quorum(record) or self._rules.committable(record)
                or self._checkpoints.blocked(record.tx_id)):
            return
        self._commit(record, tuple(valid[n] for n in sorted(valid)), out)

    def _on_endorsement(self, src: NodeId | None, e: Endorsement, out: _Outbox) -> None:
        if e.endorser == self._config.node_id:
            return  # our own, echoed back in a proof
        # Re-sends and fetched proofs repeat what is held: recognised before any signature
        # is verified (an equal endorsement is the one verified when it first arrived).
        record = self._store.get(e.tx_id)
        if record is not None:
            if record.endorsements.get(e.endorser) == e:
                self._drop("duplicate_endorsement")
                return
        elif self._store.decided(e.tx_id):
            self._drop("decided_endorsement")  # nothing about it can change any more
            return
        elif self._store.buffered.get(e.tx_id, {}).get(e.endorser) == e:
            self._drop("duplicate_endorsement")
            return
        problem = endorsement_problem(e, self._config.nodes, self._crypto)
        if problem is not None:
            self._drop(problem)
            return
        if record is None:
            if self._store.buffer(e) and src is not None:
                self._fetch(src, e.tx_id, out)
            return
        self._add_endorsement(record, e, src, out)

    def _add_endorsement(self, record: TxRecord, e: Endorsement, src: NodeId | None,
                         out: _Outbox) -> None:
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

    def _on_refusal(self, r: Refusal, out: _Outbox) -> None:
        if r.endorser == self._config.node_id:
            return  # our own, echoed back in a proof
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

    def _check_certificate(self, record: TxRecord, out: _Outbox) -> None:
        if record.state is not TxState.PENDING:
            return
        certificate = self._tally.certificate(record.tx_id)
        if certificate:
            self._recovery.aborted(record.tx_id, TransactionProof(
                tx=record.tx, refusals=tuple(sorted(certificate, key=lambda r: r.endorser))))
            self._drop_tx(record, "aborted: enough nodes refused it past its deadline", out)

    def _on_fetch(self, src: NodeId, msg: FetchTransactions, out: _Outbox) -> None:
        if len(msg.tx_ids) > MAX_FETCH_IDS:
            self._drop("oversized_fetch")
        out.sends += self._recovery.answer(src, msg.tx_ids, self._store, self._kernel)

    def _fetch(self, src: NodeId, tx_id: TxId, out: _Outbox) -> None:
        out.sends += self._recovery.fetch(src, (tx_id,), self._ticks)

    # ------------------------------------------------------------------------------ decide

    def _try_endorse(self, record: TxRecord, out: _Outbox) -> None:
        if (self._now is None or record.state is not TxState.PENDING
                or self._fence.active(self._now)):
            return
        endorsement = self._endorser.decide(record, self._now)
        if endorsement is None:
            return
        record.endorsements[endorsement.endorser] = endorsement
        self._rules.invalidate()
        out.signed = True
        self._broadcast(endorsement, out)
        self._resend_later(record.tx_id)
        self._try_commit(record, out)

    def _try_commit(self, record: TxRecord, out: _Outbox) -> None:
        if not self._rules.committable(record) or self._checkpoints.blocked(record.tx_id):
            return
        self._commit(record, tuple(sorted(self._rules.definitely_valid(record),
                                          key=lambda e: e.endorser)), out)

    def _commit(self, record: TxRecord, endorsements: tuple[Endorsement, ...],
                out: _Outbox) -> None:
        proof = TransactionProof(tx=record.tx, endorsements=endorsements)
        self._store.decide(record, TxState.COMMITTED)
        self._tally.forget(record.tx_id)
        self._gate.add(self._committed_item(record, proof))
        self._committed += 1
        self._recovery.committed(record.tx_id, self._ticks)
        self._rules.invalidate()
        self._wake = True
        out.dirty = True
        if "drop_on_commit" in self._bugs:
            for other in self._store.pending():
                if any(record.tx_id in e.conditions for e in other.endorsements.values()):
                    self._drop_tx(other, "dropped: a condition committed", out)

    def _committed_item(self, record: TxRecord, proof: TransactionProof) -> Committed:
        return Committed(tx_id=record.tx_id, proof=proof, request_command=record.request.command,
                         writes=record.writes)

    def _drop_tx(self, record: TxRecord, reason: str, out: _Outbox) -> None:
        self._store.decide(record, TxState.DROPPED)
        self._tally.forget(record.tx_id)
        self._dropped_txs += 1
        self._aborted += 1
        self._rules.invalidate()
        self._wake = True
        out.dirty = True
        out.aborted.append(Abort(request=record.request, reason=reason))
        for other in self._store.pending():  # conditions on it are now definitely valid
            if any(record.tx_id in e.conditions for e in other.endorsements.values()):
                self._try_commit(other, out)

    # ------------------------------------------------------------------------------ time

    def _on_tick(self, now: int | None, out: _Outbox) -> None:
        """Only what came due or changed: deadlines passed (`DueHeap`: refusals, and a
        wake-up of the waiting transactions, whose conflicts may now all be expired), the
        waiting transactions when something they depend on changed (an apply, a decision,
        the fence), the stuck check when the checkpoint batcher flushes; every period a
        full pass (endorse, commit) as a safety net, re-sends, GC."""
        self._ticks += 1
        if now is None:
            self._checkpoints.tick(self._proof_of)
            return
        self._now = now
        self._store.horizon = max(self._store.horizon, now - self._config.gc_horizon_ms)
        fenced = self._fence.active(now)
        if self._wakeups.pop_due(now + 1):
            self._wake = True
        for tx_id in self._deadlines.pop_due(now):
            record = self._store.get(tx_id)
            if record is not None and record.state is TxState.PENDING:
                self._wake = True
                self._expired[tx_id] = None
                if not self._kernel.touched(tx_id):
                    self._to_refuse[tx_id] = None
        if not fenced:
            for tx_id in self._to_refuse:
                record = self._store.get(tx_id)
                if (record is not None and record.state is TxState.PENDING
                        and not self._kernel.touched(tx_id)):
                    refusal = self._kernel.refuse(tx_id, record.tx)
                    out.signed = True
                    self._broadcast(refusal, out)
                    self._resend_later(tx_id)
                    self._tally.add(refusal)
                    self._check_certificate(record, out)
            self._to_refuse.clear()
        applied = self._app.applied()
        periodic = self._ticks % self._config.rebroadcast_ticks == 0
        if self._wake or periodic or applied != self._seen_applied or fenced != self._fenced:
            self._wake = False
            self._seen_applied, self._fenced = applied, fenced
            for tx_id in list(self._waiting):
                record = self._store.get(tx_id)
                if record is not None and record.state is TxState.PENDING:
                    self._try_endorse(record, out)
                if record is None or self._kernel.touched(tx_id) or record.state is not (
                        TxState.PENDING):
                    del self._waiting[tx_id]
        if periodic:
            for record in self._store.pending():
                self._try_commit(record, out)
        if self._ticks % self._config.checkpoint_ticks == 0:
            self._queue_stuck(now)  # the batcher flushes on this tick (`veto.py`)
        self._checkpoints.tick(self._proof_of)
        if periodic:
            self._rebroadcast(now, out)
        self._gc(now, periodic, out)

    def _resend_later(self, tx_id: TxId) -> None:
        """Schedule the next re-send of an own signature: one period, doubling to 8."""
        every = min(self._resend_every.get(tx_id, 0) * 2 or 1, 8)
        self._resend_every[tx_id] = every
        self._resends.push(self._ticks + every * self._config.rebroadcast_ticks, tx_id)

    def _rebroadcast(self, now: int, out: _Outbox) -> None:
        """Loss recovery (`recovery.py`): push own endorsements of transactions committed
        here in the last two periods and own signatures of still-pending ones (at a
        doubling backoff), pull what peers know of pending transactions past their
        deadline (a peer that committed one no longer pushes its endorsement), and send
        this period's `CommittedDigest`."""
        for tx_id in list(self._expired):
            if self._store.state_of(tx_id) is not TxState.PENDING:
                del self._expired[tx_id]
        overdue = tuple(self._expired)
        for i in range(0, len(overdue), MAX_FETCH_IDS):
            self._broadcast(FetchTransactions(tx_ids=overdue[i:i + MAX_FETCH_IDS]), out)
        out.sends += self._recovery.digest(self._ticks, self._gate.committed_ids())
        for tx_id in self._recovery.recent(self._ticks):
            own = self._kernel.endorsement(tx_id)
            if own is not None:
                self._broadcast(own, out)
        for tx_id in self._resends.pop_due(self._ticks + 1):
            if self._store.state_of(tx_id) is not TxState.PENDING:
                self._resend_every.pop(tx_id, None)
                continue
            signed: Message | None = self._kernel.endorsement(tx_id)
            if signed is None:
                signed = self._kernel.refusal(tx_id)
            if signed is not None:
                self._broadcast(signed, out)
                self._resend_later(tx_id)

    def _queue_stuck(self, now: int) -> None:
        for tx_id in self._rules.stuck(now - self._config.delta_old_ms):
            self._queue(tx_id)

    def _queue(self, tx_id: TxId) -> None:
        if tx_id not in self._queued:
            self._queued[tx_id] = None
            self._checkpoints.queue(tx_id)

    def _gc(self, now: int, full: bool, out: _Outbox) -> None:
        """Forget what lies beyond the horizon: every tick what came due in the store's
        deadline index; every period (`full`) also the own signatures and small tables
        whose transaction left the store some other way."""
        gone, stones = self._store.gc(now - self._config.gc_horizon_ms, keep=self._keep)
        if not (gone or stones or full):
            return
        for tx_id in gone:
            self._gate.collect(tx_id)
            self._tally.forget(tx_id)
        state_of = self._store.state_of
        for tx_id in gone + stones:
            if state_of(tx_id) is None:
                self._kernel.forget(tx_id)
        if full:
            for tx_id in self._kernel.endorsed_ids() + [r.tx_id for r in self._kernel.refusals()]:
                if state_of(tx_id) is None:
                    self._kernel.forget(tx_id)
            for tx_id in [t for t in self._queued if state_of(t) is None]:
                del self._queued[tx_id]
            self._recovery.gc(self._store)
            self._checkpoints.gc(lambda t: state_of(t) is not None)
        self._rules.invalidate()
        if gone or stones:
            out.dirty = True

    def _keep(self, record: TxRecord) -> bool:
        return record.state is TxState.COMMITTED and self._gate.unapplied(record.tx_id)

    # ------------------------------------------------------------------------------ veto

    def _unprovable(self, tx_id: TxId) -> bool:
        """Committed here without a proof (restored from the WAL after a restart): this
        node must never vote to drop it, and has no proof to veto with."""
        record = self._store.get(tx_id)
        return (record is not None and record.state is TxState.COMMITTED
                and self._gate.proof(tx_id) is None)

    def _proof_of(self, tx_id: TxId) -> TransactionProof | None:
        """A proof that `tx_id` is applicable here: its commit certificate when committed
        (every committed transaction has one: a checkpoint must never drop it), else all
        its endorsements when applicable."""
        certificate = self._gate.proof(tx_id)
        if certificate is not None:
            return certificate
        record = self._store.get(tx_id)
        if (record is None or record.state is not TxState.PENDING
                or not self._rules.applicable(tx_id)):
            return None
        return TransactionProof(tx=record.tx, endorsements=tuple(
            sorted(record.endorsements.values(), key=lambda e: e.endorser)))

    def _drain_checkpoints(self, out: _Outbox) -> None:
        effects = self._checkpoints.drain()
        if effects.sync:  # own votes and echo/ready choices are durable before they leave
            out.signed = True
        out.sends += effects.sends
        for tx_id in effects.dropped:
            record = self._store.get(tx_id)
            if record is not None and record.state is TxState.PENDING:
                self._drop_tx(record, "dropped by a checkpoint (veto procedure)", out)
            elif record is None and not self._store.decided(tx_id):
                self._store.drop_unknown(tx_id, self._now or 0)
                self._dropped_txs += 1
                out.dirty = True
            elif record is not None and record.state is TxState.COMMITTED:
                self._drop("checkpoint_dropped_committed")  # impossible with <= f faults
        for proof in effects.kept:
            self._on_proof(None, proof, out)
            record = self._store.get(self._tx_id(proof.tx))
            if record is not None:
                self._try_commit(record, out)
        if effects.dropped or effects.kept:  # a decision unblocks what its vote blocked
            self._wake = True
            for record in self._store.pending():
                self._try_commit(record, out)

    # ------------------------------------------------------------------------------ status

    def _drop_counts(self) -> dict[str, int]:
        counts = dict(self._dropped)
        for reason, count in self._checkpoints.dropped_counts().items():
            key = f"veto_{reason}"
            counts[key] = counts.get(key, 0) + count
        return counts

    def status(self) -> LeaderlessStatus:
        pending = sum(1 for r in self._store.records.values() if r.state is TxState.PENDING)
        return LeaderlessStatus(
            node=self._config.node_id, role="endorser", term=0,
            commit_index=self._gate.last_index, leader=None, dropped=self._drop_counts(),
            pending=pending, committed=self._committed, dropped_txs=self._dropped_txs,
            aborted=self._aborted, gated=len(self._gate.gated),
            recovering=self._fence.active(self._now),
            gc_horizon_ms=self._store.horizon, duplicate=dict(self._duplicates))

"""The leaderless conditional-endorsement core (PnyxDB, docs/LEADERLESS.md): a sans-IO
`phalanx.consensus.core.Core`.

Owns: dispatching inputs, intake of client input and new transactions (checks in
`checks.py`, drops counted by reason), endorse/commit/drop decisions, restore, the durable
record, and turning each step's outbox (`parts.Outbox`) into a `Ready`. Two mixins run on
this core's state: `intake.PeerIntake` (peer messages, fetches) and `ticks.TickWork`
(deadlines, re-sends, the stuck check, GC). State lives in the sub-machines:
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
from phalanx.consensus.leaderless.batching import EndorsementBatching, SubmitBatch
from phalanx.consensus.leaderless.bugs import check_bugs
from phalanx.consensus.leaderless.catch_up import TRANSFER_TYPES, CatchUp
from phalanx.consensus.leaderless.checks import ProofChecker, tx_problem
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.durable import RecordNotes
from phalanx.consensus.leaderless.endorse import Endorser
from phalanx.consensus.leaderless.endorsement_batch import VerifiedRoots
from phalanx.consensus.leaderless.fence import Fence
from phalanx.consensus.leaderless.intake import PeerIntake
from phalanx.consensus.leaderless.memory import Memory, with_bodies
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    LeaderlessDurableState,
    Transaction,
    TransactionProof,
    TxId,
    transaction_id,
)
from phalanx.consensus.leaderless.ordered_veto import OrderedCheckpoints
from phalanx.consensus.leaderless.parts import Outbox
from phalanx.consensus.leaderless.recovery import MAX_FETCH_IDS, Recovery
from phalanx.consensus.leaderless.refetch import OverdueFetch
from phalanx.consensus.leaderless.refusals import RefusalTally
from phalanx.consensus.leaderless.release import Committed, ReleaseGate
from phalanx.consensus.leaderless.restore import RestoreFromRecord
from phalanx.consensus.leaderless.rules import Rules
from phalanx.consensus.leaderless.safety import SafetyKernel
from phalanx.consensus.leaderless.schedule import DueHeap
from phalanx.consensus.leaderless.state_transfer import CheckpointFormat
from phalanx.consensus.leaderless.status import (
    BENIGN_DUPLICATES,
    INVALID_SUBMITS,
    REASONS,
    LeaderlessStatus,
    StuckReport,
    stuck_report,
)
from phalanx.consensus.leaderless.store import TxRecord, TxState, TxStore
from phalanx.consensus.leaderless.ticks import TickWork
from phalanx.consensus.leaderless.tx_codec import TxCodec, TxIds
from phalanx.consensus.leaderless.veto import CheckpointMachine
from phalanx.consensus.types import ClientRequest, Entry, Message, NodeId

__all__ = ["MAX_FETCH_IDS", "LeaderlessCore", "LeaderlessStatus"]

TX_ID_CACHE = 4096
"""Transactions whose ids `LeaderlessCore._tx_id` remembers (oldest out first)."""


class LeaderlessCore(PeerIntake, TickWork, CatchUp, EndorsementBatching, RestoreFromRecord):
    """One node of the leaderless protocol (see the module docstring)."""

    def __init__(self, config: LeaderlessConfig, *, crypto: Crypto, client_keys: Verifier,
                 app: AppView, codec: TxCodec, restored: LeaderlessDurableState | None = None,
                 bugs: frozenset[str] = frozenset(), recovering: bool = False,
                 restored_entries: Sequence[Entry] = (),
                 checkpoint_format: CheckpointFormat | None = None,
                 growth_notes: bool = False) -> None:
        """`recovering`: this node lost its durable record (amnesia): it starts fenced
        (`fence.py`), signing nothing until the fence's end. `restored_entries`: the WAL
        after the replica's checkpoint (`DurableState.entries`): every one is committed; those
        beyond `app.applied()` go out again in the first Ready's `committed`.
        `checkpoint_format`: how to read the replica's checkpoints; with it the node serves
        and fetches checkpoints (state transfer, `catch_up.py`), without it neither.
        `growth_notes`: for a delta journal (`durable.py` "Growth notes")."""
        self._config = config
        self._crypto = crypto
        self._client_keys = client_keys
        self._app = app
        self._codec = codec
        self._ids: dict[Transaction, TxId] = {}
        self._ids_of = codec if isinstance(codec, TxIds) else None  # once: a runtime Protocol
        self._notes = RecordNotes() if growth_notes else None
        self._bugs = check_bugs(bugs)
        self._peers = config.peers()
        self._store = TxStore(max_buffered=config.max_pending)
        self._store.forget_undecided = "forget_undecided" in self._bugs
        self._rules = Rules(self._store, config.quorum_for)
        self._gate = ReleaseGate(app, start_index=app.applied(),
                                 no_gate="no_version_gate" in self._bugs)
        self._tally = RefusalTally(n=config.n, f=config.faults, quorum=config.quorum)
        self._roots = VerifiedRoots()
        self._verify_proof = ProofChecker(
            nodes=config.nodes, crypto=crypto, client_keys=client_keys,
            quorum_for=config.quorum_for, tx_id=self._tx_id, roots=self._roots)
        self._checkpoints: CheckpointMachine | OrderedCheckpoints
        if config.stuck_resolution == "pbft":  # docs/LEADERLESS.md "Ordered resolution"
            self._checkpoints = OrderedCheckpoints(
                config=config, crypto=crypto, client_keys=client_keys,
                codec=codec,  # type: ignore[arg-type]  # checked: encode_item/decode_item
                tx_id_of=self._tx_id, evidence_of=self._evidence_of,
                restored=restored.ordering if restored is not None else None,
                one_close="ordered_one_close" in self._bugs,
                drop_ambiguous="ordered_drop_ambiguous" in self._bugs,
                decided_once="ordered_decided_once" in self._bugs)
        else:
            record = restored or LeaderlessDurableState()
            self._checkpoints = CheckpointMachine(
                node_id=config.node_id, nodes=config.nodes, crypto=crypto,
                checkpoint_ticks=config.checkpoint_ticks, batch=config.checkpoint_batch,
                verify_proof=self._verify_proof, faults=config.faults,
                restored_votes=record.votes, restored_relays=record.relays,
                restored_decisions=record.veto_decisions or (),
                tx_id_of=self._tx_id, vote_batch_ticks=config.vote_batch_ticks,
                decided_once="veto_decided_once" in self._bugs,
                no_rounds="veto_no_rounds" in self._bugs)
        self._checkpoints.unprovable = self._unprovable
        self._memory = Memory(limit=config.max_pending)
        self._memory.drop_forgotten = "drop_forgotten" in self._bugs
        self._dropped: dict[str, int] = {}
        self._duplicates: dict[str, int] = {}
        self._queued: dict[TxId, None] = {}
        self._recovery = Recovery(peers=self._peers, members=config.nodes,
                                  every=config.rebroadcast_ticks, max_entries=config.max_pending,
                                  named_delay=config.named_fetch_delay_ticks,
                                  offset=config.nodes.index(config.node_id))
        self._refetch = OverdueFetch(peers=self._peers, every=config.rebroadcast_ticks,
                                     max_entries=config.max_pending,
                                     offset=config.nodes.index(config.node_id))
        self._now: int | None = None
        self._ticks = 0
        self._number = 0
        self._committed = 0
        self._dropped_txs = 0
        self._aborted = 0
        self._restart: list[Committed] = []
        self._replay: list[Entry] = []
        self._sync_numbers: list[int] = []  # `must_sync` Readys not yet `Persisted`
        self._synced_ready = 0  # the newest `must_sync` Ready known durable (WAL fsynced)
        self._deadlines = DueHeap()  # pending transactions by deadline
        self._wakeups = DueHeap()  # far-future deadlines, by when they come within the lead
        self._resends = DueHeap()  # own signatures of pending transactions, by re-send tick
        self._resend_every: dict[TxId, int] = {}
        self._expired: dict[TxId, None] = {}  # pending: past deadline, or committed at a peer
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
        self._drain_cascades = self._checkpoints.old_unblock = "cascade_in_drain" in self._bugs
        if restored is not None or restored_entries:
            self._restore(restored or LeaderlessDurableState(), known, restored_entries)
        self._init_transfer(checkpoint_format, restored=restored, recovering=recovering)

    @property
    def node_id(self) -> NodeId:
        return self._config.node_id

    # ------------------------------------------------------------------------------ step

    def step(self, inp: Input | SubmitBatch, /) -> Ready:
        out = Outbox()
        if self._replay:
            out.replayed, self._replay = self._replay, []
        if self._restart:
            out.entries += [self._gate.release_now(item) for item in self._restart]
            self._restart = []
        if isinstance(inp, Receive):
            self._heard(inp.src)
            if isinstance(inp.message, TRANSFER_TYPES):
                self._on_transfer(inp.src, inp.message, out)
            else:
                self._on_receive(inp.src, inp.message, out)
        elif isinstance(inp, Tick):
            if inp.now_ms is not None and self._fence.on_clock(inp.now_ms):
                out.dirty = True  # the fence's end is part of the record
            self._checkpoints.fenced = self._fence.active(inp.now_ms)
            self._on_tick(inp.now_ms, out)
            self._transfer_tick(inp.now_ms, out)
        elif isinstance(inp, Submit):
            self._on_submit(inp.request, out)
        elif isinstance(inp, SubmitBatch):
            for request in inp.requests:
                self._on_submit(request, out)
        elif isinstance(inp, Persisted):
            self._on_persisted(inp.number)
        elif isinstance(inp, CheckpointTaken):
            if self._transfer is not None:
                self._transfer.taken(inp.data, inp.index)  # served to peers that catch up
        elif isinstance(inp, CheckpointInstalled):
            pass  # the app view reads checkpoints
        else:
            assert_never(inp)
        self._seal(out)  # this step's endorsements, under one signature
        self._drain_checkpoints(out)
        self._seal(out)  # ... and those a veto decision caused
        if out.snapshot is None:  # after an install, the gate judges the installed state
            out.entries += self._gate.release()
        if out.entries:
            out.dirty = True
        return self._ready(out)

    def _on_persisted(self, number: int) -> None:
        """Own signatures count at once (see safety.py). Releases covered by a fsynced
        `Persisted` are known durable in the WAL (`ReleaseGate.mark_synced`), but their
        proofs stay in the record until GC: dropping them there lost commits in the
        simulator's restart sweep (seed 10; docs/LEADERLESS.md "The hot path"). GC takes a
        proof out only once such a `Persisted` covered its release (`_synced_ready`)."""
        while self._sync_numbers and self._sync_numbers[0] <= number:
            self._synced_ready = self._sync_numbers.pop(0)  # the WAL up to it is fsynced
        self._checkpoints.persisted(number)

    def _ready(self, out: Outbox) -> Ready:
        core_state = self.durable_state() if (out.dirty or out.signed) else None
        if core_state is not None and self._notes is not None:  # durable.py "Growth notes"
            self._notes.note(core_state, (self._kernel, self._gate, self._store))
        number = 0
        if core_state is not None or out.entries or out.snapshot is not None:
            self._number += 1
            number = self._number
            self._gate.stamp(number)
            self._checkpoints.stamp(number)
            if out.signed:
                self._sync_numbers.append(number)
        entries = tuple(out.entries)
        committed = tuple(out.replayed) + entries if out.replayed else entries
        return Ready(number=number, entries=entries, committed=committed, core_state=core_state,
                     snapshot=out.snapshot, must_sync=out.signed, messages=tuple(out.sends),
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
            relays=self._checkpoints.relays(), ordering=self._checkpoints.record(),
            veto_decisions=self._checkpoints.veto_decisions() or None)

    def _drop(self, reason: str) -> None:
        if reason in BENIGN_DUPLICATES:
            self._duplicates[reason] = self._duplicates.get(reason, 0) + 1
            return
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _broadcast(self, message: Message, out: Outbox) -> None:
        out.sends += [Send(to=peer, message=message) for peer in self._peers]

    # ------------------------------------------------------------------------------ intake

    def _tx_id(self, tx: Transaction) -> TxId:
        """`transaction_id`, cached by value: a node receives each transaction from its
        client and from every peer, and fetched proofs repeat it (an encode and a SHA-256
        each time otherwise)."""
        cache = self._ids
        found = cache.get(tx)
        if found is None:
            ids = self._ids_of
            found = (ids.transaction_id(tx) if ids is not None
                     else transaction_id(tx, self._codec.encode))
            if len(cache) >= TX_ID_CACHE:
                del cache[next(iter(cache))]
            cache[tx] = found
        return found

    def _new_record(self, tx_id: TxId, tx: Transaction) -> TxRecord:
        request = ClientRequest(client_id=tx.client_id, request_no=tx.request_no,
                                command=self._codec.encode(tx), read_only=tx.read_only)
        keys = self._app.keys(tx.command)
        if keys is not None:
            keys = tuple(sorted({*keys, *(r.key for r in tx.requirements if not r.base)}))
        return TxRecord(tx_id=tx_id, tx=tx, request=request, writes=self._app.writes(tx.command),
                        needs=self._app.needs_requirements(tx.command),
                        needs_base=self._app.needs_base(tx.command), keys=keys)

    def _on_submit(self, request: ClientRequest, out: Outbox) -> None:
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
        if self._store.pending_of(tx.client) >= self._config.max_pending_per_client:
            self._reject(request, "client_overloaded", out)  # others still get in
            return
        problem = self._accept_tx(tx_id, tx, out)
        if problem is not None:
            self._reject(request, problem, out)
        elif not self._kernel.touched(tx_id):
            self._broadcast(tx, out)  # not endorsed here (yet): peers must judge it too
        # An endorsed one is not relayed: the client sends it to every node, and a node it
        # missed learns it from the endorsements that name it (buffered, then fetched).

    def _reject(self, request: ClientRequest, reason: str, out: Outbox) -> None:
        self._drop(reason)
        text = REASONS.get(reason, reason.replace("_", " "))
        out.rejected.append(Rejection(request=request, reason=text,
                                      invalid=reason in INVALID_SUBMITS))

    def _accept_tx(self, tx_id: TxId, tx: Transaction, out: Outbox) -> str | None:
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

    # ------------------------------------------------------------------------------ decide

    def _try_endorse(self, record: TxRecord, out: Outbox) -> None:
        if (self._now is None or record.state is not TxState.PENDING
                or self._fence.active(self._now) or self._checkpoints.blocked(record.tx_id)):
            return  # blocked: its vote showed what it held (docs "Ordered resolution")
        if self._endorser.decide(record, self._now) is None:
            return
        out.signed = True
        self._resend_later(record.tx_id)  # signed, sent and counted by `_seal`

    def _try_commit(self, record: TxRecord, out: Outbox) -> None:
        if not self._rules.committable(record) or self._checkpoints.blocked(record.tx_id):
            return
        self._commit(record, tuple(sorted(self._rules.definitely_valid(record),
                                          key=lambda e: e.endorser)), out)

    def _commit(self, record: TxRecord, endorsements: tuple[Endorsement, ...],
                out: Outbox) -> None:
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
                         writes=record.writes, keys=record.keys)

    def _drop_tx(self, record: TxRecord, reason: str, out: Outbox, cascade: bool = True) -> None:
        self._store.decide(record, TxState.DROPPED)
        self._tally.forget(record.tx_id)
        self._dropped_txs += 1
        self._aborted += 1
        self._rules.invalidate()
        self._wake = True
        out.dirty = True
        out.aborted.append(Abort(request=record.request, reason=reason))
        for other in self._store.pending() if cascade else ():  # its dependents may commit
            if any(record.tx_id in e.conditions for e in other.endorsements.values()):
                self._try_commit(other, out)

    # ------------------------------------------------------------------------------ veto

    def _unprovable(self, tx_id: TxId) -> bool:
        """This node must not vote to drop `tx_id` and has no proof to veto with: committed
        here without one (restored from the WAL, or an installed checkpoint's tombstone),
        or held nothing of and possibly committed and forgotten (`memory.py`)."""
        state = self._store.state_of(tx_id)
        if state is None:
            return not self._memory.covers(tx_id, self._store.horizon)
        return state is TxState.COMMITTED and self._gate.proof(tx_id) is None

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

    def _evidence_of(self, tx_id: TxId) -> TransactionProof | None:
        """An ordered vote's evidence (`ordered_veto.py`): the commit certificate of `tx_id`
        when committed here, else its endorsements held here but the dead ones (a condition
        committed here: never definitely valid anywhere; LEADERLESS.md "Kept, then stuck")."""
        record = self._store.get(tx_id)
        if (certificate := self._gate.proof(tx_id)) is not None or record is None:
            return certificate
        dead_too = "ordered_dead_evidence" in self._bugs  # the deliberate bug (bugs.py)
        live = sorted((e for e in record.endorsements.values() if dead_too or not any(
            self._store.state_of(c) is TxState.COMMITTED for c in e.conditions)),
            key=lambda e: e.endorser)
        return TransactionProof(tx=record.tx, endorsements=tuple(live)) if live else None

    def _drain_checkpoints(self, out: Outbox) -> None:
        effects = self._checkpoints.drain()
        out.signed |= effects.sync  # own votes, echo/ready choices, decisions: synced first
        out.sends += with_bodies(effects.sends, lambda t: (  # else the kernel's (docs "Bodies")
            self._kernel.transaction(t) if (record := self._store.get(t)) is None else record.tx))
        for tx_id in effects.dropped:  # all dropped before any dependent commits (docs "DROP
            record = self._store.get(tx_id)  # meets a commit in one drain"): cascade below
            if record is not None and record.state is TxState.PENDING:
                self._drop_tx(record, "dropped by a checkpoint (veto procedure)", out,
                              self._drain_cascades)  # (False but with `cascade_in_drain`)
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

    def stuck(self, before_ms: int) -> StuckReport:
        """Which pending transactions with a deadline at or before `before_ms` wait, and on
        what (`status.stuck_report`): the simulator's inspection; reads only."""
        veto = self._checkpoints
        return stuck_report(
            self._store.pending(), before_ms=before_ms, horizon=self._store.horizon,
            state_of=self._store.state_of, voters=tuple(sorted(self._config.nodes)),
            undecided=veto.undecided() if isinstance(veto, CheckpointMachine) else {},
            node=self._config.node_id)

    def status(self) -> LeaderlessStatus:
        return LeaderlessStatus(
            node=self._config.node_id, role="endorser", term=0,
            commit_index=self._gate.last_index, leader=None, dropped=self._drop_counts(),
            pending=self._store.pending_count(), committed=self._committed,
            oldest_pending_ms=min((r.deadline for r in self._store.pending()), default=0),
            dropped_txs=self._dropped_txs, aborted=self._aborted, gated=len(self._gate.gated),
            skipped_reads=self._gate.skip_count,
            recovering=self._fence.active(self._now),
            gc_horizon_ms=self._store.horizon, duplicate=dict(self._duplicates),
            installs=self._transfer.installs if self._transfer is not None else 0,
            catching_up=self._transfer.reason if self._transfer is not None else "",
            behind_checkpoints=self._behind + (
                self._transfer.refused_lacking if self._transfer is not None else 0))

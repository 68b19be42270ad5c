"""State transfer inside `LeaderlessCore` (a mixin over the core's state: see `parts.py`):
when to ask for a checkpoint, routing the transfer messages to `state_transfer.StateTransfer`,
and installing a verified checkpoint (docs/LEADERLESS.md "State transfer").

When a node wants one (`StateTransfer.want`; each only with a `CheckpointFormat`):
- it lost its record (amnesia) or restarted after being down longer than the GC horizon
  (its record's horizon is more than `gc_horizon_ms` behind its clock's);
- it heard from no peer for longer than the GC horizon (a message arrives after the gap; a
  node that heard nothing for a period asks one peer for its checkpoint descriptor, so
  even a quiet cluster answers);
- a committed transaction waited at the version gate past the GC horizon (what it waits
  for can no longer be fetched from anyone);
- a transaction is still undecided here past the GC horizon (`_ask_for_overdue`, with
  backoff): only its committers' checkpoints may still say it committed;
- a peer's proof of a transaction this node holds nothing of arrives past its GC horizon
  (`stale_tx`) with Q valid endorsements that are definitely valid here (unconditional, or
  every condition dropped here: the commit rule's count; those this node buffered while
  the transaction was unknown count with the proof's, which leaves them out:
  `FetchTransactions.held`; `_stale_certified`, with backoff): it committed, and no fetch
  can bring it here any more (a cut or a clock offset that, with the catch-up's delay,
  outlasted the horizon; or a late commit, once the veto procedure dropped its conditions
  past every horizon).

Serving: a node vouches for a retained checkpoint while what it applied after it is still
fetchable (`_vouch`), GC keeps that suffix (`_retained_suffix`), and the last chunk of a
fetch is followed by this node's `CommittedDigest` (the installer fetches the suffix at once).

Install rule: a verified checkpoint (f+1 matching descriptors, bytes hashing to them) goes
in. A writing transaction this node released (applied) and still holds that its table lacks
goes back to the gate (`ReleaseGate.regate`) and is applied again after the install, on the
installed state: the install does not undo it. (Until 2026-12-02 such a checkpoint was
refused and a newer one awaited; a node catching up under load applies new commits faster
than any checkpoint its peers offer covers them, so it refused every one: a livelock,
docs/LEADERLESS.md "State transfer".) A lacking one restored from the WAL without its proof
cannot be released again: then the checkpoint is still refused. One lacking an apply
the core no longer holds (`_forgotten`: the replica's table minus the gate's releases) was
already refused by `StateTransfer` (the coverage rule). Then: `Ready.snapshot`
at the next local index (rebased there), the gate releases nothing until the driver
installed it, gated transactions the checkpoint holds count as released there, and every
transaction in its table becomes decided (committed) here, so it is never endorsed,
released nor applied again (exactly-once, with the replica's transaction table inside the
checkpoint). The rest (committed after the checkpoint) comes by the fetch path.

Must not import: trio, sockets, clocks, global random, `phalanx.net`, `phalanx.apps`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.consensus.core import Send, Snapshot
from phalanx.consensus.leaderless.checks import endorsement_problem
from phalanx.consensus.leaderless.messages import (
    CommittedDigest,
    DecidedTx,
    Endorsement,
    TransactionProof,
    TxId,
)
from phalanx.consensus.leaderless.parts import CoreParts, Outbox
from phalanx.consensus.leaderless.recovery import MAX_DIGEST_IDS
from phalanx.consensus.leaderless.state_transfer import StateTransfer, Verified
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.transfer_messages import (
    CheckpointChunk,
    CheckpointDescriptor,
    CheckpointDescriptors,
    CheckpointQuery,
    FetchCheckpoint,
)
from phalanx.consensus.types import Configuration, Message, NodeId, SnapshotMeta

if TYPE_CHECKING:
    from phalanx.consensus.leaderless.messages import LeaderlessDurableState
    from phalanx.consensus.leaderless.state_transfer import CheckpointFormat

TRANSFER_TYPES = (CheckpointQuery, CheckpointDescriptor, CheckpointDescriptors, FetchCheckpoint,
                  CheckpointChunk)

MAX_SUFFIX = MAX_DIGEST_IDS // 2
"""A retained checkpoint is vouched for only while at most this many entries were applied
after it (the peers' `CommittedDigest`s, capped at `MAX_DIGEST_IDS`, must name them all)."""


OVERDUE_MAX = 256
"""At most this many periods (`rebroadcast_ticks`) between two state-transfer asks for a
transaction still undecided past the GC horizon (`CatchUp._ask_for_overdue`)."""


class CatchUp(CoreParts):
    """The state-transfer handling of `LeaderlessCore`."""

    if TYPE_CHECKING:
        _transfer: StateTransfer | None
        _format: CheckpointFormat | None
        _last_heard_ms: int | None
        _restored_horizon: int | None
        _behind: int
        _heard_tick: int
        _refuse_behind: bool
        _peers: tuple[NodeId, ...]
        _bugs: frozenset[str]

    def _init_transfer(self, fmt: CheckpointFormat | None, *,
                       restored: LeaderlessDurableState | None, recovering: bool) -> None:
        """The state-transfer part of the core's constructor: with `fmt` the node serves
        and fetches checkpoints; an amnesiac node (`recovering`) asks at once."""
        if "no_state_transfer" in self._bugs:
            fmt = None
        self._format = fmt
        self._transfer = None if fmt is None else StateTransfer(
            fmt=fmt, peers=self._peers, faults=self._config.faults,
            every=self._config.rebroadcast_ticks, drop=self._drop,
            check_digest="skip_checkpoint_digest" not in self._bugs,
            forgotten=self._forgotten)
        self._last_heard_ms = None
        self._heard_tick = 0
        self._restored_horizon = restored.gc_horizon_ms if restored is not None else None
        self._behind = 0
        self._refuse_behind = "refuse_behind_checkpoint" in self._bugs
        self._overdue: dict[TxId, None] = {}
        self._overdue_next = 0  # the tick from which an overdue id may ask again
        self._overdue_backoff = 1  # periods until the next ask (doubles to OVERDUE_MAX)
        self._stale_next = 0  # the tick from which a certified stale proof may ask again
        self._stale_backoff = 1  # periods until then (doubles to OVERDUE_MAX)
        if self._transfer is not None and recovering:
            self._transfer.want("lost its durable record")

    def _forgotten(self, max_deadline_ms: int) -> list[bytes]:
        """The coverage rule's input (`StateTransfer`, docs/LEADERLESS.md "An install never
        undoes a forgotten apply"): the transactions this node's replica applied that a
        checkpoint whose newest deadline is `max_deadline_ms` must record if its replica
        applied them, and that the core no longer holds (GC collected the release): the
        install rule could not apply them again. Those still held are the install rule's
        (applied again after the install, or the checkpoint refused)."""
        if "install_over_forgotten" in self._bugs:
            return []  # the deliberate bug (bugs.py): the rule before 2026-12-02 evening
        released = self._gate.released
        return [t for t in self._app.applied_within(max_deadline_ms) if t not in released]

    def _heard(self, src: NodeId) -> None:
        """A message from peer `src` arrived: after a silence longer than the GC horizon,
        this node may have missed transactions no peer can send any more. (Also: `src`
        is reachable, for the pull of overdue transactions, `refetch.py`.)"""
        self._refetch.heard(src, self._ticks)
        now, transfer = self._now, self._transfer
        if now is None or transfer is None or src not in self._config.nodes:
            return
        last = self._last_heard_ms
        if last is not None and now - last > self._config.gc_horizon_ms:
            transfer.want("cut off past the GC horizon")
        self._last_heard_ms = now
        self._heard_tick = self._ticks

    def _transfer_tick(self, now: int | None, out: Outbox) -> None:
        transfer = self._transfer
        if transfer is None:
            self._store.overdue.clear()  # nobody to ask
            return
        horizon = self._config.gc_horizon_ms
        if now is not None and self._restored_horizon is not None:
            if now - horizon - self._restored_horizon > horizon:
                transfer.want("down past the GC horizon")
            self._restored_horizon = None
        if (now is not None and self._ticks % self._config.rebroadcast_ticks == 0
                and any(item.proof is not None and item.proof.tx.deadline_ms < now - horizon
                        for item in self._gate.gated.values())):
            transfer.want("gated past the GC horizon")
        self._ask_for_overdue(transfer)
        every = self._config.rebroadcast_ticks
        if self._ticks % every == 0 and self._ticks - self._heard_tick >= every and self._peers:
            # Nothing heard for a period: ask one peer (round-robin) for its checkpoint. Its
            # answer ends the silence, and a silence past the horizon is noticed (a quiet
            # cluster sends nothing else: no commits, no digests).
            peer = self._peers[(self._ticks // every) % len(self._peers)]
            out.sends.append(Send(to=peer, message=CheckpointQuery()))
        out.sends += transfer.tick()

    def _ask_for_overdue(self, transfer: StateTransfer) -> None:
        """A transaction still pending here past the GC horizon may have committed at nodes
        that applied it and then collected its certificate: no proof of it is left, only
        their replicas' transaction tables, which their checkpoints carry. Ask for state
        transfer (an installed table holding it decides it committed here, `_install`), then
        again after 1, 2, 4 ... `OVERDUE_MAX` periods while one stays pending (a checkpoint
        covering it may appear later: its committers down, or cut off)."""
        store = self._store
        if store.overdue:
            if "no_overdue_transfer" not in self._bugs:  # the deliberate bug (bugs.py)
                self._overdue.update(dict.fromkeys(store.overdue))
            store.overdue.clear()
        if not self._overdue or self._ticks < self._overdue_next:
            return
        for tx_id in [t for t in self._overdue if store.state_of(t) is not TxState.PENDING]:
            del self._overdue[tx_id]
        if not self._overdue:
            self._overdue_backoff = 1
            return
        transfer.want("undecided past the GC horizon")
        self._overdue_next = self._ticks + self._overdue_backoff * self._config.rebroadcast_ticks
        self._overdue_backoff = min(OVERDUE_MAX, 2 * self._overdue_backoff)

    def _stale_certified(self, proof: TransactionProof) -> None:
        """`proof` names a transaction past this node's GC horizon that it holds nothing of
        but buffered endorsements (`stale_tx`, counted by the caller). With Q valid
        endorsements definitely valid here, the proof's and the buffered ones (unconditional,
        or conditioned only on transactions dropped here, as the commit rule counts them: a
        transaction committed late, after a veto dropped its conditions past every horizon,
        carries such a proof; 1 s-horizon seed 33) it committed at some correct node, and
        this node missed it for good by fetching (every later proof of it is stale here too):
        only a checkpoint can bring it. Ask for state transfer, at most once per 1, 2, 4 ...
        `OVERDUE_MAX` periods (an old proof replayed by a Byzantine peer costs a descriptor
        round, no more); the backoff starts over after `OVERDUE_MAX` periods without one.
        The proof's signatures are checked only when an ask is due. Safety is the install
        rule's (f + 1 descriptors, the coverage rule)."""
        transfer = self._transfer
        every = self._config.rebroadcast_ticks
        if transfer is None or "no_stale_transfer" in self._bugs:  # the deliberate bug
            return
        if self._ticks < self._stale_next:
            return
        if self._ticks >= self._stale_next + OVERDUE_MAX * every:
            self._stale_backoff = 1
        tx_id = self._tx_id(proof.tx)
        nodes = self._config.nodes
        signers: dict[NodeId, None] = {}
        dropped = TxState.DROPPED
        state_of = self._store.state_of
        # An answer leaves out what this node said it holds, and a named fetch asks for the
        # body alone (`FetchTransactions.held`): the endorsements buffered here while the
        # transaction was unknown (verified on arrival) count with the proof's, as the whole
        # proof would have carried them (1 s-horizon seed 31; docs/LEADERLESS.md "Answers
        # by what the asker holds").
        for endorser, e in self._store.buffered.get(tx_id, {}).items():
            if all(state_of(c) is dropped for c in e.conditions):
                signers[endorser] = None
        for e in proof.endorsements:
            if (isinstance(e, Endorsement) and e.tx_id == tx_id and e.endorser not in signers
                    and all(state_of(c) is dropped for c in e.conditions)
                    and endorsement_problem(e, nodes, self._crypto, self._roots) is None):
                signers[e.endorser] = None
        if len(signers) < self._config.quorum_for(proof.tx.policy):
            return
        transfer.want("a certified transaction past the GC horizon")
        self._stale_next = self._ticks + self._stale_backoff * every
        self._stale_backoff = min(OVERDUE_MAX, 2 * self._stale_backoff)

    def _on_transfer(self, src: NodeId, msg: Message, out: Outbox) -> None:
        transfer = self._transfer
        if src not in self._config.nodes or src == self._config.node_id:
            self._drop("unknown_sender")
        elif transfer is None:
            self._drop("no_state_transfer")
        elif isinstance(msg, CheckpointQuery):
            out.sends += transfer.on_query(src, self._vouch)
        elif isinstance(msg, CheckpointDescriptor | CheckpointDescriptors):
            out.sends += transfer.on_descriptor(src, msg)
        elif isinstance(msg, FetchCheckpoint):
            sends = transfer.on_fetch(src, msg)
            out.sends += sends
            last = sends[-1].message if sends else None
            if (isinstance(last, CheckpointChunk) and last.data
                    and transfer.is_last_chunk(last)):
                # With the last chunk: what this node committed, so the installer fetches
                # the suffix at once (not at the next round-robin digest).
                ids = self._gate.committed_ids()[-MAX_DIGEST_IDS:]
                if ids:
                    out.sends.append(Send(to=src, message=CommittedDigest(
                        tx_ids=tuple(sorted(ids)))))
        elif isinstance(msg, CheckpointChunk):
            sends, verified = transfer.on_chunk(src, msg)
            out.sends += sends
            if verified is not None:
                self._install(transfer, verified, out)

    def _vouch(self, index: int) -> bool:
        """Whether this node vouches for its checkpoint of the state after local `index`:
        it is the current state, or every entry applied after it (at most `MAX_SUFFIX`) is
        a release this node still holds with its proof and record (`recovery.answer` serves
        it; `_retained_suffix` keeps it from GC) whose deadline is within the GC horizon
        (peers still accept it). Then whatever a correct voucher applied after the
        checkpoint can still be fetched by the node that installs it (the server pushes its
        `CommittedDigest` with the last chunk; completeness and its one race:
        docs/LEADERLESS.md "State transfer")."""
        applied = self._app.applied()
        if index == applied:
            return True
        now = self._now
        if now is None or not 0 < applied - index <= MAX_SUFFIX:
            return False
        keep_until = now - self._config.gc_horizon_ms
        after = 0
        for tx_id, item in reversed(self._gate.released.items()):
            if item.index <= index:
                break
            if item.index > applied:
                continue
            record = self._store.get(tx_id)
            if item.proof is None or record is None or record.deadline < keep_until:
                return False
            after += 1
        return after == applied - index

    def _retained_suffix(self, tx_id: TxId) -> bool:
        """`tx_id` was applied after the oldest checkpoint this node retains, at most
        `MAX_SUFFIX` entries ago: GC keeps its record and proof past the horizon (that
        checkpoint's suffix stays servable while it is retained)."""
        transfer = self._transfer
        floor = transfer.floor() if transfer is not None else None
        if floor is None or self._app.applied() - floor > MAX_SUFFIX:
            return False
        item = self._gate.released.get(tx_id)
        return item is not None and item.index > floor

    def _install(self, transfer: StateTransfer, got: Verified, out: Outbox) -> None:
        fmt = self._format
        assert fmt is not None  # a transfer exists only with a format
        lacking = [t for t, item in self._gate.released.items()
                   if item.writes and t not in got.applied]
        if lacking and (self._refuse_behind or any(
                self._gate.released[t].proof is None for t in lacking)):
            self._behind += 1  # it would undo an apply it cannot redo: wait for a newer one
            transfer.refuse()
            return
        index = self._gate.last_index + 1
        data = fmt.rebase(got.data, index)
        if data is None:  # verified bytes always parse; a broken format is our bug
            raise AssertionError("CheckpointFormat.rebase refused a verified checkpoint")
        out.snapshot = Snapshot(meta=SnapshotMeta(
            index=index, term=0, config=Configuration(voters=self._config.nodes)), data=data)
        self._gate.installed(index, got.applied)
        self._gate.regate(lacking)  # applied here, not there: applied again after it
        store = self._store
        for tx_id, deadline in got.applied.items():
            record = store.get(tx_id)
            if record is not None:
                if record.state is TxState.PENDING:
                    store.decide(record, TxState.COMMITTED)
                    self._tally.forget(tx_id)
                    self._waiting.pop(tx_id, None)
            elif tx_id not in store.tombstones and deadline >= store.horizon:
                store.tombstones[tx_id] = DecidedTx(tx_id=tx_id, deadline_ms=deadline,
                                                    committed=True)
                store.index(tx_id, deadline)
                store.stones_changed()
        self._rules.invalidate()
        self._wake = True
        out.dirty = True
        transfer.installs += 1
        transfer.done()

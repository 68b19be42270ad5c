"""Per-tick work of `LeaderlessCore` (a mixin over the core's state: see `parts.py`):
refusals past a deadline, re-checks of waiting transactions, the stuck check that feeds
the checkpoint batcher, loss recovery (re-sends, pulls, the committed digest) and GC (a
released proof leaves the record only once an fsync covering it is known: `_wal_unsynced`).

Rules: work is done by due time (`schedule.DueHeap`): deadlines, far-future deadlines
coming within the lead, re-sends of own signatures at a doubling backoff (1, 2, 4, 8
periods), the pull of overdue transactions (`refetch.OverdueFetch`: one peer per
transaction at a backoff, capped per period); waiting transactions are re-checked only
when an input changed, and in a full pass (endorse, commit, the abort certificate of
dead endorsements) once per `rebroadcast_ticks`; nothing is signed while fenced.

Must not import: trio, sockets, clocks, global random, `phalanx.net`.
"""

from __future__ import annotations

from phalanx.consensus.leaderless.messages import (
    Endorsement,
    EndorsementBatch,
    Refusal,
    SignatureResend,
    TxId,
)
from phalanx.consensus.leaderless.parts import CoreParts, Outbox
from phalanx.consensus.leaderless.recovery import MAX_FETCH_IDS, MAX_RESEND_ITEMS
from phalanx.consensus.leaderless.store import TxRecord, TxState
from phalanx.consensus.types import NodeId


class TickWork(CoreParts):
    """The `Tick` handling of `LeaderlessCore`."""

    def _on_tick(self, now: int | None, out: Outbox) -> None:
        """Only what came due or changed: deadlines passed (`DueHeap`: refusals, and a
        wake-up of the waiting transactions, whose conflicts may now all be expired), the
        waiting transactions when something they depend on changed (an apply, a decision,
        the fence), the stuck check when the checkpoint batcher flushes; every period a
        full pass (endorse, commit) as a safety net, re-sends, GC."""
        self._ticks += 1
        out.sends += self._recovery.named_due(
            self._ticks, self._recovery.held_of(self._store, body_only=True))
        if now is None:
            self._checkpoints.tick(self._proof_of)
            return
        self._now = now
        self._store.horizon = max(self._store.horizon, now - self._config.gc_horizon_ms)
        if self._gate.skip_stale_reads(now, self._config.delta_old_ms):
            self._rules.invalidate()  # the endorsement rule no longer waits for them
            self._wake = True
            out.dirty = True
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
                self._check_certificate(record, out)  # endorsements died: docs "Dead ..."
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

    def _rebroadcast(self, now: int, out: Outbox) -> None:
        """Loss recovery (`recovery.py`): push own endorsements of transactions committed
        here since the last period and own signatures of still-pending ones (at a
        doubling backoff), pull what peers know of pending transactions past their
        deadline (a peer that committed one no longer pushes its endorsement; one peer per
        transaction at a backoff, `refetch.OverdueFetch`), and send
        this period's `CommittedDigest`. A committed one's endorsement goes as the
        `EndorsementBatch` it was signed in when that is known (`Recovery.pushed_batch`);
        the other re-sent signatures go in one `SignatureResend` per peer (chunks of
        `MAX_RESEND_ITEMS`)."""
        self._seal(out)  # what it re-sends is signed
        for tx_id in self._expired:  # overdue, or named again by a digest: ask (again) now
            self._refetch.add(tx_id, self._ticks)
        self._expired.clear()
        held_of = self._recovery.held_of(self._store)
        field = self._recovery.masks.field
        out.sends += self._refetch.due(
            self._ticks, lambda t: self._store.state_of(t) is TxState.PENDING,
            lambda ids: field(ids, held_of))
        out.sends += self._recovery.digest(self._ticks, self._gate.committed_ids())
        self._fetch_buffered(out)
        endorsements: list[Endorsement] = []
        refusals: list[Refusal] = []
        batches: dict[bytes, EndorsementBatch] = {}  # by signature: one per signed root
        for tx_id in self._recovery.recent(self._ticks):
            batch = self._recovery.pushed_batch(tx_id)
            own = self._kernel.endorsement(tx_id)
            if batch is not None and own is not None and own.signature == batch.signature:
                batches.setdefault(batch.signature, batch)
            elif own is not None:
                endorsements.append(own)
        for batch in batches.values():
            self._broadcast(batch, out)
        for tx_id in self._resends.pop_due(self._ticks + 1):
            if self._store.state_of(tx_id) is not TxState.PENDING:
                self._resend_every.pop(tx_id, None)
                continue
            endorsed = self._kernel.endorsement(tx_id)
            refused = self._kernel.refusal(tx_id) if endorsed is None else None
            if endorsed is not None:
                endorsements.append(endorsed)
            elif refused is not None:
                refusals.append(refused)
            else:
                continue
            self._resend_later(tx_id)
        signed = [*endorsements, *refusals]
        for i in range(0, len(signed), MAX_RESEND_ITEMS):
            chunk = signed[i:i + MAX_RESEND_ITEMS]
            self._broadcast(SignatureResend(
                endorsements=tuple(s for s in chunk if isinstance(s, Endorsement)),
                refusals=tuple(s for s in chunk if isinstance(s, Refusal))), out)

    def _fetch_buffered(self, out: Outbox) -> None:
        """Ask again for transactions known only from their endorsements (the client did not
        send them here, and the fetch from the first endorser was lost): each from one of
        its endorsers, rotating by period; `Recovery.want` allows one ask per period."""
        me = self._config.node_id
        by_peer: dict[NodeId, list[TxId]] = {}
        for tx_id, slot in list(self._store.buffered.items())[:MAX_FETCH_IDS]:
            endorsers = [n for n in sorted(slot) if n != me]
            if endorsers:
                peer = endorsers[(self._ticks // self._config.rebroadcast_ticks) % len(endorsers)]
                by_peer.setdefault(peer, []).append(tx_id)
        held = self._recovery.held_of(self._store)
        for peer, ids in by_peer.items():
            out.sends += self._recovery.fetch(peer, ids, self._ticks, held)

    def _queue_stuck(self, now: int) -> None:
        for tx_id in self._rules.stuck(now - self._config.delta_old_ms):
            self._queue(tx_id)

    def _queue(self, tx_id: TxId) -> None:
        if tx_id not in self._queued:
            self._queued[tx_id] = None
            self._checkpoints.queue(tx_id)
        else:  # still stuck: ordered, a kept one goes again (next round); veto, one kept
            self._checkpoints.queue(tx_id)  # on another id's proof goes again

    def _gc(self, now: int, full: bool, out: Outbox) -> None:
        """Forget what lies beyond the horizon: every tick what came due in the store's
        deadline index; every period (`full`) also the own signatures and small tables
        whose transaction left the store some other way."""
        named: set[TxId] | None = None

        def is_named(tx_id: TxId) -> bool:
            nonlocal named
            if named is None:
                named = self._named_conditions()
            return tx_id in named

        def keep(record: TxRecord) -> bool:
            return record.state is TxState.COMMITTED and (
                self._gate.unapplied(record.tx_id) or is_named(record.tx_id)
                or self._retained_suffix(record.tx_id) or self._wal_unsynced(record.tx_id, out))

        gone, stones = self._store.gc(
            now - self._config.gc_horizon_ms, keep=keep,
            keep_stone=lambda stone: is_named(stone.tx_id))  # committed or dropped
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

    def _wal_unsynced(self, tx_id: TxId, out: Outbox) -> bool:
        """`tx_id` was released by a Ready no fsync is known to have covered yet (its WAL
        entry may be in the page cache only): GC keeps it, so its proof stays in the record,
        and this step's Ready syncs the WAL (`must_sync`, unless a sync Ready covering it
        is already on its way); once its `Persisted` is back, the next GC collects it.
        Without this, a node that committed without signing (nothing syncs the WAL: the
        journal's fsync made the proof durable) and stayed idle until GC lost the commit
        in a machine crash after GC: neither the WAL nor the record held it. A release
        restored from the WAL at a restart (`ready` 0) counts as synced."""
        item = self._gate.released.get(tx_id)
        if item is None or item.ready <= self._synced_ready:
            return False
        if not self._sync_numbers or self._sync_numbers[-1] < item.ready:
            out.signed = True  # a `must_sync` Ready (nothing is signed for it)
        return True

    def _named_conditions(self) -> set[TxId]:
        """The ids the endorsements of pending transactions name as conditions. A committed
        one stays (record, certificate, tombstone) past the horizon while named: collected,
        it would be unknown here, so `Rules.stuck` would queue it and this node would vote
        to DROP what it committed; once every correct node had collected it, the checkpoint
        would drop it and its conflicting dependent would commit too (docs/LEADERLESS.md
        "Garbage collection"). A dropped one's tombstone stays too: the dependents'
        endorsements are definitely valid only through it, and collected it would be an id
        older than the horizon that no node holds, on which nobody may vote drop again
        ("Forgotten commits": the dependents would stay pending for good)."""
        return {c for record in self._store.pending()
                for e in record.endorsements.values() for c in e.conditions}


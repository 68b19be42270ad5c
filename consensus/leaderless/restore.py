"""Restart of the leaderless core from its durable record and the WAL suffix:
`RestoreFromRecord._restore`, a mixin of `LeaderlessCore` (core.py) run once by its
constructor on the core's own state (split out of core.py to keep it small; not a
sub-machine of its own). The crash cases it relies on are argued in `durable.py`.

Invariants: a WAL entry is a committed transaction released at its index; a released proof
of the record past the WAL's end is released again at its index; gated proofs wait at the
gate; a transaction this node touched and did not decide comes back pending, with its own
endorsement or refusal (the safety kernel's).

Must not import: trio, sockets, clocks, global random, `phalanx.net`.
"""

from __future__ import annotations

from collections.abc import Sequence

from phalanx.consensus.leaderless.messages import (
    DecidedTx,
    LeaderlessDurableState,
    Transaction,
    TxId,
)
from phalanx.consensus.leaderless.parts import CoreParts
from phalanx.consensus.leaderless.release import Committed
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import Entry


class RestoreFromRecord(CoreParts):
    """The core's restore (see the module docstring)."""

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
                        writes=record.writes, index=entry.index, keys=record.keys))
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
                self._store.restore_pending(record)
                self._deadlines.push(record.deadline, tx_id)
                self._resend_later(tx_id)
                refusal = self._kernel.refusal(tx_id)
                if refusal is not None:
                    self._tally.add(refusal)


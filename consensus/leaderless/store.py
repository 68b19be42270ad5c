"""The leaderless core's transaction store (PnyxDB's query store).

Owns: one `TxRecord` per known undecided-or-committed transaction (the transaction, its
state, the endorsements received, at most one per endorser), the tombstones of decided
transactions (`DecidedTx`), endorsements buffered for transactions not yet known, and
garbage collection by deadline (`gc`).

Invariants:
- A transaction id is in at most one of: `records` (pending or committed), `tombstones`
  only (dropped, or committed and collected).
- Every map iterates in insertion order (arrival order): no decision depends on set order.
- A pending (undecided) record is never collected: only a decision (commit, abort
  certificate, checkpoint, install) ends it, whatever its deadline; a node that commits it
  late must not meet replicas that forgot it (docs/LEADERLESS.md "Undecided transactions
  are never forgotten"). `decide` re-indexes one decided past the horizon.
- `pending_of(client)` counts the pending records of each signing client (the per-client
  bound, `LeaderlessConfig.max_pending_per_client`); every way into or out of the pending
  set goes through `_pending_in` / `_pending_out`.
- Memory is bounded by `max_pending` undecided records plus the decided ones of the
  horizon: decided records and tombstones go once their deadline is older than the GC
  horizon (committed ones only once released and applied and no pending transaction's
  endorsement names them as a condition, see `gc`); buffered endorsements are capped at
  `max_buffered`, oldest evicted first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.consensus.leaderless.growing import GrowingTuple
from phalanx.consensus.leaderless.messages import DecidedTx, Endorsement, Transaction, TxId
from phalanx.consensus.leaderless.schedule import DueHeap
from phalanx.consensus.types import ClientRequest, NodeId


class TxState(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"
    DROPPED = "dropped"


@dataclass(slots=True, kw_only=True)
class TxRecord:
    """What this node knows of one transaction.

    Attributes:
        tx_id, tx: the transaction and its id.
        request: the `ClientRequest` that carries it to the replica layer (and to `Abort`).
        writes, needs, needs_base: the app's `writes`, `needs_requirements` and
            `needs_base` of its command.
        keys: every key it touches as far as conflicts go (the app's `keys` of its command
            and its full-requirement keys, sorted), None when unknown (key ranges).
        state: pending, committed or dropped.
        endorsements: the valid endorsements received, by endorser, first one wins.
        index: the local index it was released at (0 = not released).
    """

    tx_id: TxId
    tx: Transaction
    request: ClientRequest
    writes: tuple[str, ...]
    needs: tuple[str, ...]
    needs_base: tuple[str, ...] = ()
    keys: tuple[str, ...] | None = None
    state: TxState = TxState.PENDING
    endorsements: dict[NodeId, Endorsement] = field(default_factory=dict)
    index: int = 0

    @property
    def deadline(self) -> int:
        return self.tx.deadline_ms


class TxStore:
    """Known transactions, tombstones and buffered endorsements (see the module docstring)."""

    __slots__ = ("_by_client", "_by_deadline", "_max_buffered", "_pending", "_stones",
                 "_stones_stale",
                 "buffered", "forget_undecided", "horizon", "overdue", "records", "tombstones")

    def __init__(self, *, max_buffered: int) -> None:
        self.records: dict[TxId, TxRecord] = {}
        self.tombstones: dict[TxId, DecidedTx] = {}
        self.buffered: dict[TxId, dict[NodeId, Endorsement]] = {}
        self.horizon = 0
        self.forget_undecided = False  # the `forget_undecided` bug (bugs.py)
        self.overdue: list[TxId] = []
        """Pending records GC found past the horizon (each once, until decided and
        re-indexed); the core drains it (`catch_up.py`: state transfer may decide them)."""
        self._max_buffered = max_buffered
        self._stones: GrowingTuple[DecidedTx] = GrowingTuple()
        """The tombstones in insertion order, kept up to date by appending a decision and
        trimming a collected head (`growing.py`: rebuilding it from the dict cost
        O(horizon) per Ready)."""
        self._stones_stale = True
        self._by_deadline = DueHeap()
        """Every record's and tombstone's id by deadline: GC touches only what came due."""
        self._pending: dict[TxId, None] = {}
        """The ids of the pending records, in insertion order (`pending()` walked every
        record of the horizon, several times per tick under load)."""
        self._by_client: dict[str, int] = {}
        """How many pending records each signing client (`Transaction.client`) has."""

    def index(self, tx_id: TxId, deadline_ms: int) -> None:
        """Put a record or tombstone inserted directly (a restore) into the GC index."""
        self._by_deadline.push(deadline_ms, tx_id)

    def tombstone_tuple(self) -> tuple[DecidedTx, ...]:
        """The tombstones in insertion order, the same tuple until they change (the
        journal diffs the durable record by identity). Whoever changes `tombstones`
        outside this class calls `stones_changed`."""
        stones = self._stones
        if self._stones_stale or len(stones) != len(self.tombstones):
            self._stones_stale = False
            stones.reset(self.tombstones.values())
        return stones.value()

    def record_growth(self) -> tuple[tuple[int, tuple[DecidedTx, ...]] | None]:
        """How `tombstone_tuple()` changed since the last `mark_record` (`growing.Growth`;
        None: some other way). Read right after `tombstone_tuple()`."""
        return (self._stones.growth.of(self._stones.value()),)

    def mark_record(self) -> None:
        """`tombstone_tuple()` as it is now went into a record."""
        self._stones.growth.mark()

    def stones_changed(self) -> None:
        self._stones_stale = True

    def get(self, tx_id: TxId) -> TxRecord | None:
        return self.records.get(tx_id)

    def state_of(self, tx_id: TxId) -> TxState | None:
        """The state of `tx_id`, from its record or its tombstone; None when unknown."""
        record = self.records.get(tx_id)
        if record is not None:
            return record.state
        stone = self.tombstones.get(tx_id)
        if stone is None:
            return None
        return TxState.COMMITTED if stone.committed else TxState.DROPPED

    def decided(self, tx_id: TxId) -> bool:
        state = self.state_of(tx_id)
        return state is TxState.COMMITTED or state is TxState.DROPPED

    def pending(self) -> list[TxRecord]:
        """The pending records, in insertion order."""
        records = self.records
        return [records[t] for t in self._pending]

    def pending_count(self) -> int:
        return len(self._pending)

    def pending_of(self, client: str) -> int:
        """How many pending records `client` (the signing client) has here."""
        return self._by_client.get(client, 0)

    def _pending_in(self, record: TxRecord) -> None:
        self._pending[record.tx_id] = None
        client = record.tx.client
        self._by_client[client] = self._by_client.get(client, 0) + 1

    def _pending_out(self, record: TxRecord) -> None:
        if record.tx_id not in self._pending:
            return
        del self._pending[record.tx_id]
        client = record.tx.client
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]

    def restore_pending(self, record: TxRecord) -> None:
        """Insert a pending record rebuilt from the durable record (a restart)."""
        self.records[record.tx_id] = record
        self._pending_in(record)
        self.index(record.tx_id, record.deadline)

    def add(self, record: TxRecord) -> dict[NodeId, Endorsement]:
        """Insert a new pending record; returns the endorsements buffered for it (removed
        from the buffer), in arrival order, for the caller to add through its checks."""
        self.records[record.tx_id] = record
        self._pending_in(record)
        self._by_deadline.push(record.deadline, record.tx_id)
        return self.buffered.pop(record.tx_id, {})

    def buffer(self, endorsement: Endorsement) -> bool:
        """Keep an endorsement of an unknown transaction; False if it was already buffered
        for that endorser. Evicts the oldest buffered transaction past the bound."""
        slot = self.buffered.setdefault(endorsement.tx_id, {})
        if endorsement.endorser in slot:
            return False
        slot[endorsement.endorser] = endorsement
        while len(self.buffered) > self._max_buffered:
            del self.buffered[next(iter(self.buffered))]
        return True

    def decide(self, record: TxRecord, state: TxState) -> None:
        """Mark a pending record committed or dropped and write its tombstone. A dropped
        record leaves `records` (only its tombstone stays)."""
        record.state = state
        self._pending_out(record)
        if record.deadline < self.horizon:  # held past the horizon undecided: collect it
            self._by_deadline.push(record.deadline, record.tx_id)
        committed = state is TxState.COMMITTED
        stone = DecidedTx(tx_id=record.tx_id, deadline_ms=record.deadline, committed=committed)
        if record.tx_id in self.tombstones:
            self._stones_stale = True  # its value changes in place
        else:
            self._stones.append(stone)  # at the end of the dict too
        self.tombstones[record.tx_id] = stone
        if not committed:
            del self.records[record.tx_id]

    def drop_unknown(self, tx_id: TxId, deadline_ms: int) -> None:
        """A tombstone for a transaction dropped (by a checkpoint) that this node never
        saw: `deadline_ms` is an upper bound of its deadline for GC."""
        self.buffered.pop(tx_id, None)
        self._by_deadline.push(deadline_ms, tx_id)
        if tx_id not in self.tombstones:
            stone = DecidedTx(tx_id=tx_id, deadline_ms=deadline_ms, committed=False)
            self.tombstones[tx_id] = stone
            self._stones.append(stone)

    def gc(self, horizon: int, keep: Callable[[TxRecord], bool],
           keep_stone: Callable[[DecidedTx], bool] = lambda _s: False,
           ) -> tuple[list[TxId], list[TxId]]:
        """Raise the horizon (monotone; the caller may have raised it already) and forget
        every decided record and tombstone whose deadline is older than it (never a pending
        record, unless the `forget_undecided` bug is on), except records `keep`
        says are still needed (a committed transaction not yet applied, or one a pending
        transaction's endorsement names as a condition) and tombstones without a record
        `keep_stone` says are (looked at again on the next call). Touches only the ids
        whose deadline came due. Returns the forgotten record ids and the forgotten
        tombstones' ids."""
        self.horizon = horizon = max(self.horizon, horizon)
        gone: list[TxId] = []
        stones: list[TxId] = []
        kept: list[tuple[int, TxId]] = []
        for tx_id in self._by_deadline.pop_due(horizon):
            record = self.records.get(tx_id)
            if record is not None:
                if record.deadline >= horizon:
                    continue  # indexed twice (an id re-added): its other entry is due later
                if record.state is TxState.PENDING and not self.forget_undecided:
                    self.overdue.append(tx_id)
                    continue  # never forgotten undecided: `decide` indexes it again
                if keep(record):
                    kept.append((record.deadline, tx_id))
                    continue
                del self.records[tx_id]
                self._pending_out(record)
                gone.append(tx_id)
            stone = self.tombstones.get(tx_id)
            if stone is not None and stone.deadline_ms < horizon:
                if record is None and keep_stone(stone):
                    kept.append((stone.deadline_ms, tx_id))
                    continue
                if next(iter(self.tombstones)) == tx_id and len(self._stones):
                    self._stones.pop_head()  # the oldest: the usual order
                else:
                    self._stones_stale = True
                del self.tombstones[tx_id]
                stones.append(tx_id)
        for deadline, tx_id in kept:
            self._by_deadline.push(deadline, tx_id)
        return gone, stones

"""The replica's transaction table: exactly-once by transaction id, in any apply order.

Owns: `TransactionLayer` (how the replica reads a transaction-mode command: the protocol's
runtime half supplies it, e.g. `phalanx.protocols.leaderless_node.TxLayer`), `TxRecord` and
`TransactionTable`, the deduplication records of a replica in transaction mode
(`phalanx.apps.replica.Replica(transactions=...)`). Part of every checkpoint of such a
replica (`phalanx.apps.envelope`, format version 3).

Why not the session table: a leaderless core applies non-conflicting transactions in
different orders on different replicas, so "run iff the request number is above the client's
last" would make an earlier transaction applied second EXPIRED on one replica and applied on
another (they diverge). Here a transaction runs iff its id was never applied, whatever the
order.

Rules (replicated state, decided at apply time only):
- A transaction whose id is in the table is a DUPLICATE (answered from the cached result).
- Garbage collection after each applied entry: records whose deadline is below
  `max_deadline_ms - horizon_ms` go (`max_deadline_ms`: the largest deadline applied so far).
  The cutoff only grows, so given the same applied transactions every replica keeps the same
  records, whatever the order.
- A transaction not in the table whose deadline is below the cutoff is not run (`too_old`):
  it may have run and been collected. The core must never release one: it ignores
  transactions older than its own horizon (`LeaderlessDurableState.gc_horizon_ms`), which
  is at least as recent as this cutoff when `horizon_ms` is at least the core's.

Must not import: consensus cores, storage, trio, clocks. Deterministic: nothing depends on
set order, `id()` or time (the heap breaks deadline ties by id).
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Protocol

import immutables

from phalanx.consensus._fastpath import raw_init


class TransactionLayer(Protocol):
    """How a transaction-mode replica reads a command (an encoded, signed transaction)."""

    horizon_ms: int
    """Records are kept until their deadline is this much older than the newest applied
    deadline (at least the core's garbage-collection horizon)."""

    def unwrap(self, command: bytes) -> tuple[bytes, int, bytes, tuple[str, ...]] | None:
        """`(tx_id, deadline_ms, application command, pinned keys)` of the transaction
        `command` encodes, or None when it is malformed (never raises). Pinned: the keys it
        requires by FULL version, sorted (`TransactionAware.apply_tx`). Pure."""
        ...


@raw_init  # built once per applied transaction
@dataclass(frozen=True, slots=True, kw_only=True)
class TxRecord:
    """An applied transaction: its deadline (for collection) and its cached result."""

    deadline_ms: int
    result: bytes


TxRecords = immutables.Map[bytes, TxRecord]

_MOD = 1 << 256


def id_weight(tx_id: bytes) -> int:
    """A transaction id's term in the table's order-free sum (`TransactionTable.id_sum`)."""
    return int.from_bytes(hashlib.sha256(tx_id).digest(), "big")


class TransactionTable:
    """See the module docstring. `records` is a persistent map (an O(1) snapshot for
    checkpoints); the heap is derived from it."""

    def __init__(self, *, horizon_ms: int) -> None:
        if horizon_ms < 0:
            raise ValueError(f"horizon_ms must be >= 0, got {horizon_ms}")
        self.horizon_ms = horizon_ms
        self.records: TxRecords = immutables.Map()
        self.max_deadline_ms = 0
        self.collected = 0
        """Records collected by this replica (not replicated; statistics)."""
        self.id_sum = 0
        """Sum mod 2^256 of `id_weight` over the ids in `records`: a function of the id set
        only (any apply order), kept up to date in O(1) per change; the replica's
        content-defined checkpoints (`CheckpointPolicy.cut_every`) select on it."""
        self._heap: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self.records)

    def get(self, tx_id: bytes) -> TxRecord | None:
        return self.records.get(tx_id)

    @property
    def cutoff_ms(self) -> int:
        """Deadlines below this are collected (and such transactions no longer run)."""
        return self.max_deadline_ms - self.horizon_ms

    def is_cut(self, every: int) -> bool:
        """The id set is a content-defined cut: non-empty, `id_sum` divisible by `every`
        (> 0; about one set in `every`). The same for every replica holding this set."""
        return every > 0 and len(self.records) > 0 and self.id_sum % every == 0

    def too_old(self, deadline_ms: int) -> bool:
        return deadline_ms < self.cutoff_ms

    def record(self, tx_id: bytes, deadline_ms: int, result: bytes) -> None:
        """Transaction `tx_id` ran (not in the table, not `too_old`)."""
        self.records = self.records.set(tx_id, TxRecord(deadline_ms=deadline_ms, result=result))
        self.id_sum = (self.id_sum + id_weight(tx_id)) % _MOD
        heapq.heappush(self._heap, (deadline_ms, tx_id))
        if deadline_ms > self.max_deadline_ms:
            self.max_deadline_ms = deadline_ms

    def end_entry(self) -> None:
        """After an entry's requests: collect what fell below the cutoff."""
        heap = self._heap
        cutoff = self.cutoff_ms
        if not heap or heap[0][0] >= cutoff:
            return
        records = self.records.mutate()
        while heap and heap[0][0] < cutoff:
            _, tx_id = heapq.heappop(heap)
            del records[tx_id]
            self.id_sum = (self.id_sum - id_weight(tx_id)) % _MOD
            self.collected += 1
        self.records = records.finish()

    def load(self, records: TxRecords, max_deadline_ms: int) -> None:
        """Replace the table with a checkpoint's (then collect below its cutoff)."""
        self.records = records
        self.max_deadline_ms = max_deadline_ms
        self.id_sum = sum(id_weight(tx_id) for tx_id in records) % _MOD
        self._heap = sorted((r.deadline_ms, tx_id) for tx_id, r in records.items())
        self.end_entry()

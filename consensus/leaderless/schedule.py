"""Due-time indexes of the leaderless core, so a tick touches only what came due.

Owns: `DueHeap`, a min-heap of (time, insertion number, transaction id): `pop_due(t)` returns
the ids whose time is before `t`, in (time, insertion) order: deterministic, no set order.
Used for pending transactions' deadlines (refusal, the conditional-endorsement wake-up) and
for the re-send backoff of own signatures. Entries are never removed early: a caller
checks that a popped id still matters (lazy deletion).

Invariant: each `push` is returned by exactly one `pop_due`, at or after its time.
"""

from __future__ import annotations

import heapq

from phalanx.consensus.leaderless.messages import TxId


class DueHeap:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TxId]] = []
        self._seq = 0

    def push(self, at: int, tx_id: TxId) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, tx_id))

    def pop_due(self, before: int) -> list[TxId]:
        """Every id pushed with a time < `before` (and not popped yet), earliest first."""
        heap = self._heap
        out: list[TxId] = []
        while heap and heap[0][0] < before:
            out.append(heapq.heappop(heap)[2])
        return out

    def __len__(self) -> int:
        return len(self._heap)

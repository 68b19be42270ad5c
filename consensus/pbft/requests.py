"""Client-request bookkeeping of one PBFT replica, and the primary's adaptive batching rule.

Owns: `RequestBook`: the primary's unbatched requests (`pending`), the requests a backup
waits to see executed (`waiting`, which drive its view-change timer), the requests already
in some pre-prepare of the current view (`in_progress`) and, per client, the highest
request number executed (`done`, the dedup table that keeps a retried request from being
ordered twice). Also `should_flush`, the batching rule (below).

Must not import: the core, crypto, clocks, randomness.

Batching (the classic adaptive rule, plus returning clients): a full batch is proposed at
once; a partial batch is proposed only while fewer than `max_inflight` of the primary's
batches are ordered but not yet executed. Otherwise requests accumulate while earlier
batches are in flight (so batches grow with load instead of latency growing with a timer),
and the batch is proposed when a batch executes, or after `batch_ticks` ticks at the latest.

Returning clients (`served`, `returning`): when the primary executes requests, the clients
they answer usually send their next request at once (closed-loop clients, the common case
of a KV store's callers). Proposing the moment a batch executes would take only the
requests that waited meanwhile and leave the returning clients to the batch after, so a
loaded cluster settles into two half-size batches per round trip, each paying the full
fixed cost of a batch (at n=4 about 24 peer messages, 8 signature checks and 4 signatures
and an fsync per replica). So after executing, the primary expects back as many requests
as it just executed plus those already pending, and proposes a partial batch once that many
are pending. A client whose newer request is already pending when its previous one
executes is back already and not expected twice (one closed-loop client usually is: it
accepts the f+1 backups' answers before the primary executes). An expectation that fails is
bounded (`tick`): while the pipeline has room, the second tick that finds requests pending
drops it (at most two ticks of extra wait; not the first, which may fall while the clients
are coming back: under load the last of them is back 10 ms or more after the first) and
they go at once; waiting then stays off until the primary executes again. One closed-loop
client never waits (it is expected back alone, or is back already).

Relaying (`PbftConfig.forward_ticks`): a backup that queues a request to wait for it also
notes the tick at which to relay it to the primary; `due_forwards` returns the requests whose
tick came and that are still waiting and not yet in a pre-prepare of this view. A view
change drops the notes (the new view relays every waiting request at once).

Invariants: bounded (`max_pending` each for `pending` and `waiting`; a flood is refused
with a Rejection by the core); iteration orders are list/insertion or sorted, never set
order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from phalanx.consensus.types import ClientRequest

_Key = tuple[str, int]


def _key(r: ClientRequest) -> _Key:
    return (r.client_id, r.request_no)


class RequestBook:
    """See the module docstring."""

    __slots__ = (
        "_done",
        "_forward_due",
        "_in_progress",
        "_max_pending",
        "_waited",
        "pending",
        "pending_age",
        "returning",
        "waiting",
    )

    def __init__(self, *, max_pending: int) -> None:
        self._max_pending = max_pending
        self.pending: list[ClientRequest] = []
        self.pending_age = 0
        self.returning = 0
        self._waited = 0
        self.waiting: dict[_Key, ClientRequest] = {}
        self._in_progress: set[_Key] = set()
        self._done: dict[str, int] = {}
        self._forward_due: deque[tuple[int, _Key]] = deque()

    def __len__(self) -> int:
        return len(self.pending) + len(self.waiting)

    def executed(self, r: ClientRequest) -> bool:
        """Whether `r` (or a later request of its client) was executed here."""
        return r.request_no <= self._done.get(r.client_id, -1)

    def latest(self, r: ClientRequest) -> bool:
        """Whether `r` is its client's latest executed request (a retry worth re-answering)."""
        return r.request_no == self._done.get(r.client_id, -1)

    def known(self, r: ClientRequest) -> bool:
        """Whether `r` is already ordered in this view or queued here."""
        key = _key(r)
        return key in self._in_progress or key in self.waiting

    def queue_pending(self, r: ClientRequest) -> bool:
        """Queue `r` for the primary's next batch; False when full (the caller rejects)."""
        if len(self.pending) >= self._max_pending:
            return False
        self.pending.append(r)
        self._in_progress.add(_key(r))
        return True

    def queue_waiting(self, r: ClientRequest, *, forward_at: int | None = None) -> bool:
        """Wait for `r` to execute (a backup); False when full (the caller rejects).
        `forward_at`: the tick from which `due_forwards` returns it (None: never)."""
        if len(self.waiting) >= self._max_pending:
            return False
        key = _key(r)
        self.waiting[key] = r
        if forward_at is not None:
            self._forward_due.append((forward_at, key))  # ticks only grow: stays sorted
        return True

    def due_forwards(self, now: int) -> list[ClientRequest]:
        """The waiting requests to relay to the primary at tick `now` (each once): their
        tick came and no pre-prepare of this view carries them yet."""
        due = self._forward_due
        out: list[ClientRequest] = []
        while due and due[0][0] <= now:
            _, key = due.popleft()
            r = self.waiting.get(key)
            if r is not None and key not in self._in_progress:
                out.append(r)
        return out

    def should_flush(self, *, batch_size: int, inflight: int, max_inflight: int) -> bool:
        """The adaptive batching rule (module docstring)."""
        n = len(self.pending)
        if not n:
            return False
        return n >= batch_size or (inflight < max_inflight and n >= self.returning)

    def served(self, executed: Sequence[ClientRequest]) -> None:
        """The primary executed `executed`: expect their clients back, except those already
        back (a newer request of theirs is pending: a client that accepted f+1 backups'
        answers may call again before the primary executes its previous request)."""
        pending = self.pending
        if pending and executed:
            back = {r.client_id for r in pending}
            expected = sum(1 for r in executed if r.client_id not in back)
        else:
            expected = len(executed)
        self.returning = expected + len(pending)
        self._waited = 0

    def tick(self) -> bool:
        """A tick at the primary while its pipeline has room. The expectation fails at the
        second tick that finds requests pending since it was set (the first may fall while
        the clients are coming back); waiting then stops until the next `served`. Returns
        whether it failed now (the pending requests should go at once)."""
        if not self.pending or not self.returning:
            return False
        self._waited += 1
        if self._waited < 2:
            return False
        self.returning = 0
        return True

    def take_batch(self, size: int) -> tuple[ClientRequest, ...]:
        batch = tuple(self.pending[:size])
        del self.pending[:size]
        if not self.pending:
            self.pending_age = 0
        return batch

    def ordered(self, batch: tuple[ClientRequest, ...], *, wait: bool = False) -> None:
        """The requests of a pre-prepare of the current view (ours or the primary's).

        `wait` (a backup): also wait for each not yet executed (within the `max_pending`
        bound), so the view-change timer covers it even when the pre-prepare arrived
        before the client's own copy (which `known` then ignores): a backup waits for
        every request it knows of until it executes (Castro-Liskov §4.4), else a batch
        stuck in this view would stall the backup without a timeout."""
        waiting = self.waiting
        for r in batch:
            key = _key(r)
            self._in_progress.add(key)
            if (wait and key not in waiting and not self.executed(r)
                    and len(waiting) < self._max_pending):
                waiting[key] = r

    def was_executed(self, batch: tuple[ClientRequest, ...]) -> None:
        for r in batch:
            key = _key(r)
            done = self._done.get(r.client_id, -1)
            if r.request_no > done:
                self._done[r.client_id] = r.request_no
            self.waiting.pop(key, None)
            self._in_progress.discard(key)

    def view_changed(self) -> None:
        """Leaving a view: unbatched requests wait again; nothing is ordered in the next view
        yet."""
        for r in self.pending:
            self.waiting[_key(r)] = r
        self.pending = []
        self.pending_age = 0
        self.returning = 0
        self._in_progress.clear()
        self._forward_due.clear()

    def take_waiting(self) -> list[ClientRequest]:
        """Every waiting request, in (client, number) order, for a new primary to batch."""
        out = [self.waiting[k] for k in sorted(self.waiting)]
        self.waiting = {}
        return [r for r in out if _key(r) not in self._in_progress]

    def forget_executed(self) -> bool:
        """Drop the waiting requests that `executed` reports done: their client already
        had a later request executed, so they were executed (or will never be). Exact keys
        are dropped when their own batch executes (`was_executed`); this catches the rest,
        e.g. a request executed in a sequence number this replica skipped. Returns whether
        anything still waits. O(waiting): called only when the view-change timer expires."""
        done = [k for k, r in self.waiting.items() if self.executed(r)]
        for key in done:
            del self.waiting[key]
        return bool(self.waiting)

    def waiting_sorted(self) -> list[ClientRequest]:
        """The waiting requests no pre-prepare of this view carries, in (client, number)
        order (what a backup relays to a new primary)."""
        return [self.waiting[k] for k in sorted(self.waiting) if k not in self._in_progress]

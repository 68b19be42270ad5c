"""The simulator's event loop (virtual time in integer nanoseconds) and its trace.

Owns: `EventLoop`, a heap of `(time_ns, seq, callback)` where `seq` increases with every
schedule call and breaks ties, so events at the same instant run in the order they were
scheduled; and `Trace`, the readable event log whose sha256 identifies a run.

Rules:
- Single-threaded and deterministic: no clocks, no threads, no global randomness, no `id()`.
  Virtual time only moves forward, to the next scheduled event.
- Must not import consensus cores, storage or the network model; everything above schedules
  plain callbacks.
- Invariant: `now` never decreases; an event is never scheduled in the past.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable

Callback = Callable[[], None]


class EventLoop:
    """A virtual-time scheduler. `now` is nanoseconds since the simulation began."""

    __slots__ = ("_heap", "_seq", "event_budget", "events_run", "halted", "now")

    def __init__(self) -> None:
        self.now = 0
        self._seq = itertools.count(1)
        """The tie-breaker of the next event (1, 2, ...; `next` is cheaper than `+= 1`)."""
        self._heap: list[tuple[int, int, Callback]] = []
        self.events_run = 0
        self.event_budget = 1 << 62
        """`run_until` stops once `events_run` exceeds this (a runaway guard)."""
        self.halted = False
        """Set by whoever runs out of another budget (bytes sent); `run_until` then stops."""

    def call_at(self, when_ns: int, callback: Callback) -> None:
        """Run `callback` at virtual time `when_ns` (>= now)."""
        if when_ns < self.now:
            raise ValueError(f"cannot schedule at {when_ns} ns, before now={self.now} ns")
        heapq.heappush(self._heap, (when_ns, next(self._seq), callback))

    def call_later(self, delay_ns: int, callback: Callback) -> None:
        if delay_ns < 0:
            raise ValueError(f"delay must be >= 0, got {delay_ns}")
        _push(self._heap, (self.now + delay_ns, next(self._seq), callback))

    def raw_queue(self) -> tuple[list[tuple[int, int, Callback]], Callable[[], int]]:
        """(the heap, the tie-breaker source), for a hot caller that inlines `call_later`:
        it must push ``(when_ns, next_seq(), callback)`` with ``when_ns >= now`` exactly as
        `call_later` does (`SimNetwork.send`: one call less per message)."""
        return self._heap, self._seq.__next__

    def run_until(self, until_ns: int) -> None:
        """Run every event due at or before `until_ns`, then leave `now == until_ns`.

        Returns early (at the time of the last event run) once `halted` is set or
        `events_run` exceeds `event_budget`; both are checked after each event.
        """
        heap = self._heap
        pop = heapq.heappop
        # `events_run` is counted in a local and stored on every way out (callbacks do not
        # read it); `halted` is read after each callback, as a callback may set it.
        run = self.events_run
        budget = self.event_budget
        try:
            while heap and heap[0][0] <= until_ns:
                when, _, callback = pop(heap)
                self.now = when
                run += 1
                callback()
                if self.halted or run > budget:
                    return
        finally:
            self.events_run = run
        if self.now < until_ns:
            self.now = until_ns

    def pending(self) -> int:
        return len(self._heap)


_push = heapq.heappush


class Trace:
    """The readable log of a run: one line per event, hashed as it is written.

    Keeps the last `tail` lines for failure reports, and every line only when `keep_all`
    (for `--trace FILE`), so long sweeps do not hold whole traces in memory.

    Message deliveries (`message`) are the bulk of a trace; they are hashed by their wire
    bytes and rendered as text only when a line is read (`tail`, or eagerly with
    `keep_all`), so a sweep never formats a message nobody looks at. The hash therefore
    covers every event's time and text, and for a message its exact bytes. The bytes to
    hash are gathered and fed to sha256 in batches (the digest of a concatenation is the
    digest of its pieces fed in order), so `hexdigest` is the same as one update per line.
    """

    __slots__ = ("_hash", "_pending", "_tail", "count", "lines", "loop")

    _BATCH = 512
    """Pieces gathered before they are hashed."""

    def __init__(self, loop: EventLoop, *, keep_all: bool = False, tail: int = 40) -> None:
        self.loop = loop
        self._hash = hashlib.sha256()
        self._pending: list[bytes] = []
        self._tail: deque[str | tuple[int, str, str, object]] = deque(maxlen=tail)
        self.lines: list[str] | None = [] if keep_all else None
        self.count = 0

    def __call__(self, text: str) -> None:
        now = self.loop.now
        line = _line(now, text)
        pending = self._pending
        pending += (line.encode(), b"\n")
        if len(pending) >= self._BATCH:
            self._flush()
        self._tail.append(line)
        self.count += 1
        if self.lines is not None:
            self.lines.append(line)

    def message(self, src: str, dst: str, message: object, data: bytes) -> None:
        """Trace ``f"{src}->{dst} {message}"`` where `data` is the message's wire encoding."""
        now = self.loop.now
        pending = self._pending
        pending += (f"t={now} {src}->{dst} ".encode(), data, b"\n")
        if len(pending) >= self._BATCH:
            self._flush()
        self._tail.append((now, src, dst, message))
        self.count += 1
        if self.lines is not None:
            self.lines.append(_line(now, f"{src}->{dst} {message}"))

    def _flush(self) -> None:
        pending = self._pending
        self._hash.update(b"".join(pending))
        pending.clear()

    def hexdigest(self) -> str:
        self._flush()
        return self._hash.hexdigest()

    def tail(self) -> list[str]:
        return [
            item if isinstance(item, str) else _line(item[0], f"{item[1]}->{item[2]} {item[3]}")
            for item in self._tail
        ]


def _line(now: int, text: str) -> str:
    return f"t={now // 1_000_000}.{now % 1_000_000:06d}ms {text}"

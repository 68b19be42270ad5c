"""The simulator's event loop (virtual time in integer nanoseconds) and its trace.

Owns: `EventLoop` and `Trace`, the readable event log whose sha256 identifies a run.

The queue: events ``(time_ns, seq, function, argument)``, run as ``function(argument)``,
where `seq` increases with every schedule call and breaks ties, so events at the same
instant run in the order they were scheduled (tuples compare only ``(time_ns, seq)``: `seq`
is unique). A plain callback is the event ``(time_ns, seq, operator.call, callback)``; a hot
scheduler (the network's deliveries) pushes its own function and argument instead of
building a `functools.partial` per event (`raw_queue`).

Two heaps, split at a moving `horizon`: `near` holds every event due before it, `far` every
event at or after it. So the smallest of `near` is the next event while `near` is not
empty; when it empties, the horizon moves to `HORIZON_NS` past the earliest far event and
the far events before it move over. The order of events is exactly that of one heap; the
split keeps the heap that is popped once per event small: a run's many long timers (client
deadlines, retries, hundreds at a time and mostly never due while their operation is live)
wait in `far` instead of deepening every pop.

Rules:
- Single-threaded and deterministic: no clocks, no threads, no global randomness, no `id()`.
  Virtual time only moves forward, to the next scheduled event.
- Must not import consensus cores, storage or the network model; everything above schedules
  plain callbacks.
- Invariants: `now` never decreases; an event is never scheduled in the past; every event in
  `near` is due before `horizon`, every event in `far` at or after it.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from operator import call as _call
from typing import Any

Callback = Callable[[], None]
Event = tuple[int, int, Callable[[Any], object], object]
"""``(time_ns, seq, function, argument)``: run as ``function(argument)``."""

HORIZON_NS = 40_000_000
"""How far past the earliest far event the horizon moves (see the module docstring): longer
than the network's latencies and a node's tick, shorter than a client's timeouts."""


class EventLoop:
    """A virtual-time scheduler. `now` is nanoseconds since the simulation began."""

    __slots__ = ("_far", "_near", "_seq", "event_budget", "events_run", "halted", "horizon",
                 "now")

    def __init__(self) -> None:
        self.now = 0
        self._seq = itertools.count(1)
        """The tie-breaker of the next event (1, 2, ...; `next` is cheaper than `+= 1`)."""
        self._near: list[Event] = []
        """The events due before `horizon`, as a heap."""
        self._far: list[Event] = []
        """The events due at or after `horizon`, as a heap."""
        self.horizon = 0
        """Where `near` ends and `far` begins (read-only outside this class)."""
        self.events_run = 0
        self.event_budget = 1 << 62
        """`run_until` stops once `events_run` exceeds this (a runaway guard)."""
        self.halted = False
        """Set by whoever runs out of another budget (bytes sent); `run_until` then stops."""

    def call_at(self, when_ns: int, callback: Callback) -> None:
        """Run `callback` at virtual time `when_ns` (>= now)."""
        if when_ns < self.now:
            raise ValueError(f"cannot schedule at {when_ns} ns, before now={self.now} ns")
        event = (when_ns, next(self._seq), _call, callback)
        _push(self._near if when_ns < self.horizon else self._far, event)

    def call_later(self, delay_ns: int, callback: Callback) -> None:
        if delay_ns < 0:
            raise ValueError(f"delay must be >= 0, got {delay_ns}")
        when = self.now + delay_ns
        event = (when, next(self._seq), _call, callback)
        _push(self._near if when < self.horizon else self._far, event)

    def raw_queue(self) -> tuple[list[Event], list[Event], Callable[[], int]]:
        """(the near heap, the far heap, the tie-breaker source), for a hot caller that
        inlines `call_later`: for an event at ``when_ns >= now`` it must push
        ``(when_ns, next_seq(), function, argument)`` with `heapq.heappush` onto the near
        heap if ``when_ns < loop.horizon`` (read at that moment), else onto the far heap,
        exactly as `call_later` does; the loop then calls ``function(argument)``
        (`SimNetwork.send`: one call less per message, and no `functools.partial`)."""
        return self._near, self._far, self._seq.__next__

    def run_until(self, until_ns: int) -> None:
        """Run every event due at or before `until_ns`, then leave `now == until_ns`.

        Returns early (at the time of the last event run) once `halted` is set or
        `events_run` exceeds `event_budget`; both are checked after each event.
        """
        near = self._near
        far = self._far
        pop = heapq.heappop
        # `events_run` is counted in a local and stored on every way out (callbacks do not
        # read it); `halted` is read after each callback, as a callback may set it.
        run = self.events_run
        budget = self.event_budget
        try:
            while True:
                if not near:
                    if not far or far[0][0] > until_ns:
                        break
                    # Move the horizon past the earliest far event, and what is due before
                    # it over (in order: the far heap pops them smallest first).
                    horizon = self.horizon = far[0][0] + HORIZON_NS
                    while far and far[0][0] < horizon:
                        near.append(pop(far))  # (ascending: a valid heap as it is)
                if near[0][0] > until_ns:
                    break
                when, _, function, argument = pop(near)
                self.now = when
                run += 1
                function(argument)
                if self.halted or run > budget:
                    return
        finally:
            self.events_run = run
        if self.now < until_ns:
            self.now = until_ns

    def pending(self) -> int:
        return len(self._near) + len(self._far)


_push = heapq.heappush


TraceRecord = str | tuple[int, str, str, object, bytes]
"""A line not yet hashed: a rendered text line, or a delivery ``(now, src, dst, message,
wire bytes)`` (see `Trace.records`)."""


class Trace:
    """The readable log of a run: one line per event, hashed in order.

    Keeps the last `tail` lines for failure reports, and every line only when `keep_all`
    (for `--trace FILE`), so long sweeps do not hold whole traces in memory.

    Message deliveries (`message`) are the bulk of a trace; they are hashed by their wire
    bytes and rendered as text only when a line is read (`tail`, `lines`), so a sweep never
    formats a message nobody looks at. The hash therefore covers every event's time and
    text, and for a message its exact bytes: a text line hashes as ``line + "\n"``, a
    delivery as ``f"t={now} {src}->{dst} "`` + its bytes + ``"\n"``.

    Lines are recorded as they happen and hashed in batches of `_BATCH` (the digest of a
    concatenation is the digest of its pieces fed in order, so `hexdigest` is the same as
    one update per line): recording a delivery is one tuple appended to a list, which a
    hot caller may do itself (`records`). Reading `hexdigest`, `tail`, `lines` or `count`
    first hashes whatever is recorded.
    """

    __slots__ = ("_done", "_hash", "_lines", "_records", "_tail", "loop")

    _BATCH = 512
    """Records gathered before they are hashed."""

    def __init__(self, loop: EventLoop, *, keep_all: bool = False, tail: int = 40) -> None:
        self.loop = loop
        self._hash = hashlib.sha256()
        self._records: list[TraceRecord] = []
        self._tail: deque[TraceRecord] = deque(maxlen=tail)
        self._lines: list[str] | None = [] if keep_all else None
        self._done = 0
        """Records already hashed."""

    def __call__(self, text: str) -> None:
        records = self._records
        records.append(_line(self.loop.now, text))
        if len(records) >= self._BATCH:
            self._flush()

    def message(self, src: str, dst: str, message: object, data: bytes) -> None:
        """Trace ``f"{src}->{dst} {message}"`` where `data` is the message's wire encoding."""
        records = self._records
        records.append((self.loop.now, src, dst, message, data))
        if len(records) >= self._BATCH:
            self._flush()

    def records(self) -> tuple[list[TraceRecord], int, Callable[[], None]]:
        """(the record list, the batch size, the flush function), for a hot caller that
        inlines `message`: it must append ``(loop.now, src, dst, message, data)`` and call
        the flush function once the list holds the batch size or more, exactly as `message`
        does (`SimNetwork`'s deliveries: one call less per message)."""
        return self._records, self._BATCH, self._flush

    def _flush(self) -> None:
        records = self._records
        if not records:
            return
        parts: list[bytes] = []
        lines = self._lines
        for item in records:
            if isinstance(item, str):
                parts += (item.encode(), b"\n")
                if lines is not None:
                    lines.append(item)
            else:
                now, src, dst, message, data = item
                parts += (f"t={now} {src}->{dst} ".encode(), data, b"\n")
                if lines is not None:
                    lines.append(_line(now, f"{src}->{dst} {message}"))
        self._hash.update(b"".join(parts))
        self._tail.extend(records)
        self._done += len(records)
        records.clear()

    @property
    def count(self) -> int:
        """Lines traced so far."""
        return self._done + len(self._records)

    @property
    def lines(self) -> list[str] | None:
        """Every line so far with `keep_all`, else None."""
        self._flush()
        return self._lines

    def hexdigest(self) -> str:
        self._flush()
        return self._hash.hexdigest()

    def tail(self) -> list[str]:
        self._flush()
        return [
            item if isinstance(item, str) else _line(item[0], f"{item[1]}->{item[2]} {item[3]}")
            for item in self._tail
        ]


def _line(now: int, text: str) -> str:
    return f"t={now // 1_000_000}.{now % 1_000_000:06d}ms {text}"

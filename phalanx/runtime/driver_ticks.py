"""The driver's ticks: the ticker task, and a coarser tick while the node is idle.

Owns: `TickPacing`, a base class of `phalanx.runtime.driver.Driver` (like `CallAdmission`):
the task that turns the `Ticker`'s periods into `Tick` inputs, the test hook that changes
the clock rate, and the choice of the ticker's stride.

Why a stride: every tick is a wake-up of the node (the timer, a task switch to the ticker,
a channel hop, a task switch to the core loop, a pass with its flushes): 100 a second per
node at the default 10 ms tick, most of an idle node's CPU, and at a few hundred writes a
second a tenth of a write's. While the node is *quiet* (for `QUIET_AFTER_TICKS` ticks no
client call arrived and nothing a tick could move on waits: no unanswered call, no proposal,
no held lazy message; a persisting batch ends by its own input, not a tick) the ticker
reports its periods `idle_stride` at a
time: one wake-up, `idle_stride` `Tick`s stepped in one pass and the per-tick housekeeping
(`Driver._on_tick`: status, metrics, checkpoints) done once for the pass.

Invariants: the cores still count every tick (a timeout keeps its meaning in ticks and in
wall time, it can only fire up to ``idle_stride - 1`` ticks late, never early); a client
call sets the stride back to 1 at once (`_wake_ticks`: the ticker's pending wait returns at
the next period's end), so a write's path never waits on a coarse tick; peer messages do not
count as activity (a follower's ticks only time elections and fetches). With the default
``idle_stride=1`` nothing changes. The node picks `idle_stride` from its heartbeat period
(`phalanx.runtime.node`), so an idle leader's heartbeats keep their rate.

Must not import: sockets, TLS, consensus cores.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from phalanx.consensus.core import Tick
from phalanx.runtime.ticker import Ticker

__all__ = ["MAX_CATCH_UP_TICKS", "MAX_IDLE_STRIDE", "QUIET_AFTER_TICKS", "TickPacing",
           "wall_clock_ms"]

MAX_CATCH_UP_TICKS = 5
"""Ticks the ticker delivers at once after a late wake-up (beyond its stride); a longer pause
delivers one."""

QUIET_AFTER_TICKS = 20
"""Ticks without a client call (and with nothing waiting) after which a node is quiet."""

MAX_IDLE_STRIDE = 5
"""The largest stride a node uses while quiet (a larger `idle_stride` is capped to it)."""


def wall_clock_ms() -> int:
    """The system's wall clock, ms since the Unix epoch (what `Tick.now_ms` carries)."""
    return time.time_ns() // 1_000_000


class TickPacing:
    """The tick task and the stride choice (see the module docstring). Set up by
    `_init_pacing`; `Driver` calls `_pace` after a pass's ticks and `_wake_ticks` on
    every client call."""

    _ticks: int
    _tick_seconds: float
    _put: Callable[[Tick], Awaitable[None]]

    def _init_pacing(self, tick_seconds: float, idle_stride: int,
                     wall_clock: Callable[[], int] = wall_clock_ms) -> None:
        if idle_stride < 1:
            raise ValueError(f"idle_stride must be >= 1, got {idle_stride}")
        self._tick_period = tick_seconds
        self._idle_stride = min(idle_stride, MAX_IDLE_STRIDE)
        self._pacer: Ticker | None = None
        self._wall_clock = wall_clock  # `Tick.now_ms` (tests inject a fake clock)
        self._busy_tick = 0  # the last tick at which the node was not quiet
        self.coarse_switches = 0  # times the stride went up (tests, diagnostics)

    @property
    def tick_stride(self) -> int:
        """Periods the ticker currently reports at a time (1 unless quiet)."""
        return self._pacer.stride if self._pacer is not None else 1

    def set_clock_rate(self, rate: float) -> None:
        """Test hook (`phalanx.runtime.fault_hooks`): tick every ``tick_seconds / rate`` from the
        next tick on, as if this node's clock ran `rate` times as fast as real time."""
        if not rate > 0:
            raise ValueError(f"clock rate must be > 0, got {rate}")
        self._tick_period = self._tick_seconds / rate

    async def _ticker(self) -> None:
        with Ticker(self._tick_period) as ticker:
            self._pacer = ticker
            try:
                while True:
                    if ticker.period != self._tick_period:  # `set_clock_rate` changed it
                        ticker.set_period(self._tick_period)
                    ended = await ticker.wait()
                    # Fell behind (a long pause): skip ticks, never burst.
                    if ended > MAX_CATCH_UP_TICKS + ticker.stride - 1:
                        ended = 1
                    now_ms = self._wall_clock()
                    for _ in range(ended):
                        await self._put(Tick(now_ms=now_ms))
            finally:
                self._pacer = None

    def _wake_ticks(self) -> None:
        """A client call: not quiet; report every period again from the next one."""
        self._busy_tick = self._ticks
        pacer = self._pacer
        if pacer is not None and pacer.stride != 1:
            pacer.set_stride(1)

    def _pace(self, waiting: bool) -> None:
        """After a pass's ticks: the stride for the next wake-ups. `waiting`: something
        waits for the core or the disk (see the module docstring)."""
        pacer = self._pacer
        if pacer is None or self._idle_stride == 1:
            return
        if waiting:
            self._busy_tick = self._ticks
        stride = self._idle_stride if self._ticks - self._busy_tick >= QUIET_AFTER_TICKS else 1
        if stride != pacer.stride:
            if stride > 1:
                self.coarse_switches += 1
            pacer.set_stride(stride)

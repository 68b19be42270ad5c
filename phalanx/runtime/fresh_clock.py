"""A fresh clock reading before a core acts after a gap (`ProtocolSpec.deadline_clock`).

Owns: `FreshClock`, which the driver (`phalanx.runtime.driver.Driver._handle`) asks before
every input other than a `Tick` whether the core's last wall-clock reading (the `Tick.now_ms`
of the last `Tick` it was stepped with) is stale, and which then hands out a `Tick` carrying
the current time to step first. `STALE_CLOCK_TICKS`, the gap that counts as stale. (Per
input, not per pass: a pass may start with a tick the ticker queued before the pause.)

Why: a core that compares the wall clock with absolute deadlines (the leaderless core: a
transaction is endorsed only before its deadline, conflicting ones count as expired after
theirs) knows the time only from its last `Tick`. After a long gap (a paused process:
SIGSTOP, the Jepsen ``pause`` nemesis; a stalled event loop; a long pass) the first inputs a
pass takes are usually peer messages and client calls that queued meanwhile, while the
ticker's own catch-up `Tick` comes behind them: without a fresh reading the core would judge
them by a clock that is seconds old (endorse a transaction whose deadline has passed). The
simulator does the same on `resume` (`phalanx.jepsen.sim.node.SimNode`).

Invariants: only for a core that asked for it (the driver holds no `FreshClock` otherwise,
so Raft's and PBFT's inputs, ticks and traces are untouched); the extra `Tick` is an
ordinary one (counted, housekeeping run at the end of the pass, as the ticker's), stepped
only when the reading is more than `STALE_CLOCK_TICKS` ticks old, which the ticker's normal
pace (a quiet node's stride of at most `MAX_IDLE_STRIDE` ticks, catch-up after a late
wake-up) never leaves it. A wall clock that steps backwards (NTP) makes no extra tick.

Must not import: sockets, trio, consensus cores.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Tick
from phalanx.runtime.driver_ticks import MAX_IDLE_STRIDE, wall_clock_ms

__all__ = ["STALE_CLOCK_TICKS", "FreshClock"]

STALE_CLOCK_TICKS = 2 * MAX_IDLE_STRIDE
"""A reading older than this many ticks is stale (100 ms at the default 10 ms tick)."""


class FreshClock:
    """Tracks the core's last clock reading; `stale_tick` says when it needs a fresh one.

    Args:
        tick_seconds: the driver's tick period.
        read: the wall clock in ms (tests inject a fake one; the driver's ticker reads the
            same function, so both agree).
    """

    __slots__ = ("_last_ms", "_stale_ms", "read", "ticks")

    def __init__(self, tick_seconds: float, read: Callable[[], int] = wall_clock_ms) -> None:
        self.read = read
        self._stale_ms = max(1, round(STALE_CLOCK_TICKS * tick_seconds * 1000))
        self._last_ms: int | None = None
        self.ticks = 0
        """Fresh ticks handed out (diagnostics, tests)."""

    @property
    def stale_after_ms(self) -> int:
        return self._stale_ms

    def stepped(self, tick: Tick) -> None:
        """The core was stepped with `tick`."""
        if tick.now_ms is not None:
            self._last_ms = tick.now_ms

    def stale_tick(self) -> Tick | None:
        """A `Tick` with the current time if the core's reading is stale (or it has none
        yet), else None."""
        now = self.read()
        last = self._last_ms
        if last is not None and now - last <= self._stale_ms:
            return None
        self.ticks += 1
        self._last_ms = now  # (while storage is unavailable, ticks are not stepped)
        return Tick(now_ms=now)

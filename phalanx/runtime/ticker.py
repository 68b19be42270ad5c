"""Periodic ticks for the runtime driver, from a Linux timerfd when there is one.

Owns: `Ticker`, the wall-clock source of the driver's `Tick`s. `Ticker.wait()` returns how
many periods ended since the last call (at least 1).

Why not `trio.sleep_until` per tick: each such sleep opens a cancel scope whose deadline
then cancels it, delivering and catching a `Cancelled` exception: about twice the CPU per
tick of waiting on a periodic timerfd (one epoll registration and one `read`; docs/BENCHMARKS.md,
design measurements). At 100 ticks a second on every node of a cluster sharing two
cores, that difference is CPU the nodes' write path does not get. `os.timerfd_create`
(Python 3.13+) is used when present, else the C library's through ctypes; where neither
works (not Linux) the ticker falls back to `trio.sleep_until` with the same semantics.

Semantics (both implementations): periods are counted from `start` on the monotonic clock,
never drift with the time spent handling ticks, and `set_period` takes effect from the next
period. A wait that returns late reports every period that ended meanwhile; the caller
decides whether to catch up or to skip (the driver skips a long pause instead of bursting).

Strides (fewer wake-ups while idle): `set_stride(n)` makes `wait` return only every `n`
periods (reporting the `n` that ended), on the same grid of periods: a stride never changes
how many periods are counted, only when they are reported, and never reports one before it
ended. Lowering the stride takes effect at once: the pending wait returns at the end of the
next period not yet reported (at once if it already ended). With a timerfd the timer is armed
at absolute grid points (`TFD_TIMER_ABSTIME`) with an interval of `n` periods, so a stride
costs one `timerfd_settime` per change and nothing per wake-up but a late one that reported
a part stride (re-armed, so the next wait still waits a whole stride); the fallback moves the
deadline of its sleep.

Must not import: consensus cores, storage, sockets. Runs only under trio with the real clock
(the deterministic simulator never runs the driver).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import struct
import time
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["Ticker"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_NANOS = 1_000_000_000

_Arm = Callable[[int, int, int], None]
"""``arm(fd, first_ns, interval_ns)``: expire at CLOCK_MONOTONIC time `first_ns`, then
every `interval_ns`."""


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


def _libc_timerfd() -> tuple[Callable[[], int], _Arm] | None:
    """(create, arm) through the C library, or None where it has no timerfd."""
    try:
        libc: Any = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create_fn, settime_fn = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None

    def create() -> int:
        fd = int(create_fn(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return fd

    def arm(fd: int, first_ns: int, interval_ns: int) -> None:
        spec = _ITimerSpec(
            _TimeSpec(interval_ns // _NANOS, interval_ns % _NANOS),
            _TimeSpec(first_ns // _NANOS, first_ns % _NANOS),
        )
        if settime_fn(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    return create, arm


def _os_timerfd() -> tuple[Callable[[], int], _Arm] | None:
    create_fn = getattr(os, "timerfd_create", None)
    settime_fn = getattr(os, "timerfd_settime_ns", None)
    if create_fn is None or settime_fn is None:
        return None

    def create() -> int:
        return int(create_fn(_CLOCK_MONOTONIC, flags=os.O_NONBLOCK | os.O_CLOEXEC))

    def arm(fd: int, first_ns: int, interval_ns: int) -> None:
        settime_fn(fd, flags=_TFD_TIMER_ABSTIME, initial=first_ns, interval=interval_ns)

    return create, arm


class Ticker:
    """Counts `period`-second periods (see the module docstring). Use as a context manager
    (closes its descriptor); `wait` only inside a trio run.

    Args:
        period: seconds per tick (> 0).
        use_timerfd: False forces the portable `trio.sleep_until` implementation (tests).
    """

    def __init__(self, period: float, *, use_timerfd: bool = True) -> None:
        self._period = _check(period)
        self._period_ns = max(1, round(period * _NANOS))
        self._stride = 1
        self._fd: int | None = None
        self._arm: _Arm | None = None
        self._sleep_scope: trio.CancelScope | None = None  # the fallback's pending sleep
        if use_timerfd:
            api = _os_timerfd() or _libc_timerfd()
            if api is not None:
                create, arm = api
                try:
                    fd = create()
                except OSError:
                    pass
                else:
                    self._fd, self._arm = fd, arm
        self._origin_ns = time.monotonic_ns()  # the grid: period k ends at origin + k*period
        self._reported = 0  # periods reported by `wait` so far
        self._rearm()

    @property
    def uses_timerfd(self) -> bool:
        return self._fd is not None

    @property
    def period(self) -> float:
        return self._period

    @property
    def stride(self) -> int:
        return self._stride

    def set_period(self, period: float) -> None:
        """Tick every `period` seconds from now on (the current period restarts)."""
        self._period = _check(period)
        self._period_ns = max(1, round(period * _NANOS))
        self._origin_ns, self._reported = time.monotonic_ns(), 0
        self._rearm()

    def set_stride(self, stride: int) -> None:
        """Report periods `stride` at a time from now on (see the module docstring)."""
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        if stride != self._stride:
            self._stride = stride
            self._rearm()

    def _next_ns(self) -> int:
        """When the pending wait is due: the end of period `reported + stride`."""
        return self._origin_ns + (self._reported + self._stride) * self._period_ns

    def _rearm(self) -> None:
        if self._fd is not None and self._arm is not None:
            self._arm(self._fd, self._next_ns(), self._stride * self._period_ns)
        elif self._sleep_scope is not None:
            self._sleep_scope.deadline = self._trio_deadline()

    def _trio_deadline(self) -> float:
        # trio's clock is the monotonic clock plus an offset: convert through "now".
        return trio.current_time() + (self._next_ns() - time.monotonic_ns()) / _NANOS

    def _take(self) -> int:
        """Report the periods that ended since the last report (0 if none did)."""
        ended = (time.monotonic_ns() - self._origin_ns) // self._period_ns - self._reported
        if ended <= 0:
            return 0
        self._reported += ended
        return ended

    async def wait(self) -> int:
        """Wait for the current period to end; the number of periods that ended (>= 1)."""
        fd = self._fd
        if fd is None:
            return await self._sleep()
        while True:
            # Wait first: the last read emptied the timer, and the next expiry has almost
            # always not come yet, so reading first would cost a failing `read` (a syscall
            # and a BlockingIOError) per wake-up. An expiry that already came makes the
            # descriptor readable at once.
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, 8)
            except BlockingIOError:  # a spurious wake-up: wait again
                continue
            (expirations,) = struct.unpack("=Q", data)
            if expirations:
                ended = self._take()
                if ended:
                    if ended % self._stride:
                        # A late wake-up reported a part stride: the timer's grid of
                        # stride-long intervals no longer ends the next stride, re-arm it.
                        self._rearm()
                    return ended

    async def _sleep(self) -> int:
        while True:
            with trio.move_on_at(self._trio_deadline()) as scope:
                self._sleep_scope = scope
                try:
                    await trio.sleep_forever()
                finally:
                    self._sleep_scope = None
            ended = self._take()
            if ended:
                return ended
            # trio's clock ran ahead of the grid by a rounding error: wait for the rest.
            await trio.sleep(max(0.0, (self._next_ns() - time.monotonic_ns()) / _NANOS))
            ended = self._take()
            if ended:
                return ended

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: outside trio
                trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(period: float) -> float:
    if not (period > 0 and math.isfinite(period)):
        raise ValueError(f"period must be > 0, got {period}")
    return period

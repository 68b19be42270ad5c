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

Must not import: consensus cores, storage, sockets. Runs only under trio with the real clock
(the deterministic simulator never runs the driver).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["Ticker"]

_CLOCK_MONOTONIC = 1
_NANOS = 1_000_000_000


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


def _libc_timerfd() -> tuple[Callable[[], int], Callable[[int, float], None]] | None:
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

    def arm(fd: int, period: float) -> None:
        nanos = max(1, round(period * _NANOS))
        spec = _TimeSpec(nanos // _NANOS, nanos % _NANOS)
        if settime_fn(fd, 0, ctypes.byref(_ITimerSpec(spec, spec)), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    return create, arm


def _os_timerfd() -> tuple[Callable[[], int], Callable[[int, float], None]] | None:
    create_fn = getattr(os, "timerfd_create", None)
    settime_fn = getattr(os, "timerfd_settime", None)
    if create_fn is None or settime_fn is None:
        return None

    def create() -> int:
        return int(create_fn(_CLOCK_MONOTONIC, flags=os.O_NONBLOCK | os.O_CLOEXEC))

    def arm(fd: int, period: float) -> None:
        settime_fn(fd, initial=period, interval=period)

    return create, arm


class Ticker:
    """Counts `period`-second periods (see the module docstring). Use as a context manager
    (closes its descriptor); `wait` only inside a trio run.

    Args:
        period: seconds per tick (> 0).
        use_timerfd: False forces the portable `trio.sleep_until` implementation (tests).
    """

    def __init__(self, period: float, *, use_timerfd: bool = True) -> None:
        if not period > 0:
            raise ValueError(f"period must be > 0, got {period}")
        self._period = period
        self._fd: int | None = None
        self._arm: Callable[[int, float], None] | None = None
        self._deadline: float | None = None  # the sleep_until fallback's next deadline
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
                    arm(fd, period)

    @property
    def uses_timerfd(self) -> bool:
        return self._fd is not None

    @property
    def period(self) -> float:
        return self._period

    def set_period(self, period: float) -> None:
        """Tick every `period` seconds from now on (the current period restarts)."""
        if not period > 0:
            raise ValueError(f"period must be > 0, got {period}")
        self._period = period
        if self._fd is not None and self._arm is not None:
            self._arm(self._fd, period)
        else:
            self._deadline = None

    async def wait(self) -> int:
        """Wait for the current period to end; the number of periods that ended (>= 1)."""
        fd = self._fd
        if fd is None:
            return await self._sleep()
        while True:
            # Wait first: the last read emptied the timer, and the next period has almost
            # always not ended yet, so reading first would cost a failing `read` (a syscall
            # and a BlockingIOError) per tick. A period that already ended makes the
            # descriptor readable at once.
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, 8)
            except BlockingIOError:  # a spurious wake-up: wait again
                continue
            (expirations,) = struct.unpack("=Q", data)
            if expirations:
                return int(expirations)

    async def _sleep(self) -> int:
        now = trio.current_time()
        if self._deadline is None:
            self._deadline = now + self._period
        if now < self._deadline:
            await trio.sleep_until(self._deadline)
            now = trio.current_time()
        ended = max(1, int((now - self._deadline) // self._period) + 1)
        self._deadline += ended * self._period
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

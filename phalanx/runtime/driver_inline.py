"""Stepping a peer's message in the task that read it, while the core loop is idle.

Owns: `InlineSteps`, a base class of `phalanx.runtime.driver.Driver` (like `TickPacing`):
the driver's peer input: `deliver` (through the input channel), `deliver_inline` (the
transport's `deliver` in a node) and `end_inline_pass` (the transport's `after_read`:
called after the frames of one read were delivered, before the reading task waits again).

Why: a peer message handed to the core loop through the input channel costs two trio task
switches on the receiving node (the reading task wakes on the socket, puts the message, and
the core loop wakes in the next scheduler batch; each batch is also an ``epoll_wait``).
At one client every message of a write's exchange arrives at an idle node, so that second
switch is on the write's path and in its CPU. Here the reading task steps the core itself
and runs the end of the pass (proposals, persistence, replies, the pass's sends): one
wake-up per message read instead of two.

Rules (the driver's single-owner rule restated):
    * A message is stepped inline only while the core loop is parked on an EMPTY input
      channel with nothing handed to it (`tasks_waiting_receive`): no other pass is running
      or due, so this pass is the only one, and no input queued before it is overtaken.
      Otherwise it goes through the channel as before; once any input was handed to the
      core loop, every later one follows it there, so inputs keep their order.
    * An inline pass is synchronous: the frames of one read are stepped (all of them, one
      pass: a read's messages still make one batch of sends and one persistence), then
      `end_inline_pass` runs the pass's end, and only then does the reading task wait
      again. No other task runs between, so no other task sees the core mid-pass. Should
      one run anyway (a caller that yields between `deliver_inline` and `end_inline_pass`),
      the core loop's own pass ends the open one; ending a pass twice does nothing harmful
      (every step of a pass's end works on what is left to do).
    * An inline pass whose persistence must first let written-but-unsent output go (the
      driver's `_flush_again`: the writer tasks must run before an fsync blocks the loop)
      wakes the core loop (`WAKE`), which yields and writes, as after its own passes.
    * A client connection's calls of one read (`Driver.calls`) are stepped in its reading
      task, pass ended at once, only if moreover no call waits for an answer (an idle
      node: one closed-loop client). With calls waiting (several clients) they go through
      the channel, where one pass batches several connections' calls into one proposal.
      Ticks and persistence completions always go through the channel.

Must not import: sockets, TLS, consensus cores.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from phalanx.consensus.core import Receive
from phalanx.consensus.types import Message, NodeId
from phalanx.net.client_protocol import ClientCall, ClientReply
from phalanx.runtime.driver_stats import DriverStatistics
from phalanx.runtime.waiters import ClientWaiters

__all__ = ["WAKE", "InlineSteps"]


class _Wake:
    """The input that wakes the core loop after an inline pass; it steps nothing."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "WAKE"


WAKE = _Wake()


class InlineSteps:
    """`deliver_inline` and `end_inline_pass` (see the module docstring). `Driver` provides
    the state declared here and `_end_pass` (the end of a core-loop pass)."""

    stats: DriverStatistics
    _tx: trio.MemorySendChannel[Any]
    _rx: trio.MemoryReceiveChannel[Any]
    _flush_again: bool
    _just_yielded: bool
    _inline_start: float | None
    _handle: Callable[[Any], None]
    _end_pass: Callable[[float], None]
    _put: Callable[[Any], Awaitable[None]]
    _waiters: ClientWaiters

    async def deliver(self, src: NodeId, message: object) -> None:
        """A peer's message, through the input channel (waits while the core is busy)."""
        if not isinstance(message, Message) or isinstance(message, ClientCall | ClientReply):
            self.stats.dropped_peer_messages += 1
            return
        await self._put(Receive(src=src, message=message))

    def _core_parked(self) -> bool:
        """Whether the core loop waits on an empty channel with nothing handed to it."""
        return self._rx.statistics().tasks_waiting_receive > 0

    async def deliver_inline(self, src: NodeId, message: object) -> None:
        """A peer's message, stepped in the calling task if the core loop is idle (then the
        caller must call `end_inline_pass` before it yields), else queued as `deliver`."""
        if not isinstance(message, Message) or isinstance(message, ClientCall | ClientReply):
            self.stats.dropped_peer_messages += 1
            return
        item = Receive(src=src, message=message)
        if self._inline_start is None:
            if not self._core_parked():
                await self._put(item)
                return
            self._inline_start = time.perf_counter()
            self._just_yielded = False
            self.stats.inline_passes += 1
        self.stats.inline_inputs += 1
        self._handle(item)

    def _calls_inline(self, item: Any) -> bool:
        """Step a connection's calls of one read (`CallsInput`) and end the pass, in the
        calling task, if the core loop is parked and no call is waiting for an answer;
        whether it did (else the caller queues them)."""
        if self._inline_start is not None or len(self._waiters) or not self._core_parked():
            return False
        self._inline_start = time.perf_counter()
        self._just_yielded = False
        self.stats.inline_passes += 1
        self.stats.inline_calls += 1
        self._handle(item)
        self.end_inline_pass()
        return True

    def end_inline_pass(self) -> None:
        """End the pass `deliver_inline` opened, if one is open: proposals, persistence,
        replies and sends, as the core loop ends its passes. Never blocks."""
        start = self._inline_start
        if start is None:
            return
        self._inline_start = None
        self._end_pass(start)
        if self._flush_again:  # the core loop yields to the writers, then persists
            # A full channel wakes it anyway; a closed one: the driver stopped.
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._tx.send_nowait(WAKE)

"""The driver's idle stride (`phalanx.runtime.driver_ticks`): a quiet node wakes once per
`idle_stride` ticks and still steps every tick; a client call brings every tick back at once.

The core counts the `Tick`s it is stepped with; the observer counts `on_status`, which the
driver calls once per pass that stepped ticks (one wake-up of the ticker). Synchronisation
is by `wait_for` on those counters, never by elapsed time.
"""

from __future__ import annotations

import pytest
import trio
from runtime_helpers import wait_for
from test_driver_pipeline import GatedCommitter, ScriptedCore, Sink, call

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Ready, Tick
from phalanx.net.client_protocol import StatusReply
from phalanx.runtime.driver import Driver
from phalanx.runtime.driver_ticks import QUIET_AFTER_TICKS
from phalanx.storage.memory import MemoryDisk

TICK = 0.002


class TickCountingCore(ScriptedCore):
    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.ticks = 0

    def step(self, inp: Input, /) -> Ready:
        if isinstance(inp, Tick):
            self.ticks += 1
        return super().step(inp)


class Passes:
    """A `DriverObserver` that counts the passes that stepped ticks."""

    def __init__(self) -> None:
        self.count = 0

    def on_fsync(self, seconds: float, readys: int) -> None:
        pass

    def on_applied(self, entries: int, applied_index: int, commit_index: int) -> None:
        pass

    def on_status(self, status: CoreStatus, applied_index: int) -> None:
        self.count += 1


def build(role: str, idle_stride: int) -> tuple[Driver, TickCountingCore, Passes]:
    """A driver as the node runs it (a stride, an observer) around a counting core."""
    core, passes = TickCountingCore(role), Passes()

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    driver = Driver(core=core, replica=replica, committer=GatedCommitter(),
                    send=lambda to, message: True, tick_seconds=TICK,
                    status_reply=status_reply, propose_batch=core.propose, observer=passes,
                    idle_stride=idle_stride)
    return driver, core, passes


async def test_a_quiet_node_steps_every_tick_in_fewer_wake_ups() -> None:
    driver, core, passes = build("follower", idle_stride=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: driver.tick_stride == 4, what="the idle stride")
        assert core.ticks >= QUIET_AFTER_TICKS
        ticks, count = core.ticks, passes.count
        await wait_for(lambda: passes.count >= count + 20, what="20 coarse wake-ups")
        # Each wake-up stepped the stride's ticks (more when it woke late), never fewer.
        assert core.ticks - ticks >= 4 * (passes.count - count - 1)
        assert driver.coarse_switches == 1
        nursery.cancel_scope.cancel()


async def test_a_client_call_brings_every_tick_back_until_it_is_answered() -> None:
    driver, core, _ = build("leader", idle_stride=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: driver.tick_stride == 4, what="the idle stride")
        await driver.call(call(1), Sink())
        await wait_for(lambda: bool(core.proposals), what="the proposal")
        # Back to one tick per wake-up as soon as the call was handled, and for as long as
        # it waits (this core never commits it).
        assert driver.tick_stride == 1
        ticks = core.ticks
        await wait_for(lambda: core.ticks >= ticks + 2 * QUIET_AFTER_TICKS, what="ticks")
        assert driver.tick_stride == 1
        assert driver.coarse_switches == 1
        nursery.cancel_scope.cancel()


async def test_without_a_stride_every_tick_is_a_wake_up() -> None:
    driver, core, _ = build("follower", idle_stride=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: core.ticks >= 2 * QUIET_AFTER_TICKS, what="ticks")
        assert driver.tick_stride == 1
        assert driver.coarse_switches == 0
        nursery.cancel_scope.cancel()


def test_the_stride_is_capped_and_must_be_positive() -> None:
    with pytest.raises(ValueError, match="idle_stride"):
        build("follower", idle_stride=0)
    driver, _, _ = build("follower", idle_stride=50)
    assert driver._idle_stride == 5

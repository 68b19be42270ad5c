"""The runtime driver's fresh clock (`phalanx.runtime.fresh_clock`) around a real leaderless
core, with a fake wall clock: after a gap (a paused process), the core is stepped with a
`Tick` carrying the current time before the inputs that queued meanwhile, so it does not
endorse a transaction whose deadline passed during the pause.

The fake clock stands still while the driver ticks (every tick carries the same reading), so
the only way the core can learn of the jump is the fresh tick. Synchronisation is by
`wait_for` on what the core was stepped with, never by elapsed time. (Here, beside the
core's test harness, which builds the core and signs transactions.)
"""

from __future__ import annotations

import pytest
import trio
from leaderless_harness import EPOCH, REGISTRY, make_tx, sent_endorsements, solo, tx_id

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Ready, Receive, Tick
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.types import NodeId
from phalanx.net.client_protocol import StatusReply
from phalanx.runtime.driver import Driver
from phalanx.runtime.fresh_clock import STALE_CLOCK_TICKS
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.memory import MemoryDisk

TICK = 0.005
PEER = NodeId("n2")


class Recording:
    """The leaderless core, recording every input it is stepped with and its Ready."""

    def __init__(self, core: LeaderlessCore) -> None:
        self.core = core
        self.node_id = core.node_id
        self.steps: list[tuple[Input, Ready]] = []

    def step(self, inp: Input, /) -> Ready:
        ready = self.core.step(inp)
        self.steps.append((inp, ready))
        return ready

    def status(self) -> CoreStatus:
        return self.core.status()

    def ticks(self) -> list[Tick]:
        return [inp for inp, _ in self.steps if isinstance(inp, Tick)]


def build(fresh_clock: bool) -> tuple[Driver, Recording, list[int]]:
    core, _ = solo("n1")
    recording = Recording(core)
    clock = [EPOCH]
    disk = MemoryDisk("n1").open()
    persister = ReadyPersister(wal=disk.wal, hard_state=disk.hard_state,
                               checkpoints=disk.checkpoints, codec=REGISTRY,
                               core_state=MemoryDisk("n1-core").open().hard_state)

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    driver = Driver(core=recording, replica=replica,
                    committer=GroupCommitter(persister, install=None, saved=None),
                    send=lambda to, message: True, tick_seconds=TICK,
                    status_reply=status_reply, fresh_clock=fresh_clock,
                    wall_clock=lambda: clock[0])
    return driver, recording, clock


async def deliver_after_pause(fresh_clock: bool, pause_ms: int) -> tuple[Recording, Driver]:
    """Run the driver until the core has ticked at `EPOCH`; then the clock jumps by
    `pause_ms` and, before any task runs, a peer relays a transaction whose deadline
    (EPOCH + 100 ms) lies inside the jump."""
    driver, recording, clock = build(fresh_clock)
    tx = make_tx("add k 1", deadline=EPOCH + 100)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        with trio.fail_after(10):
            while len(recording.ticks()) < 3:  # noqa: ASYNC110
                await trio.sleep(TICK)
        clock[0] = EPOCH + pause_ms  # the process was stopped; it runs again
        await driver.deliver(PEER, tx)  # queued without yielding: first in the channel
        with trio.fail_after(10):
            while not any(isinstance(inp, Receive) for inp, _ in recording.steps):  # noqa: ASYNC110
                await trio.sleep(TICK)
        nursery.cancel_scope.cancel()
    return recording, driver


def endorsed(recording: Recording) -> bool:
    """Whether the step of the relayed transaction endorsed it."""
    for inp, ready in recording.steps:
        if isinstance(inp, Receive):
            wanted = tx_id(inp.message)  # type: ignore[arg-type]
            return any(e.tx_id == wanted for e in sent_endorsements(ready))
    raise AssertionError("the transaction was never stepped")


async def test_after_a_pause_the_core_reads_the_clock_before_the_queued_message() -> None:
    recording, driver = await deliver_after_pause(fresh_clock=True, pause_ms=10_000)
    index = next(i for i, (inp, _) in enumerate(recording.steps) if isinstance(inp, Receive))
    before = recording.steps[index - 1][0]
    assert before == Tick(now_ms=EPOCH + 10_000)
    assert not endorsed(recording)  # its deadline passed during the pause
    assert driver.fresh_clock is not None
    assert driver.fresh_clock.ticks == 1


async def test_without_the_fresh_clock_a_stale_core_endorses_an_expired_transaction() -> None:
    # The control: what the fresh tick prevents (the core judged the deadline by a reading
    # from before the pause).
    recording, _ = await deliver_after_pause(fresh_clock=False, pause_ms=10_000)
    index = next(i for i, (inp, _) in enumerate(recording.steps) if isinstance(inp, Receive))
    assert recording.steps[index - 1][0] == Tick(now_ms=EPOCH)
    assert endorsed(recording)


async def test_a_short_gap_steps_no_extra_tick() -> None:
    # Within the stale bound (what a quiet node's stride leaves between ticks) nothing is
    # added: the transaction is judged by the last tick, and endorsed.
    gap = int(STALE_CLOCK_TICKS * TICK * 1000) // 2
    recording, driver = await deliver_after_pause(fresh_clock=True, pause_ms=gap)
    assert driver.fresh_clock is not None
    assert driver.fresh_clock.ticks == 0
    index = next(i for i, (inp, _) in enumerate(recording.steps) if isinstance(inp, Receive))
    assert all(inp == Tick(now_ms=EPOCH) for inp, _ in recording.steps[:index])
    assert endorsed(recording)


@pytest.mark.parametrize("back_ms", [0, -5_000])
def test_a_clock_that_stands_still_or_steps_back_needs_no_fresh_reading(back_ms: int) -> None:
    driver, _, clock = build(fresh_clock=True)
    fresh = driver.fresh_clock
    assert fresh is not None
    assert fresh.stale_tick() == Tick(now_ms=EPOCH)  # no reading yet: one now
    fresh.stepped(Tick(now_ms=EPOCH))
    clock[0] = EPOCH + back_ms
    assert fresh.stale_tick() is None
    assert fresh.ticks == 1

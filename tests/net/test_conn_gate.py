"""`ConnectionGate`'s handshake rate limit under a full pending set (trio's mock clock).

The attack (bench/attack_handshakes.py): under a flood, the 64 handshakes of the pending set
all waited for the rate limit's token by polling it, so every token woke all of them; the
leader's scheduler batches filled with those wakeups (tens of ms each, on a loaded 2-core
box) and its heartbeats left late enough to lose leadership. Now one waiter sleeps and the
others are parked; tokens go to the newest waiter (the pending set sheds the oldest).
"""

from __future__ import annotations

import trio
import trio.testing

from phalanx.net.conn_gate import ConnectionGate


class StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_waiters_for_the_rate_limit_cost_one_wakeup_per_token(
        autojump_clock: trio.testing.MockClock) -> None:
    gate = ConnectionGate(max_connections=1000, max_pending=1000, handshake_rate=10.0,
                          handshake_burst=1)
    waiters = 50
    order: list[int] = []
    counter = StepCounter()

    async def handshake(n: int) -> None:
        await gate.wait_turn()
        order.append(n)

    trio.lowlevel.add_instrument(counter)
    try:
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for n in range(waiters):
                nursery.start_soon(handshake, n)
                await trio.testing.wait_all_tasks_blocked()  # they arrive in this order
    finally:
        trio.lowlevel.remove_instrument(counter)
    # The first takes the burst token; then newest first.
    assert order == [0, *range(waiters - 1, 0, -1)]
    assert trio.current_time() - start >= (waiters - 1) / 10.0 - 1e-6  # the rate holds
    assert gate.stats.rate_waits == waiters - 1
    # Polling waiters took ~waiters^2 / 2 (1,250) steps; queued ones a few each.
    assert counter.steps < 5 * waiters, counter.steps


async def test_a_shed_timer_hands_over_and_the_newest_waiter_gets_the_token(
        autojump_clock: trio.testing.MockClock) -> None:
    gate = ConnectionGate(max_connections=10, max_pending=2, handshake_rate=1.0,
                          handshake_burst=1)
    done: list[str] = []

    async def handshake(name: str) -> None:
        with gate.handshaking() as scope:
            await gate.wait_turn()
            done.append(name)
            await trio.sleep(100)  # holds its pending slot
        if scope.cancelled_caught:
            done.append(f"{name} shed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handshake, "a")  # takes the burst token
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(handshake, "b")  # waits: sleeps for the next token
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(handshake, "c")  # sheds "a"; parked
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(handshake, "d")  # sheds "b", the sleeper: someone takes over
        await trio.sleep(1.5)
        assert done == ["a", "a shed", "b shed", "d"]  # one token in 1.5 s, the newest's
        await trio.sleep(1)
        assert done[-1] == "c"  # and the next one
        nursery.cancel_scope.cancel()

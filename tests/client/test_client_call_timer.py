"""The client's attempt waits (`PendingCall.next_before` + `CallTimer`): a wait ends with its
reply when one arrives, with None at its time otherwise (never early, never later than the
timer task's next run), an item already in the inbox is returned even past the time, and a
re-armed wait ignores the earlier arm. Run on trio's MockClock (virtual time)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from phalanx.client.connection import CallTimer, PendingCall
from phalanx.net.client_protocol import ClientReply, ReplyStatus

REPLY = ClientReply(client_id="c", request_no=1, status=ReplyStatus.OK, replica="n1")


def run(body: Callable[[CallTimer], Awaitable[None]]) -> None:
    async def main() -> None:
        timer = CallTimer()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            await body(timer)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_wait_ends_at_its_time_without_a_reply() -> None:
    async def body(timer: CallTimer) -> None:
        call: PendingCall[ClientReply] = PendingCall("c", 1)
        start = trio.current_time()
        assert await call.next_before(start + 1.0, timer) is None
        assert trio.current_time() == start + 1.0

    run(body)


def test_a_reply_ends_the_wait_at_once_and_a_later_arm_is_not_cut_by_the_earlier() -> None:
    async def body(timer: CallTimer) -> None:
        call: PendingCall[ClientReply] = PendingCall("c", 1)
        start = trio.current_time()

        async def reply_after(delay: float) -> None:
            await trio.sleep(delay)
            call.push("n1", REPLY)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reply_after, 0.25)
            assert await call.next_before(start + 1.0, timer) == ("n1", REPLY)
        assert trio.current_time() == start + 0.25
        # A new attempt (a later time): the first arm fires at start + 1 and is ignored.
        assert await call.next_before(start + 3.0, timer) is None
        assert trio.current_time() == start + 3.0

    run(body)


def test_an_earlier_arm_shortens_the_timer_sleep_and_items_win_over_expiry() -> None:
    async def body(timer: CallTimer) -> None:
        start = trio.current_time()
        slow: PendingCall[ClientReply] = PendingCall("c", 1)
        fast: PendingCall[ClientReply] = PendingCall("c", 2)
        ends: dict[str, float] = {}

        async def wait(name: str, call: PendingCall[ClientReply], until: float) -> None:
            assert await call.next_before(until, timer) is None
            ends[name] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "slow", slow, start + 5.0)
            await trio.sleep(0.1)
            nursery.start_soon(wait, "fast", fast, start + 0.5)
        assert ends == {"slow": start + 5.0, "fast": start + 0.5}
        # Past its time, a reply already in the inbox is still returned; then None.
        fast.push("n2", REPLY)
        assert await fast.next_before(start + 0.5, timer) == ("n2", REPLY)
        assert await fast.next_before(start + 0.5, timer) is None

    run(body)

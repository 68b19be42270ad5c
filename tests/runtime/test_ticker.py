"""Ticker: periodic ticks from a timerfd (Linux) or trio's clock, with the same semantics."""

from __future__ import annotations

import sys
import time

import pytest
import trio

from phalanx.runtime.ticker import Ticker

PERIOD = 0.005


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_each_wait_ends_a_period_and_a_late_wait_reports_every_missed_one(
        use_timerfd: bool) -> None:
    start = trio.current_time()
    with Ticker(PERIOD, use_timerfd=use_timerfd) as ticker:
        assert ticker.uses_timerfd == (use_timerfd and sys.platform == "linux")
        for _ in range(3):
            assert await ticker.wait() >= 1
        assert trio.current_time() - start >= 0.9 * 3 * PERIOD  # three periods really ended
        # Block the loop on purpose: at least five more periods end meanwhile.
        time.sleep(6 * PERIOD)  # noqa: ASYNC251
        assert await ticker.wait() >= 5


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_set_period_takes_effect(use_timerfd: bool) -> None:
    with Ticker(1000.0, use_timerfd=use_timerfd) as ticker:
        ticker.set_period(PERIOD)  # else the next wait would take 1000 s (fail_after)
        assert ticker.period == PERIOD
        with trio.fail_after(10):
            assert await ticker.wait() >= 1


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period"):
        Ticker(0.0)
    with Ticker(1.0) as ticker, pytest.raises(ValueError, match="period"):
        ticker.set_period(-1.0)


def test_close_releases_the_descriptor_once() -> None:
    ticker = Ticker(1.0)
    ticker.close()
    ticker.close()
    assert not ticker.uses_timerfd


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_a_stride_reports_its_periods_together_and_loses_none(use_timerfd: bool) -> None:
    before = time.monotonic()
    with Ticker(PERIOD, use_timerfd=use_timerfd) as ticker:
        after = time.monotonic()  # the grid of periods starts between the two readings
        ticker.set_stride(4)
        assert ticker.stride == 4
        waits = reported = 0
        while reported < 40:
            ended = await ticker.wait()
            assert ended >= 4  # never a wake-up before the stride's periods ended
            waits, reported = waits + 1, reported + ended
        now = time.monotonic()
        assert waits <= 10
        # Every period that ended was reported once: the count follows the clock, whatever
        # the stride (the period in progress, and one that ended since the last wait, are
        # not reported yet).
        assert reported <= (now - before) / PERIOD + 1e-6
        assert reported >= (now - after) / PERIOD - 2


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_a_late_wait_does_not_shorten_the_next_stride(use_timerfd: bool) -> None:
    """A wait that returns late reports the periods that ended meanwhile (6 of a stride of
    4 here); the next one still waits a whole stride. The timerfd kept its old grid of
    4-period expiries and woke the next wait 2 periods later (failed under a loaded
    `make test`: `test_a_stride_reports_its_periods_together_and_loses_none`)."""
    period = 0.05
    with Ticker(period, use_timerfd=use_timerfd) as ticker:
        ticker.set_stride(4)
        time.sleep(6.5 * period)  # noqa: ASYNC251 (the process stalls past the first stride)
        assert await ticker.wait() >= 6
        assert await ticker.wait() >= 4


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_lowering_the_stride_ends_the_pending_wait_at_the_next_period(
        use_timerfd: bool) -> None:
    period = 0.02
    with Ticker(period, use_timerfd=use_timerfd) as ticker:
        ticker.set_stride(10_000)  # a wait of 200 s unless the stride comes down
        results: list[int] = []
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                results.append(await ticker.wait())

            nursery.start_soon(waiter)
            await trio.sleep(3 * period)
            start = time.monotonic()
            ticker.set_stride(1)
            with trio.fail_after(10):
                while not results:  # noqa: ASYNC110
                    await trio.sleep(0.001)
        # The periods that ended before the change are reported, none twice, none early.
        assert results[0] >= 3
        assert results[0] <= (time.monotonic() - start) / period + 4 + 1e-6


def test_a_stride_must_be_positive() -> None:
    with Ticker(1.0) as ticker, pytest.raises(ValueError, match="stride"):
        ticker.set_stride(0)

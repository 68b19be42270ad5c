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

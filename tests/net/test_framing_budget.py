"""`InboundBudget`: many connections each holding part of a large frame cannot buffer more
than one port's budget (the attack: 100 connections with half-sent 16 MiB frames killed a
node under a 1.2 GB memory limit)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.net.framing import (
    FREE_BYTES,
    BudgetExceeded,
    FrameDecoder,
    FrameError,
    InboundBudget,
    encode_frame,
)

MIB = 1 << 20


def test_many_half_sent_frames_stay_within_the_budget() -> None:
    budget = InboundBudget(8 * MIB)
    decoders = [FrameDecoder(max_frame_size=4 * MIB, budget=budget) for _ in range(100)]
    half = encode_frame(b"x" * (4 * MIB))[: 2 * MIB]
    closed = 0
    for decoder in decoders:
        try:
            for start in range(0, len(half), 64 * 1024):
                decoder.feed(half[start:start + 64 * 1024])
        except BudgetExceeded:
            closed += 1
            assert decoder.buffered == 0
            with pytest.raises(BudgetExceeded):  # poisoned
                decoder.feed(b"x")
    assert budget.used <= budget.limit
    assert budget.peak <= budget.limit
    assert sum(d.buffered for d in decoders) <= budget.limit + 100 * FREE_BYTES
    assert closed >= 90
    assert budget.refusals == closed
    for decoder in decoders:
        decoder.release()
    assert budget.used == 0


def test_small_frames_are_never_charged() -> None:
    budget = InboundBudget(0)
    decoder = FrameDecoder(budget=budget)
    stream = b"".join(encode_frame(bytes([i]) * 60_000) for i in range(20))
    for start in range(0, len(stream), 64 * 1024):
        decoder.feed(stream[start:start + 64 * 1024])
        while decoder.next_frame() is not None:
            pass
    assert budget.used == budget.peak == budget.refusals == 0


def test_a_completed_large_frame_returns_its_charge() -> None:
    budget = InboundBudget(4 * MIB)
    decoder = FrameDecoder(budget=budget)
    frame = encode_frame(b"y" * (3 * MIB))
    decoder.feed(frame[: 2 * MIB])
    assert budget.used == 2 * MIB - FREE_BYTES
    decoder.feed(frame[2 * MIB:] + encode_frame(b"z"))
    assert decoder.next_frame() == b"y" * (3 * MIB)
    assert budget.used == 0
    assert decoder.next_frame() == b"z"


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300_000)), max_size=40))
def test_charges_always_match_buffered_bytes(ops: list[tuple[int, int]]) -> None:
    budget = InboundBudget(600_000)
    decoders = [FrameDecoder(max_frame_size=1 << 20, budget=budget) for _ in range(4)]
    frame = encode_frame(b"q" * 250_000)
    for which, size in ops:
        decoder = decoders[which]
        try:
            decoder.feed((frame * 3)[:size])
            while decoder.next_frame() is not None:
                pass
        except FrameError:
            decoder.release()
            decoders[which] = FrameDecoder(max_frame_size=1 << 20, budget=budget)
        expected = sum(max(0, d.buffered - FREE_BYTES) for d in decoders)
        assert budget.used == expected <= budget.limit

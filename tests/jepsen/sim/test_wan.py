"""The simulator's WAN model (`phalanx.jepsen.sim.wan`): the table, placement, propagation,
bandwidth queues, loss, and a WAN run end to end (deterministic, WAN-sized latencies)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.jepsen.sim.run import RunConfig, run
from phalanx.jepsen.sim.wan import SPREAD, WanConfig, WanModel, client_index, rtt_table

MS = 1_000_000


def _model(config: WanConfig, nodes: int = 5) -> WanModel:
    names = [f"n{i}" for i in range(1, nodes + 1)]
    return WanModel(config, names, random.Random(1), random.Random(2))


def test_table_holds_every_pair_of_the_spread_regions() -> None:
    table = rtt_table()
    for a in SPREAD:
        for b in SPREAD:
            if a != b:
                assert 10 < table[(a, b)] < 400, (a, b)
    five = WanConfig(regions=5)
    assert five.names == ("us-east-1", "eu-central-1", "ap-northeast-1", "ap-southeast-2",
                          "sa-east-1")
    assert five.rtt_ms(0, 1) == pytest.approx((88.66 + 88.62) / 2)  # N. Virginia-Frankfurt
    assert five.rtt_ms(2, 2) == five.intra_rtt_ms
    assert five.max_rtt_ns == int(323.35 * MS)  # Frankfurt-Sydney
    assert five.tick_ns(10 * MS) == 80 * MS


def test_placement_is_round_robin_for_nodes_and_clients() -> None:
    model = _model(WanConfig(regions=3), nodes=7)
    assert [model.region(f"n{i}") for i in (1, 2, 3, 4)] == [
        "us-east-1", "eu-central-1", "ap-northeast-1", "us-east-1"]
    assert client_index("c4.2") == 4
    assert client_index("c7") == 7


def test_propagation_is_half_the_round_trip_plus_jitter() -> None:
    model = _model(WanConfig(regions=5, jitter_pct=0, link_mbps=0, uplink_mbps=0))
    assert model.delay("n1", "n2", 1_000, 0) == int(88.64 / 2 * MS)
    assert model.delay("n1", "n1", 1_000, 0) == int(0.5 * MS)
    jittery = _model(WanConfig(regions=5, jitter_pct=10))
    delays = [jittery.delay("n1", "n2", 0, 0) for _ in range(2_000)]
    base = int(88.64 / 2 * MS)
    assert min(delays) >= base
    mean_jitter = sum(d - base for d in delays) / len(delays)
    assert 0.08 * base < mean_jitter < 0.12 * base


def test_bandwidth_queues_messages_per_link_and_per_uplink() -> None:
    # 1 Mbit/s link: 125,000 bytes take one second to serialise.
    model = _model(WanConfig(regions=1, jitter_pct=0, link_mbps=1, uplink_mbps=0,
                             intra_rtt_ms=0))
    assert model.delay("n1", "n2", 125_000, 0) == 1_000 * MS
    assert model.delay("n1", "n2", 125_000, 0) == 2_000 * MS  # queued behind the first
    assert model.delay("n1", "n3", 125_000, 0) == 1_000 * MS  # another link: no queue
    assert model.delay("n1", "n2", 0, 0) == 2_000 * MS  # no serialisation, but FIFO: queued
    assert model.delay("n1", "n4", 0, 0) == 0  # an idle link: no size, no serialisation
    shared = _model(WanConfig(regions=1, jitter_pct=0, link_mbps=0, uplink_mbps=8,
                              intra_rtt_ms=0))
    # An 8 Mbit/s uplink: a broadcast of 1 MB to 4 peers leaves one copy per second.
    assert [shared.delay("n1", f"n{i}", 1_000_000, 0) for i in (2, 3, 4, 5)] == [
        1_000 * MS, 2_000 * MS, 3_000 * MS, 4_000 * MS]


def test_loss_strikes_only_between_regions() -> None:
    model = _model(WanConfig(regions=2, loss=1.0))
    assert model.delay("n1", "n2", 10, 0) is None
    assert model.delay("n1", "n3", 10, 0) is not None  # both in us-east-1
    assert model.dropped == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 50_000),
                          st.integers(0, 10 * MS)), min_size=1, max_size=40))
def test_a_link_delivers_in_send_order_without_jitter(
        sends: list[tuple[int, int, int, int]]) -> None:
    model = _model(WanConfig(regions=5, jitter_pct=0))
    now = 0
    last: dict[tuple[int, int], int] = {}
    for a, b, size, gap in sends:
        now += gap
        delay = model.delay(f"n{a + 1}", f"n{b + 1}", size, now)
        assert delay is not None
        assert delay >= 0
        arrival = now + delay
        assert arrival >= last.get((a, b), 0)  # FIFO per link: never overtaken
        last[(a, b)] = arrival


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="regions"):
        WanConfig(regions=11)
    with pytest.raises(ValueError, match="probability"):
        WanConfig(loss=1.5)


def test_a_wan_run_is_deterministic_and_pays_the_round_trips() -> None:
    cfg = RunConfig(seed=3, protocol="pbft", nodes=4, faults=(), swarm=False, clients=2,
                    time_ns=1_000 * MS, liveness_ns=2_500 * MS, wan=WanConfig(regions=4))
    first, again = run(cfg), run(cfg)
    assert first.ok, first.report()
    assert first.trace_hash == again.trace_hash
    lan = run(RunConfig(seed=3, protocol="pbft", nodes=4, faults=(), swarm=False, clients=2,
                        time_ns=1_000 * MS, liveness_ns=2_500 * MS))
    # Sub-millisecond hops complete many more operations than ~100 ms ones.
    assert first.ops_ok * 5 < lan.ops_ok
    assert "--regions 4" in cfg.replay_command()


def test_sized_budgets_grow_with_the_cluster_only_when_asked() -> None:
    small = RunConfig(seed=0, nodes=5, sized_budgets=True)
    assert small.budgets() == (small.max_events, small.max_bytes_sent)
    big = RunConfig(seed=0, nodes=50, sized_budgets=True)
    assert big.budgets() == (small.max_events * 100, small.max_bytes_sent * 100)
    assert RunConfig(seed=0, nodes=50).budgets() == (small.max_events, small.max_bytes_sent)


def test_an_empty_message_does_not_overtake_one_being_sent() -> None:
    """Hypothesis found it (2026-12-02): a size-0 message skipped the link and uplink queues
    and arrived before a 1-byte one sent just before it on the same link."""
    model = _model(WanConfig(regions=5, jitter_pct=0))
    first = model.delay("n1", "n2", 1, 0)
    second = model.delay("n1", "n2", 0, 0)
    assert first is not None
    assert second is not None
    assert second >= first

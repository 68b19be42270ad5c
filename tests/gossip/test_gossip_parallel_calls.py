"""GP with several calls in flight (`GossipConfig.parallel_calls`, for WAN round trips):
still exactly n-1 contacts per wave and every live node informed for any crash set and
delivery order; a wave takes ~log2 n one-way delays instead of ~log2 n round trips; the
broken-split control is still caught; `DisseminationConfig.for_network` sizes the layer's
timing from the network so that WAN round trips cause no false timeouts. Leaf calls
(`GossipConfig.leaf_span`) and unacknowledged empty grants keep all of that with fewer acks
and hops."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import NodeId
from phalanx.gossip.dissemination import DisseminationConfig
from phalanx.gossip.machine import GossipConfig, GossipMachine
from phalanx.gossip.messages import Call, CallAck, Grant, Rumor, wave_seed
from phalanx.gossip.permutation import Others, Permutation
from phalanx.gossip.sim import GossipSim, SimConfig, node_ids

MS = 1_000_000


def _wave(n: int, *, parallel: int, seed: int = 0, crashed: frozenset[NodeId] = frozenset(),
          latency: tuple[int, int] = (1, 1), call_timeout: int | None = None,
          balance: bool = False, bugs: frozenset[str] = frozenset(),
          origin: NodeId | None = None, leaf_span: int = 0) -> tuple[GossipSim, int | None]:
    lo, hi = latency
    gossip = GossipConfig(membership=False, anti_entropy_interval=0, balance=balance,
                          call_timeout=call_timeout or 2 * hi + 1, parallel_calls=parallel,
                          bugs=bugs, leaf_span=leaf_span)
    sim = GossipSim(SimConfig(n=n, seed=seed, gossip=gossip, latency_min=lo, latency_max=hi,
                              crashed=crashed))
    sim.run(1)
    rid = sim.publish(origin or sim.members[0], b"x")
    assert sim.run_until(lambda s: s.quiescent(), 60 * n * hi + 50), \
        f"no quiescence: replay with _wave({n}, parallel={parallel}, seed={seed}, ...)"
    return sim, sim.coverage_time(rid)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(2, 40), latency_max=st.integers(1, 4),
       seed=st.integers(0, 2**32), balance=st.booleans(),
       parallel=st.sampled_from([2, 3, 16]), leaf_span=st.sampled_from([0, 1, 2, 3, 8, 50]))
def test_n_minus_1_contacts_and_full_coverage_with_calls_in_parallel(
    data: st.DataObject, n: int, latency_max: int, seed: int, balance: bool, parallel: int,
    leaf_span: int
) -> None:
    members = node_ids(n)
    origin = data.draw(st.sampled_from(members), label="origin")
    crashed = data.draw(st.frozensets(st.sampled_from([m for m in members if m != origin])),
                        label="crashed")
    sim, _ = _wave(n, parallel=parallel, seed=seed, crashed=crashed,
                   latency=(1, latency_max), balance=balance, origin=origin,
                   leaf_span=leaf_span)
    assert list(sim.wave_contacts().values()) == [n - 1]
    assert sim.covered(sim.stats.published)
    # Only calls that hand over positions wait for an ack (an empty grant's outcome
    # changes nothing once the caller keeps its share at once).
    acked = sim.stats.counters.get("calls", 0) - sim.stats.counters.get("calls_unacked", 0)
    assert sim.stats.sends.get("CallAck", 0) <= acked


@pytest.mark.parametrize("n", [20, 60, 180])
def test_parallel_calls_cover_in_about_log_n_one_way_delays(n: int) -> None:
    """One-way delays of 10-15 ticks (a WAN against a 10 ms tick): one call at a time
    needs a round trip per split; with calls in flight each split costs one way."""
    times = {}
    for parallel in (1, 16):
        sim, took = _wave(n, parallel=parallel, latency=(10, 15))
        assert list(sim.wave_contacts().values()) == [n - 1]
        assert took is not None
        times[parallel] = took
    depth = (n - 1).bit_length()
    assert times[16] <= (depth + 1) * 15, times
    assert 2 * times[16] < times[1], times


@pytest.mark.parametrize("leaf_span", [0, 8])
def test_the_sweep_catches_overlapping_intervals_with_calls_in_parallel(leaf_span: int) -> None:
    caught = 0
    for seed in range(4):
        sim, _ = _wave(120, parallel=16, seed=seed, bugs=frozenset({"overlapping_intervals"}),
                       leaf_span=leaf_span)
        caught += list(sim.wave_contacts().values()) != [119]
    assert caught == 4


@pytest.mark.parametrize("n", [60, 180])
def test_leaf_calls_and_unacked_empty_grants_cut_the_acks_and_the_depth(n: int) -> None:
    """One wave over one-way delays of 10-15 ticks (a WAN): before, every one of the n-1
    calls was acknowledged. Empty grants now ask no ack (a split of 1 or 2 positions), and
    with leaf_span 8 an interval of at most 8 positions is called position by position:
    only the splits of larger intervals (fewer than n/4) wait for an ack, no timeout fires,
    still exactly n-1 contacts, and the wave covers everyone sooner (fewer hops)."""
    runs = {}
    for leaf_span in (0, 8):
        sim, took = _wave(n, parallel=1024, latency=(10, 15), leaf_span=leaf_span)
        assert list(sim.wave_contacts().values()) == [n - 1]
        assert took is not None
        counters = sim.stats.counters
        assert counters["calls"] == n - 1
        assert counters.get("call_timeouts", 0) == 0
        assert counters.get("dropped:unexpected_ack", 0) == 0
        acks = sim.stats.sends.get("CallAck", 0)
        assert acks == n - 1 - counters["calls_unacked"]
        runs[leaf_span] = (acks, took)
    assert runs[0][0] < (n - 1) * 2 // 3, runs
    assert runs[8][0] < n // 4, runs
    assert runs[8][1] < runs[0][1], runs


def test_dead_leaf_callees_cost_no_timeout_and_everyone_alive_is_covered() -> None:
    members = node_ids(60)
    for seed in range(4):
        crashed = frozenset(random.Random(seed).sample(members[1:], 20))
        sim, took = _wave(60, parallel=16, seed=seed, crashed=crashed, latency=(10, 15),
                          leaf_span=8)
        assert list(sim.wave_contacts().values()) == [59], f"seed {seed}"
        assert took is not None, f"seed {seed}"
        # Only calls that handed positions over can time out.
        timeouts = sim.stats.counters.get("call_timeouts", 0)
        assert timeouts <= sim.stats.counters["calls"] - sim.stats.counters["calls_unacked"]


def test_a_call_with_id_0_is_not_acknowledged() -> None:
    members = node_ids(3)
    callee = GossipMachine(members[1], members, crypto=FastCrypto(members[1]),
                           rng=random.Random(0),
                           config=GossipConfig(membership=False, parallel_calls=2))
    ready = callee.step(Receive(src=members[2], message=Call(call_id=0, grants=())))
    assert not [s for s in ready.sends if isinstance(s.message, CallAck)]
    ready = callee.step(Receive(src=members[2], message=Call(call_id=5, grants=())))
    assert [s.message for s in ready.sends] == [CallAck(call_id=5)]


def test_leaf_span_needs_calls_in_parallel() -> None:
    with pytest.raises(ValueError, match="leaf_span"):
        GossipConfig(leaf_span=8)
    with pytest.raises(ValueError, match="leaf_span"):
        GossipConfig(leaf_span=-1, parallel_calls=4)
    assert DisseminationConfig.for_network(tick_ns=10 * MS, max_rtt_ns=320 * MS,
                                           parallel_calls=1).gossip.leaf_span == 0


def test_crashed_callees_time_out_and_their_subtrees_are_still_covered() -> None:
    members = node_ids(60)
    for seed in range(4):
        crashed = frozenset(random.Random(seed).sample(members[1:], 20))
        sim, took = _wave(60, parallel=16, seed=seed, crashed=crashed, latency=(10, 15))
        assert list(sim.wave_contacts().values()) == [59], f"seed {seed}"
        assert took is not None, f"seed {seed}"
        assert sim.stats.counters.get("call_timeouts", 0) >= 1


def test_for_network_sizes_the_timing_from_the_round_trip() -> None:
    lan = DisseminationConfig()
    # A LAN (round trip under a tick): the defaults, never shorter.
    same = DisseminationConfig.for_network(tick_ns=2 * MS, max_rtt_ns=1 * MS)
    assert (same.gossip.call_timeout, same.gossip.rumor_ttl, same.resend_window) == \
        (lan.gossip.call_timeout, lan.gossip.rumor_ttl, lan.resend_window)
    # The 5-region WAN (~320 ms) with 10 ms ticks: a call waits ~1.5 round trips.
    wan = DisseminationConfig.for_network(tick_ns=10 * MS, max_rtt_ns=320 * MS)
    assert wan.gossip.call_timeout == 32 * 3 // 2 + 2
    assert wan.resend_window == 4 * 32
    assert wan.gossip.rumor_ttl == 40 * 32
    assert wan.gossip.parallel_calls == 1024
    assert wan.gossip.leaf_span == 8
    with pytest.raises(ValueError, match="tick_ns"):
        DisseminationConfig.for_network(tick_ns=0, max_rtt_ns=1)
    with pytest.raises(ValueError, match="parallel_calls"):
        GossipConfig(parallel_calls=0)


def test_lan_timeouts_fire_falsely_over_wan_delays_and_the_sized_ones_do_not() -> None:
    """The failure this option fixes: the LAN default (4 ticks) against one-way delays of
    10-15 ticks times every call out; the sized timeout (1.5 round trips) none."""
    lan = DisseminationConfig().gossip.call_timeout
    sized = DisseminationConfig.for_network(tick_ns=10 * MS, max_rtt_ns=300 * MS)
    false, _ = _wave(60, parallel=16, latency=(10, 15), call_timeout=lan)
    true, _ = _wave(60, parallel=16, latency=(10, 15), call_timeout=sized.gossip.call_timeout)
    assert false.stats.counters.get("call_timeouts", 0) > 30
    assert true.stats.counters.get("call_timeouts", 0) == 0
    assert list(true.wave_contacts().values()) == [59]


def test_wave_interval_batches_a_nodes_rumors_of_several_ticks_into_one_wave() -> None:
    """`GossipConfig.wave_interval`: a node's rumors of 4 consecutive ticks ride 4 waves
    with a wave per tick, at most 2 with a wave every 4 ticks; each wave still costs n-1
    contacts and covers everyone."""
    for interval in (1, 4):
        gossip = GossipConfig(membership=False, anti_entropy_interval=0, call_timeout=3,
                              wave_interval=interval)
        sim = GossipSim(SimConfig(n=30, seed=1, gossip=gossip))
        sim.run(1)
        rids = []
        for i in range(4):
            rids.append(sim.publish(sim.members[0], b"x%d" % i))
            sim.run(1)
        assert sim.run_until(lambda s: s.quiescent(), 500)
        assert sim.covered(rids)
        waves = sim.stats.counters["waves_started"]
        assert waves == 4 if interval == 1 else waves <= 2
        assert list(sim.wave_contacts().values()) == [29] * waves
    with pytest.raises(ValueError, match="wave_interval"):
        GossipConfig(wave_interval=0)


def test_leaf_callees_keep_no_wave_state() -> None:
    """A callee whose grant hands over no position calls no one: it keeps no wave (at
    n = 180 with leaf_span 8, 148 of a wave's 179 callees), and the wave still covers
    everyone in n-1 contacts. Only the callees that own positions hold it."""
    sim, took = _wave(180, parallel=1024, latency=(10, 15), leaf_span=8)
    assert took is not None
    assert list(sim.wave_contacts().values()) == [179]
    holding = [m for m in sim.members if sim.nodes[m].status()["waves_held"]]
    owners = 1 + sim.stats.sends["CallAck"]  # the origin and every acknowledged callee
    assert len(holding) == owners == 32


def test_an_empty_grant_then_positions_of_the_same_wave_are_both_taken() -> None:
    """No state after an empty grant does not make the wave stale: a later grant of
    positions of the same wave (a forwarder's retry, or a Byzantine caller's) is owned and
    called, and a grant of an old wave is still refused."""
    members = node_ids(6)
    me, caller = members[1], members[2]
    origin = FastCrypto(members[0])
    unsigned = Rumor(origin=members[0], incarnation=0, seq=0, wave=0, seed=b"s" * 16,
                     payload=b"x")
    rumor = dataclasses.replace(unsigned, signature=origin.sign(unsigned))
    seed = wave_seed(members[0], 0, 0, 0, rumor.seed)

    def grant(lo: int, hi: int) -> Call:
        return Call(call_id=1, grants=(Grant(origin=members[0], incarnation=0, wave=0,
                                             instance=0, seed=seed, lo=lo, hi=hi,
                                             rumors=(rumor,)),))

    machine = GossipMachine(me, members, crypto=FastCrypto(me), rng=random.Random(0),
                            config=GossipConfig(membership=False, parallel_calls=4,
                                                leaf_span=2))
    empty = machine.step(Receive(src=caller, message=grant(0, 0)))
    assert empty.delivered == (rumor,)
    assert machine.status()["waves_held"] == 0
    owned = machine.step(Receive(src=caller, message=grant(3, 5)))
    assert machine.status()["waves_held"] == 1
    assert any(isinstance(s.message, CallAck) for s in owned.sends)
    called = {s.to for s in owned.sends if isinstance(s.message, Call)}
    others, perm = Others(members, members[0]), Permutation(seed, len(members) - 1)
    assert called == {others[perm(p)] for p in (3, 4)} - {me}  # one by one (leaf calls)
    assert called
    assert not any(k.startswith("dropped:") for k in machine.status())


def test_for_network_sizes_the_leaf_span_to_the_cluster() -> None:
    """With the cluster's size, a wave ends in ~8 leaf intervals at any n: leaf_span 8 up
    to n = 72, 22 at n = 180, where a wave then waits for 7 acks instead of 31 and covers
    everyone two hops sooner, still in exactly n-1 contacts."""
    def span(nodes: int) -> int:
        return DisseminationConfig.for_network(tick_ns=10 * MS, max_rtt_ns=320 * MS,
                                               nodes=nodes).gossip.leaf_span
    assert [span(n) for n in (0, 4, 60, 72, 120, 180)] == [8, 8, 8, 8, 14, 22]
    took = {}
    for leaf_span in (8, span(180)):
        sim, took[leaf_span] = _wave(180, parallel=1024, latency=(10, 15),
                                     leaf_span=leaf_span)
        assert list(sim.wave_contacts().values()) == [179]
        assert sim.stats.counters.get("call_timeouts", 0) == 0
        assert sim.stats.sends["CallAck"] == {8: 31, 22: 7}[leaf_span]
    assert took[22] is not None
    assert took[8] is not None
    assert took[22] + 20 <= took[8], took

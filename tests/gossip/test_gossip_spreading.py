"""GP rumor spreading over a seeded permutation (protocols.md §3.2): exactly n-1 contacts per
wave, dead nodes included, and every live node informed, for any crash set and any delivery
order; the permutation is a bijection; a deliberately broken interval split is caught."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import NodeId
from phalanx.gossip.machine import GossipConfig
from phalanx.gossip.messages import Call, RumorId
from phalanx.gossip.permutation import Others, Permutation
from phalanx.gossip.sim import GossipSim, SimConfig, adversarial_crashes, node_ids

# GP alone: no membership, no anti-entropy (they would mask a GP bug).
GP_ONLY = GossipConfig(membership=False, anti_entropy_interval=0, call_timeout=3)


def _spread(n: int, crashed: frozenset[NodeId], *, seed: int = 0, latency_max: int = 1,
            config: GossipConfig = GP_ONLY,
            publishers: int = 1) -> tuple[GossipSim, list[RumorId]]:
    # No false timeouts: a call's round trip (<= 2 * latency_max) ends before call_timeout.
    timeout = 2 * latency_max + 1
    gossip = GossipConfig(membership=config.membership,
                          anti_entropy_interval=config.anti_entropy_interval,
                          call_timeout=timeout, instances=config.instances,
                          bugs=config.bugs, permute=config.permute,
                          balance=config.balance)
    sim = GossipSim(SimConfig(n=n, seed=seed, gossip=gossip, latency_max=latency_max,
                              crashed=crashed))
    sim.run(1)
    live = [m for m in sim.members if m in sim.alive]
    rids = [sim.publish(live[i % len(live)], b"rumor %d" % i) for i in range(publishers)]
    assert sim.run_until(lambda s: s.quiescent(), 20 * n + 50)
    return sim, rids


@settings(max_examples=60, deadline=None)
@given(seed=st.binary(min_size=0, max_size=16), size=st.integers(0, 300))
def test_permutation_is_a_bijection(seed: bytes, size: int) -> None:
    perm = Permutation(seed, size)
    assert sorted(perm(i) for i in range(size)) == list(range(size))


def test_permutation_depends_on_the_seed_and_others_skips_the_origin() -> None:
    a, b = Permutation(b"a", 100), Permutation(b"b", 100)
    assert [a(i) for i in range(100)] != [b(i) for i in range(100)]
    members = node_ids(5)
    others = Others(members, members[2])
    assert [others[i] for i in range(len(others))] == [members[0], members[1], members[3],
                                                        members[4]]
    with pytest.raises(IndexError):
        a(100)


def test_permutations_of_one_seed_share_their_memo_and_eviction_changes_no_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.gossip import permutation
    monkeypatch.setattr(permutation, "_TABLES", {})
    fresh = [Permutation(b"s", 179)(i) for i in range(179)]  # the reference values
    permutation._TABLES.clear()
    first, second = Permutation(b"s", 179), Permutation(b"s", 179)
    assert [first(i) for i in range(0, 179, 2)] == fresh[0::2]
    # the second looks nothing up itself: the first one's values are its own
    assert len(permutation._TABLES) == 1
    table = permutation._TABLES[(b"s", 179)]
    assert second._table is None
    assert len(table.values) == 90
    assert second(4) == fresh[4]
    assert second._table is table
    assert [second(i) for i in range(179)] == fresh
    assert len(table.values) == 179
    # each round's hash is computed once per half-word (179 < 2^8: 16 values), not per lookup
    assert all(len(values) <= 16 for values in table.rounds)
    Permutation(b"s", 100)(5)  # another size, another permutation: its own table
    assert len(permutation._TABLES) == 2
    # bounded: the oldest table goes, its permutations keep (and fill) their own values
    monkeypatch.setattr(permutation, "_MAX_TABLES", 2)
    Permutation(b"t", 179)(0)
    Permutation(b"u", 179)(0)
    assert (b"s", 179) not in permutation._TABLES
    assert len(permutation._TABLES) == 2
    third = Permutation(b"s", 179)
    assert [third(i) for i in range(179)] == fresh == [first(i) for i in range(179)]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n=st.integers(2, 48), latency_max=st.integers(1, 3),
       seed=st.integers(0, 2**32), balance=st.booleans())
def test_n_minus_1_contacts_and_full_live_coverage_for_any_crash_set_and_order(
    data: st.DataObject, n: int, latency_max: int, seed: int, balance: bool
) -> None:
    members = node_ids(n)
    origin = data.draw(st.sampled_from(members), label="origin")
    crashed = data.draw(st.frozensets(st.sampled_from([m for m in members if m != origin])),
                        label="crashed")
    sim = GossipSim(SimConfig(n=n, seed=seed, latency_max=latency_max, crashed=crashed,
                              gossip=GossipConfig(membership=False, anti_entropy_interval=0,
                                                  call_timeout=2 * latency_max + 1,
                                                  balance=balance)))
    sim.run(1)
    rid = sim.publish(origin, b"x")
    assert sim.run_until(lambda s: s.quiescent(), 40 * n + 50)
    assert list(sim.wave_contacts().values()) == [n - 1]
    assert sim.informed(rid) == set(sim.alive)


@pytest.mark.parametrize("instances", [1, 3])
def test_batched_rumors_and_instances_cost_n_minus_1_contacts_per_wave(instances: int) -> None:
    n = 40
    config = GossipConfig(membership=False, anti_entropy_interval=0, instances=instances)
    sim, rids = _spread(n, frozenset(node_ids(n)[5:15]), config=config, publishers=5)
    contacts = sim.wave_contacts()
    # Five origins, one wave each, `instances` waves per batch.
    assert len(contacts) == 5 * instances
    assert set(contacts.values()) == {n - 1}
    assert sim.covered(rids)
    # Each rumor is delivered once per node, however many instances carried it.
    assert sim.stats.counters["delivered"] == 5 * (len(sim.alive) - 1)


def test_several_rumors_of_one_origin_ride_one_wave() -> None:
    sim = GossipSim(SimConfig(n=30, gossip=GP_ONLY))
    rids = [sim.publish(sim.members[0], b"r%d" % i) for i in range(10)]
    assert sim.run_until(lambda s: s.quiescent(), 400)
    assert list(sim.wave_contacts().values()) == [29]
    assert sim.covered(rids)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("balance", [False, True])
def test_seeded_sweep_crashes(fraction: float, adversarial: bool, balance: bool) -> None:
    """Seeded sweep: random and adversarial (plain GP's first midpoints) crash sets."""
    import random

    for seed in range(4):
        n = 120
        members = node_ids(n)
        k = int(fraction * n)
        if adversarial:
            crashed = frozenset(adversarial_crashes(members, members[0], k))
        else:
            crashed = frozenset(random.Random(seed).sample(members[1:], k))
        config = GossipConfig(membership=False, anti_entropy_interval=0, balance=balance)
        sim, rids = _spread(n, crashed, seed=seed, config=config)
        assert list(sim.wave_contacts().values()) == [n - 1], f"seed {seed}"
        assert sim.covered(rids), f"seed {seed}"


def test_balance_hands_over_work_without_extra_contacts_and_is_faster_when_most_are_down(
) -> None:
    import random

    n = 300
    crashed = frozenset(random.Random(0).sample(node_ids(n)[1:], 270))
    times = []
    for balance in (False, True):
        config = GossipConfig(membership=False, anti_entropy_interval=0, balance=balance)
        sim, rids = _spread(n, crashed, config=config)
        assert list(sim.wave_contacts().values()) == [n - 1]
        times.append(sim.coverage_time(rids[0]))
    assert times[1] is not None
    assert times[0] is not None
    assert 2 * times[1] < times[0]


def test_the_sweep_catches_overlapping_intervals() -> None:
    """The deliberate bug (the callee's interval overlaps what the caller keeps) costs more
    than n-1 contacts; the sweep above would fail on it at its first seed."""
    buggy = GossipConfig(membership=False, anti_entropy_interval=0,
                         bugs=frozenset({"overlapping_intervals"}))
    caught = 0
    for seed in range(4):
        sim, _ = _spread(120, frozenset(), seed=seed, config=buggy)
        caught += list(sim.wave_contacts().values()) != [119]
    assert caught == 4


def test_plain_gp_is_correct_too_but_the_permutation_defeats_adversarial_crashes() -> None:
    n = 256
    members = node_ids(n)
    crashed = frozenset(adversarial_crashes(members, members[0], n // 2))
    plain, rids_plain = _spread(n, crashed, config=GossipConfig(
        membership=False, anti_entropy_interval=0, permute=False))
    permuted, rids_perm = _spread(n, crashed)
    assert plain.covered(rids_plain)
    assert permuted.covered(rids_perm)
    slow = plain.coverage_time(rids_plain[0])
    fast = permuted.coverage_time(rids_perm[0])
    assert slow is not None
    assert fast is not None
    assert fast < slow


def test_the_splitting_follows_section_3_2_step_by_step() -> None:
    """Plain labels, n = 5 (positions 0..3 = n1..n4), n3 crashed. n0 owns [0, 4): calls
    pi(2) = n3 with [3, 4), which times out, so n0 keeps [0, 2) and [3, 4); the largest,
    [0, 2), splits at 1: n2 gets [2, 2) and acks, n0 keeps [0, 1); then the single
    positions, lowest first: n1, and n4 (the dead node's share)."""
    sim = GossipSim(SimConfig(n=5, crashed=frozenset({NodeId("n3")}), gossip=GossipConfig(
        membership=False, anti_entropy_interval=0, permute=False)))
    calls: list[tuple[int, str, str, int, int]] = []
    handle = sim._handle

    def record(node: NodeId, ready: object) -> None:
        for send in ready.sends:  # type: ignore[attr-defined]
            if isinstance(send.message, Call):
                grant = send.message.grants[0]
                calls.append((sim.now, node, send.to, grant.lo, grant.hi))
        handle(node, ready)  # type: ignore[arg-type]

    sim._handle = record  # type: ignore[method-assign]
    rid = sim.publish(NodeId("n0"), b"x")
    assert sim.run_until(lambda s: s.quiescent(), 100)
    assert [c[1:] for c in calls] == [
        ("n0", "n3", 3, 4),  # dead: no CallAck within call_timeout
        ("n0", "n2", 2, 2),
        ("n0", "n1", 1, 1),
        ("n0", "n4", 4, 4),  # [3, 4) came back to n0
    ]
    assert sim.informed(rid) == {"n0", "n1", "n2", "n4"}

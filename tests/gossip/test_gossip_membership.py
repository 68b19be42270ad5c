"""SWIM with Lifeguard suspicion: a crashed node is declared dead by every live node, a live
node under bounded loss is never declared dead, a suspected node refutes with a higher
incarnation, a restarted node rejoins, and the Lifeguard timeout shrinks with confirmations."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import NodeId
from phalanx.gossip.machine import GossipConfig, GossipMachine
from phalanx.gossip.messages import MemberStatus, MemberUpdate, RumorPush
from phalanx.gossip.sim import GossipSim, SimConfig, node_ids

# Membership only: GP's calls play no part (nobody publishes); anti-entropy on (state sync).
CONFIG = GossipConfig(call_timeout=3)


def _views_of(sim: GossipSim, node: NodeId) -> set[str]:
    return {sim.nodes[m].membership_view()[node][0] for m in sim.alive if m != node}


def _false_deaths(sim: GossipSim, victims: set[NodeId]) -> list[tuple[int, str, str]]:
    return [(t, o, x) for t, o, x, status in sim.stats.changes
            if status == MemberStatus.DEAD and x not in victims]


@settings(max_examples=12, deadline=None)
@given(n=st.integers(4, 24), seed=st.integers(0, 2**32), loss=st.sampled_from([0.0, 0.02, 0.05]),
       crashes=st.integers(1, 3))
def test_crashed_nodes_are_declared_dead_everywhere_and_live_ones_never(
    n: int, seed: int, loss: float, crashes: int
) -> None:
    sim = GossipSim(SimConfig(n=n, seed=seed, loss=loss, gossip=CONFIG))
    sim.run(20)
    victims = set(random.Random(seed).sample(sim.members, min(crashes, n - 2)))
    for victim in sorted(victims):
        sim.crash(victim)
    assert sim.run_until(lambda s: all(_views_of(s, v) == {"DEAD"} for v in victims), 600), \
        f"seed {seed}: not every live node declared {sorted(victims)} dead"
    sim.run(40)
    assert _false_deaths(sim, victims) == [], f"seed {seed}"
    for m in sim.alive:  # suspected for a moment, maybe (loss); refuted before any dies
        assert "DEAD" not in _views_of(sim, m)


def test_a_suspected_node_refutes_with_a_higher_incarnation() -> None:
    members = node_ids(4)
    machine = GossipMachine(members[0], members, crypto=FastCrypto(members[0]),
                            rng=random.Random(1), config=CONFIG)
    rumor_of_death = MemberUpdate(node=members[0], status=MemberStatus.SUSPECT, incarnation=0,
                                  source=members[1])
    machine.step(Receive(src=members[1], message=RumorPush(rumors=(), updates=(rumor_of_death,))))
    assert machine.status()["incarnation"] == 1
    assert machine.status()["refutations"] == 1
    sends = [s for _ in range(4) for s in machine.step(Tick()).sends]
    carried = {u for s in sends for u in getattr(s.message, "updates", ())}
    alive = [u for u in carried if u.status == MemberStatus.ALIVE and u.node == members[0]]
    assert [u.incarnation for u in alive] == [1]
    assert FastCrypto(members[1]).verify(members[0], alive[0], alive[0].signature)


def test_updates_obey_incarnation_precedence() -> None:
    members = node_ids(4)
    me, other = members[0], members[1]
    machine = GossipMachine(me, members, crypto=FastCrypto(me), rng=random.Random(1),
                            config=CONFIG)

    def hear(status: MemberStatus, inc: int) -> tuple[str, int]:
        update = MemberUpdate(node=other, status=status, incarnation=inc,
                              source=other if status == MemberStatus.ALIVE else members[2])
        if status == MemberStatus.ALIVE:
            update = replace(update, signature=FastCrypto(other).sign(update))
        machine.step(Receive(src=members[2], message=RumorPush(rumors=(), updates=(update,))))
        return machine.membership_view()[other]

    assert hear(MemberStatus.SUSPECT, 2) == ("SUSPECT", 2)
    assert hear(MemberStatus.ALIVE, 2) == ("SUSPECT", 2)  # same incarnation: no override
    assert hear(MemberStatus.ALIVE, 3) == ("ALIVE", 3)  # the refutation wins
    assert hear(MemberStatus.SUSPECT, 2) == ("ALIVE", 3)  # stale suspicion
    assert hear(MemberStatus.DEAD, 3) == ("DEAD", 3)
    assert hear(MemberStatus.SUSPECT, 3) == ("DEAD", 3)
    assert hear(MemberStatus.ALIVE, 4) == ("ALIVE", 4)  # a restart rejoins
    unknown = MemberUpdate(node=NodeId("stranger"), status=MemberStatus.DEAD, incarnation=0,
                           source=members[2])
    machine.step(Receive(src=members[2], message=RumorPush(rumors=(), updates=(unknown,))))
    assert machine.status()["dropped:unknown_member"] == 1


def test_only_a_node_itself_can_say_it_is_alive() -> None:
    """A Byzantine member cannot keep a crashed node alive with forged alive updates."""
    members = node_ids(4)
    me, dead, liar = members[0], members[1], members[2]
    machine = GossipMachine(me, members, crypto=FastCrypto(me), rng=random.Random(1),
                            config=CONFIG)
    obituary = MemberUpdate(node=dead, status=MemberStatus.DEAD, incarnation=0, source=liar)
    machine.step(Receive(src=liar, message=RumorPush(rumors=(), updates=(obituary,))))
    forged = MemberUpdate(node=dead, status=MemberStatus.ALIVE, incarnation=5, source=dead)
    for signature in (b"", FastCrypto(liar).sign(forged)):
        machine.step(Receive(src=liar, message=RumorPush(rumors=(), updates=(
            replace(forged, signature=signature),))))
    assert machine.membership_view()[dead] == ("DEAD", 0)
    assert machine.status()["dropped:bad_alive_signature"] == 2
    genuine = replace(forged, signature=FastCrypto(dead).sign(forged))
    machine.step(Receive(src=liar, message=RumorPush(rumors=(), updates=(genuine,))))
    assert machine.membership_view()[dead] == ("ALIVE", 5)


def test_lifeguard_timeout_shrinks_with_independent_confirmations() -> None:
    members = node_ids(100)
    machine = GossipMachine(members[0], members, crypto=FastCrypto(members[0]),
                            rng=random.Random(1), config=CONFIG)
    swim = machine._membership
    assert swim is not None
    timeouts = [swim.suspicion_timeout(c) for c in range(5)]
    assert timeouts == sorted(timeouts, reverse=True)
    assert timeouts[0] == 6 * timeouts[-1]  # max = 6 x min, min reached at k confirmations
    assert timeouts[2] == timeouts[-1]


def test_a_restarted_node_rejoins_with_a_higher_incarnation() -> None:
    sim = GossipSim(SimConfig(n=12, seed=3, gossip=CONFIG))
    sim.run(10)
    victim = sim.members[4]
    sim.crash(victim)
    assert sim.run_until(lambda s: _views_of(s, victim) == {"DEAD"}, 600)
    sim.restart(victim)
    assert sim.run_until(lambda s: _views_of(s, victim) == {"ALIVE"}, 600)
    incs = {sim.nodes[m].membership_view()[victim][1] for m in sim.alive if m != victim}
    assert incs == {sim.nodes[victim].status()["incarnation"]}
    assert min(incs) >= 1
    # and it learns what the others know, through state sync
    assert all(sim.nodes[victim].membership_view()[m][0] == "ALIVE"
               for m in sim.members if m != victim)


def test_the_simulation_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> tuple[object, ...]:
        sim = GossipSim(SimConfig(n=15, seed=seed, loss=0.05, latency_max=3,
                                  gossip=GossipConfig(call_timeout=7)))
        sim.run(5)
        rid = sim.publish(sim.members[3], b"x")
        sim.crash(sim.members[5])
        sim.run(80)
        return (sim.stats.changes, sorted(sim.stats.sends.items()),
                sorted(sim.stats.counters.items()), sorted(sim.stats.informed[rid].items()))

    assert run(11) == run(11)
    assert run(11) != run(12)

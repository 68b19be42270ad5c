"""The simulator's receiving clusters order through the real KV apply step, under forgery.

`KvOrdering` replaces the simulator's modelled ordering (`phalanx.clustersend.sim.
ModelOrdering`) with what a node runs: each proposed `Inbound` becomes the `CsDeliver`
command the clustersend service submits, applied by a `KvStateMachine` holding the
`ApplyCheck` its service installs (the other clusters' `ClusterInfo`s and the simulator's
signatures). A Byzantine proposer (a PBFT primary ordering whatever it likes) gets its
forgeries ordered FIRST, before each honest proposal: the same slot with another value, the
next slot with this certificate, and the slot with no certificate. The seeded sweep's checker
(`check`: every cluster's ordering holds exactly the agreed values, once each, in order) must
find nothing, and every forgery must be refused at apply; with the deliberate bug
`apply_unchecked` the checker must report the forged values.
"""

from __future__ import annotations

import dataclasses

import pytest

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import TxnResult
from phalanx.apps.kv_wire import decode_result
from phalanx.clustersend import Inbound
from phalanx.clustersend.sim import World, check, random_world, replay_command
from phalanx.net import wire
from phalanx.services.clustersend_apply import APPLY_UNCHECKED, ApplyCheck, delivery_command
from phalanx.services.clustersend_node import CLUSTERSEND_SERVICE_MESSAGES

wire.register_all(CLUSTERSEND_SERVICE_MESSAGES)


class KvOrdering:
    """`Ordering` through `KvStateMachine.apply` (see the module docstring)."""

    def __init__(self, world: World, cluster: str, bugs: frozenset[str]) -> None:
        self.log: list[Inbound] = []
        self.machine = KvStateMachine()
        verifier = world.crypto[world.infos[cluster].members[0]]
        self.machine.install_delivery_check(ApplyCheck(
            own=cluster, linked={c: i for c, i in world.infos.items() if c != cluster},
            verifier=verifier, bugs=bugs))

    def _order(self, inbound: Inbound) -> None:
        result = decode_result(self.machine.apply(delivery_command(inbound)))
        if isinstance(result, TxnResult) and result.succeeded:
            self.log.append(inbound)

    def propose(self, inbound: Inbound) -> None:
        for forged in (dataclasses.replace(inbound, value=inbound.value + b"!"),
                       dataclasses.replace(inbound, seq=inbound.seq + 1)):
            self._order(forged)
        self._order(dataclasses.replace(inbound, value=b"no certificate",
                                        certificate=dataclasses.replace(
                                            inbound.certificate, signatures=())))
        self._order(inbound)


def run_kv_seed(seed: int, bugs: frozenset[str] = frozenset()) -> tuple[World, list[str]]:
    world = World(random_world(seed))
    world.orderings = {c: KvOrdering(world, c, bugs) for c in world.infos}
    world.run()
    return world, check(world)


SEEDS = range(16)


def test_seeded_sweep_through_the_kv_apply_step_refuses_every_forgery() -> None:
    refused = 0
    for seed in SEEDS:
        world, bad = run_kv_seed(seed)
        assert not bad, (f"seed {seed}: {bad}\nreplay the world: {replay_command(seed)} "
                         "(this test runs it through KvOrdering)")
        for ordering in world.orderings.values():
            assert isinstance(ordering, KvOrdering)
            refused += sum(ordering.machine.refused.values())
    assert refused > 0


@pytest.mark.long
def test_long_seeded_sweep_through_the_kv_apply_step() -> None:
    for seed in range(16, 316):
        _, bad = run_kv_seed(seed)
        assert not bad, (f"seed {seed}: {bad}\nreplay the world: {replay_command(seed)} "
                         "(this test runs it through KvOrdering)")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_checker_catches_forgeries_when_apply_is_unchecked(seed: int) -> None:
    _, bad = run_kv_seed(seed, frozenset({APPLY_UNCHECKED}))
    assert any("do not match" in line or "never agreed to" in line for line in bad), bad

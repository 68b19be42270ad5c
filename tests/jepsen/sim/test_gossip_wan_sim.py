"""Gossip dissemination over the simulator's WAN model: the layers' timing is sized from
the WAN (`DisseminationConfig.for_network`), so cross-region round trips (up to ~320 ms
against a 10 ms tick) fire no false call timeouts and the runs pass their checkers; the
control runs the LAN defaults over the same WAN, whose calls time out falsely.

Budget: ~1 s of CPU a run (n = 7, 1 s of load, 3 s of liveness).
"""

from __future__ import annotations

import pytest

from phalanx.gossip import dissemination
from phalanx.jepsen.sim.run import RunConfig, RunResult, run
from phalanx.jepsen.sim.wan import WanConfig

_S = 1_000_000_000
_MS = 1_000_000


def wan_gossip(protocol: str, seed: int = 1) -> RunResult:
    return run(RunConfig(seed=seed, protocol=protocol, nodes=7, faults=(), swarm=False,
                         time_ns=_S, liveness_ns=3 * _S, dissemination="gossip",
                         gossip_tick_ns=10 * _MS, wan=WanConfig(regions=5)))


@pytest.mark.parametrize("protocol", ["leaderless", "pbft"])
def test_gossip_over_the_wan_passes_without_false_call_timeouts(protocol: str) -> None:
    result = wan_gossip(protocol)
    assert result.ok, result.report()
    assert result.ops_ok > 0
    assert result.stats["gossip:sent:Call"] > 0
    assert result.stats.get("gossip:call_timeouts", 0) == 0, result.config.replay_command()


def test_the_lan_defaults_over_the_wan_time_calls_out_falsely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: without the sizing (the LAN's 4-tick call timeout, one call at a time)
    most cross-region calls time out."""
    monkeypatch.setattr(dissemination.DisseminationConfig, "for_network",
                        classmethod(lambda cls, **_: cls()))
    result = wan_gossip("leaderless")
    calls = result.stats["gossip:sent:Call"]
    assert result.stats.get("gossip:call_timeouts", 0) > calls // 4

"""The leaderless core with its broadcasts through gossip (`RunConfig.dissemination =
"gossip"`, `phalanx.jepsen.sim.dissemination`): seeded runs under the leaderless sweep's
faults pass the leaderless checker, deliberate core bugs are still caught, and the run's
figures show the broadcasts went through the gossip layers.

Budget: ~0.5 s of CPU a seed at n = 4 (0.5 s of faults, 2.5 s of liveness), ~2 s at n = 7.
A failing seed prints its replay command (`RunResult.report`, with `--dissemination gossip`).
"""

from __future__ import annotations

import pytest
from bug_seed_search import CatchRange, first_catch

from phalanx.jepsen.sim.run import RunConfig, RunResult, run

FAULTS = ("pause", "partition-one", "partition-halves", "partition-ring",
          "partition-asymmetric", "loss", "duplicate", "delay", "straggle", "clock-skew",
          "kill", "lose-unfsynced", "crash-after-ready")
_S = 1_000_000_000


def gossip_sim(seed: int, *, nodes: int = 4, bugs: frozenset[str] = frozenset()) -> RunResult:
    return run(RunConfig(seed=seed, protocol="leaderless", nodes=nodes, faults=FAULTS,
                         bugs=bugs, time_ns=_S // 2, liveness_ns=5 * _S // 2,
                         dissemination="gossip"))


def test_gossip_dissemination_passes_the_leaderless_checker() -> None:
    results = [gossip_sim(seed) for seed in range(6)] + [gossip_sim(2, nodes=7)]
    assert "\n\n".join(r.report() for r in results if not r.ok) == ""
    assert sum(r.ops_ok for r in results) > 15 * len(results)
    for r in results:
        assert r.stats["gossip:broadcasts"] > 0
        assert r.stats["gossip:sent:Call"] > 0
    assert "--dissemination gossip" in results[0].config.replay_command()


@pytest.mark.parametrize(("bug", "where"), [
    ("endorse_despite_conflict", CatchRange(seeds=range(16), known=(0, 3))),
    ("skip_requirements", CatchRange(seeds=range(16), known=(0, 1)))])
def test_a_deliberate_bug_is_caught_through_gossip(bug: str, where: CatchRange) -> None:
    """A seed range each, at least one seed must catch the bug (`bug_seed_search`: the
    pinned seeds moved with arrival orders, e.g. seed 2 and skip_requirements)."""
    caught = first_catch(bug, where, lambda seed, bugs: gossip_sim(seed, bugs=bugs))
    assert "--dissemination gossip" in caught.report()


def test_direct_is_the_default_and_sends_no_gossip() -> None:
    result = run(RunConfig(seed=0, protocol="leaderless", nodes=4, faults=(), swarm=False,
                           time_ns=_S // 5, liveness_ns=_S))
    assert result.ok
    assert not any(k.startswith("gossip:") for k in result.stats)
    assert result.stats["messages_sent"] > 0
    assert 0 < result.stats["max_node_sent"] <= result.stats["messages_sent"]
    assert result.commit_latencies_ns
    with pytest.raises(ValueError, match="dissemination"):
        RunConfig(seed=0, dissemination="carrier-pigeon")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from phalanx.cli.main import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_runs_gossip_and_fixed_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(["sim", "--protocol", "leaderless", "--nodes", "4", "--seeds", "1",
                           "--faults", "none", "--time", "0.2", "--liveness", "1",
                           "--dissemination", "gossip", "--set", "conflict_pct=0"], capsys)
    assert code == 0, out + err
    for bad, needle in ((["--set", "conflict_pct"], "NAME=VALUE"),
                        (["--set", "no_such_knob=1"], "no_such_knob"),
                        (["--dissemination", "pigeon"], "pigeon")):
        code, _, err = _cli(["sim", "--protocol", "leaderless", "--seeds", "1", *bad], capsys)
        assert code == 2, err
        assert err.count("\n") == 1, err
        assert "Traceback" not in err
        assert needle in err, err

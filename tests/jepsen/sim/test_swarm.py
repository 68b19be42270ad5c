"""Swarm testing and the BUGGIFY faults: per-seed fault subsets and protocol knobs, the
crash-after-ready and straggle faults, and the committed-durable invariant."""

from __future__ import annotations

import random
from dataclasses import replace

from phalanx.consensus.types import Entry, EntryKind, Message
from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.invariants import InvariantChecker, LogMirror
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.network import NetworkConfig, SimNetwork
from phalanx.jepsen.sim.run import RunConfig, run, swarm_choices

_MS = 1_000_000


def test_swarm_choices_are_a_function_of_the_seed_and_vary_across_seeds() -> None:
    base = RunConfig(seed=0)
    assert swarm_choices(base) == swarm_choices(RunConfig(seed=0))
    picks = [swarm_choices(replace(base, seed=s)) for s in range(40)]
    fault_sets = {f for f, _ in picks}
    assert len(fault_sets) > 30, "each seed should get its own fault mix"
    for faults, knobs in picks:
        assert faults
        assert set(faults) <= set(nemesis.SIM_FAULT_KINDS)
        k = dict(knobs)
        assert 1 <= int(k["heartbeat_ticks"]) < int(k["election_ticks"])
    assert {dict(k)["pre_vote"] for _, k in picks} == {True, False}
    assert {dict(k)["check_quorum"] for _, k in picks} == {True, False}
    assert swarm_choices(replace(base, swarm=False)) == (base.faults, ())


def test_failure_report_prints_the_seeds_faults_and_knobs() -> None:
    cfg = RunConfig(
        seed=0, nodes=3, faults=("isolate-leader",), bugs=frozenset({"commit_on_minority"}),
        time_ns=1_500 * _MS, liveness_ns=1_500 * _MS,
    )
    result = run(cfg)
    assert not result.ok
    report = result.report()
    assert "faults this seed: isolate-leader" in report
    assert "election_ticks=" in report
    assert "pre_vote=" in report
    assert "--liveness 1.5" in report


def test_straggle_holds_some_messages_back_long() -> None:
    loop = EventLoop()
    arrivals: list[int] = []

    def deliver(src: str, dst: str, m: Message) -> None:
        arrivals.append(loop.now)

    config = NetworkConfig(straggle=0.2, mean_jitter_ns=100_000)  # no natural 5 ms delays
    net = SimNetwork(loop, random.Random(5), Trace(loop), deliver, config=config)
    for _ in range(1000):
        net.send("a", "b", Message())
    loop.run_until(10**10)
    assert len(arrivals) == 1000
    late = sum(1 for t in arrivals if t >= config.straggle_min_ns)
    assert late == net.stats.straggled
    assert 150 < late < 250


def test_crash_after_ready_crashes_and_restarts_nodes_and_stays_safe() -> None:
    cfg = RunConfig(
        seed=3, nodes=3, faults=(nemesis.CRASH_AFTER_READY,), swarm=False,
        time_ns=1_500 * _MS, liveness_ns=1_000 * _MS, keep_trace=True,
    )
    result = run(cfg)
    assert result.ok, result.report()
    assert any(e.fault == nemesis.CRASH_AFTER_READY for e in result.schedule)
    lines = result.trace_lines or []
    crashes = [i for i, line in enumerate(lines) if "NEMESIS crash-after-ready" in line]
    assert crashes, "the BUGGIFY fault must crash nodes"
    assert result.stats["crashes"] >= len(crashes)
    # Every BUGGIFY crash is followed by that node's restart (a new incarnation).
    for i in crashes:
        name = lines[i].rsplit(" ", 1)[1]
        assert any(f"{name} START" in line for line in lines[i:])
    assert result.ops_ok > 50


def _entry(index: int, term: int) -> Entry:
    return Entry(index=index, term=term, kind=EntryKind.NOOP)


def test_committed_durable_flags_an_applied_entry_held_by_a_minority() -> None:
    checker = InvariantChecker()
    e1, e2 = _entry(1, 1), _entry(2, 1)
    checker.observe_apply("n1", e1, 0)
    checker.observe_apply("n1", e2, 0)
    logs = {
        "n1": LogMirror(entries=[e1, e2]),
        "n2": LogMirror(entries=[e1, e2]),
        "n3": LogMirror(entries=[e1]),
    }
    checker.check_committed_durable(logs, 10)
    assert checker.ok
    logs["n2"].truncate_from(2)
    checker.check_committed_durable(logs, 20)
    assert [v.invariant for v in checker.violations] == ["committed-durable"]
    assert "[2@t1" in checker.violations[0].detail
    # A snapshot covering the index counts as holding it.
    fresh = InvariantChecker()
    fresh.observe_apply("n1", e1, 0)
    fresh.observe_apply("n1", e2, 0)
    snap = LogMirror(snapshot_index=2, snapshot_term=1)
    fresh.check_committed_durable({"n1": logs["n1"], "n2": snap, "n3": logs["n3"]}, 30)
    assert fresh.ok

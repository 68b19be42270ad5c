"""The WAN's opt-in CPU model (`phalanx.jepsen.sim.cpu`): a node handles its received messages
one at a time, each costing its measured per-message and per-crypto-operation time; what it
sends while handling one leaves when the handling ends; off by default."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from phalanx.consensus.core import Input
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import ClientRequest, Message, NodeId
from phalanx.jepsen.sim.cpu import CpuCosts
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.network import SimNetwork
from phalanx.jepsen.sim.node import SimNode
from phalanx.jepsen.sim.run import RunConfig, RunResult, run
from phalanx.jepsen.sim.wan import WanConfig, WanModel

MS = 1_000_000
US = 1_000


@dataclass(frozen=True, slots=True)
class Ping:
    n: int


def _network(cpu: CpuCosts | None) -> tuple[EventLoop, SimNetwork, list[tuple[int, str, int]]]:
    """n1 and n2 in one region (0.5 ms one way, no jitter, no bandwidth cost). n2 verifies
    one signature per ping and answers it; n1 records when each answer arrives."""
    loop = EventLoop()
    config = WanConfig(regions=1, jitter_pct=0, link_mbps=0, uplink_mbps=0, cpu=cpu)
    wan = WanModel(config, ["n1", "n2"], random.Random(1), random.Random(2))
    net = SimNetwork(loop, random.Random(0), Trace(loop), lambda s, d, m: None,
                     trace_messages=False, wan=wan)
    crypto = FastCrypto(NodeId("n2"))
    seen: list[tuple[int, str, int]] = []

    def n2(src: str, message: Message) -> None:
        assert isinstance(message, Ping)
        seen.append((loop.now, "n2", message.n))
        crypto.verify(NodeId("n1"), message, b"")
        net.send("n2", "n1", message)

    def n1(src: str, message: Message) -> None:
        assert isinstance(message, Ping)
        seen.append((loop.now, "n1", message.n))

    net.route("n2", n2)
    net.route("n1", n1)
    return loop, net, seen


def test_messages_wait_for_a_busy_node_and_its_sends_leave_when_it_is_done() -> None:
    costs = CpuCosts(message_us=100, verify_us=1_000, sign_us=0, mac_us=0)
    loop, net, seen = _network(costs)
    for i in range(3):
        net.send("n1", "n2", Ping(i))
    loop.run_until(20 * MS)
    half = MS // 2  # one way within a region
    each = 1_100 * US  # one message and one verify
    assert [(t, node, i) for t, node, i in seen if node == "n2"] == [
        (half, "n2", 0), (half + each, "n2", 1), (half + 2 * each, "n2", 2)]
    # Each answer leaves when n2 is done with its ping, then crosses the region.
    assert [(t, i) for t, node, i in seen if node == "n1"] == [
        (half + (k + 1) * each + half, k) for k in range(3)]
    assert net.cpu is not None
    assert (net.cpu.queued, net.cpu.max_queue) == (2, 2)
    assert net.cpu.spent == {"n2": 3 * each, "n1": 3 * 100 * US}


def test_without_the_model_handling_takes_no_time() -> None:
    loop, net, seen = _network(None)
    for i in range(3):
        net.send("n1", "n2", Ping(i))
    loop.run_until(20 * MS)
    assert net.cpu is None
    assert [t for t, node, _ in seen if node == "n2"] == [MS // 2] * 3
    assert [t for t, node, _ in seen if node == "n1"] == [MS] * 3


def test_costs_are_validated_and_described() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        CpuCosts(verify_us=-1)
    assert WanConfig().cpu is None
    assert "us/verify" in WanConfig(cpu=CpuCosts()).describe()
    assert "cpu" not in WanConfig().describe()
    assert CpuCosts(message_us=1, verify_us=10, sign_us=100, mac_us=1_000).cost_ns(
        1, 2, 3) == (1 + 20 + 100 + 3_000) * US


def test_a_pbft_run_with_costly_cpu_commits_later() -> None:
    def config(cpu: CpuCosts | None) -> RunConfig:
        return RunConfig(seed=3, protocol="pbft", nodes=4, faults=(), swarm=False, clients=2,
                         time_ns=600 * MS, liveness_ns=1_500 * MS,
                         wan=WanConfig(regions=2, cpu=cpu))

    def latencies(result: RunResult) -> list[int]:
        invoked: dict[object, int] = {}
        out = []
        for op in result.history:
            if op.type == "invoke":
                invoked[op.process] = op.time
            elif op.type == "ok" and op.process in invoked:
                out.append(op.time - invoked.pop(op.process))
        return sorted(out)

    assert "--regions 2 --cpu-model" in config(CpuCosts()).replay_command()
    assert "--cpu-model" not in config(None).replay_command()
    slow, free = run(config(CpuCosts(message_us=2_000))), run(config(None))
    assert slow.ok, slow.report()
    assert slow.stats["cpu_busiest_ms"] > 0
    assert "cpu_queued" not in free.stats
    fast_ms, slow_ms = (statistics.median(latencies(r)) / MS for r in (free, slow))
    # 2 ms per message on the path (request, pre-prepare, prepares, commits, each
    # replica's queue behind the others' messages): milliseconds more per operation.
    assert slow_ms > fast_ms + 3, (fast_ms, slow_ms)


def test_a_client_request_waits_for_a_busy_node_and_is_charged() -> None:
    costs = CpuCosts(message_us=100, verify_us=1_000, sign_us=0, mac_us=0)
    loop, net, _ = _network(costs)
    crypto = FastCrypto(NodeId("n2"))
    handled: list[int] = []

    def work() -> None:
        handled.append(loop.now)
        crypto.verify(NodeId("c0"), Ping(9), b"")  # the client's signature

    for i in range(2):
        net.send("n1", "n2", Ping(i))
    half, each = MS // 2, 1_100 * US
    loop.call_later(half, lambda: net.local("n2", work))  # arrives with the pings
    loop.run_until(20 * MS)
    assert handled == [half + 2 * each]  # behind both pings
    assert net.cpu is not None
    assert net.cpu.spent["n2"] == 3 * each
    stats = net.cpu.stats()
    assert (stats["cpu_busiest_node"], stats["cpu_busiest_handled"]) == (2, 3)
    # The second ping waited one handling, the request two.
    assert stats["cpu_busiest_wait_ms"] == (each + 2 * each) // MS
    assert net.cpu.waited["n2"] == 3 * each


def test_waiting_client_requests_are_handled_together_as_one_pass() -> None:
    costs = CpuCosts(message_us=100, verify_us=1_000, sign_us=10_000, mac_us=0)
    loop, net, _ = _network(costs)
    crypto = FastCrypto(NodeId("n2"))
    batches: list[tuple[int, tuple[object, ...]]] = []
    singles: list[object] = []

    def many(requests: tuple[object, ...]) -> None:
        batches.append((loop.now, requests))
        for _ in requests:
            crypto.verify(NodeId("c0"), Ping(9), b"")
        crypto.sign(Ping(0))  # one signature for the pass

    def other(requests: tuple[object, ...]) -> None:
        raise AssertionError("requests with another handler are never merged in")

    net.send("n1", "n2", Ping(0))  # n2 busy 0.5 .. 1.6 ms
    half, each = MS // 2, 1_100 * US
    for r in ("a", "b", "c"):
        loop.call_later(half, lambda r=r: net.local(  # type: ignore[misc]
            "n2", lambda: singles.append(r), r, many))
    loop.call_later(half, lambda: net.local("n2", lambda: singles.append("x"), "x", other))
    loop.run_until(20 * MS)
    assert (batches, singles) == ([(half + each, ("a", "b", "c"))], ["x"])
    assert net.cpu is not None
    # One pass: a message cost per request, the three client signatures, one signature;
    # then "x" alone.
    pass_us = 3 * 100 + 3 * 1_000 + 10_000
    assert net.cpu.spent["n2"] == each + pass_us * US + 100 * US
    assert net.cpu.handled["n2"] == 5
    # Without the model a request is handled at once, alone.
    _, free, _ = _network(None)
    free.local("n2", lambda: singles.append("now"), "now", many)
    assert (singles[-1], len(batches)) == ("now", 1)


def test_a_busy_leaderless_cluster_batches_its_client_writes_and_stays_correct(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes slow enough that client transactions queue: each node takes the waiting ones
    as one `SubmitBatch` (one signature for their endorsements, as a runtime driver pass),
    and the run still passes the checker."""
    passes: list[int] = []
    original = SimNode.submit_many

    def counted(self: SimNode, requests: tuple[ClientRequest, ...],
                batch: Callable[[tuple[ClientRequest, ...]], Input]) -> None:
        passes.append(len(requests))
        original(self, requests, batch)

    monkeypatch.setattr(SimNode, "submit_many", counted)
    result = run(RunConfig(seed=2, protocol="leaderless", nodes=4, faults=(), swarm=False,
                           clients=8, time_ns=1_000 * MS, liveness_ns=3_000 * MS,
                           settings=(("conflict_pct", 0), ("ops_per_client", 4),
                                     ("short_pct", 0), ("submit_to", 0), ("think_ns", 0)),
                           wan=WanConfig(regions=1, cpu=CpuCosts(message_us=3_000))))
    assert result.ok, result.report()
    assert len(result.commit_latencies_ns) >= 8
    assert passes, "no client write was taken in a batch"
    assert (min(passes), max(passes) >= 4) == (2, True), passes

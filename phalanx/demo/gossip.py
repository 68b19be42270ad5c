"""`phalanx demo --scenario gossip`: the gossip service on a real 5-node cluster, with kills.

Owns: the real-cluster demonstration of the gossip node service (`phalanx.services`,
`phalanx.services.gossip_node`; its command line is `phalanx.demo.command`). Steps, each
printed PASS or FAIL (the first FAIL ends the run; the rest are SKIPped):

    1. `init_cluster(..., services=("gossip",))`: 5 node processes (the protocol of
       --protocol, Raft by default) with the gossip service; every node sees the others alive.
    2. `--rounds` rumors published at n1, one at a time: each reaches all 5 nodes.
    3. SIGKILL n4 and n5.
    4. `--rounds` rumors published at n2: each reaches every live node (GP still calls the
       dead ones: that is its n-1 contacts; their calls time out).
    5. Every live node marks n4 and n5 SUSPECT, then DEAD (SWIM/Lifeguard).
    6. Restart n4: it rejoins with a higher incarnation (alive again at every live node)
       and gets every rumor it missed by anti-entropy.
    7. A rumor published at the restarted n4 reaches every live node.

Figures: publish-to-delivery times come from the nodes' own records (`GossipDelivery.unix_ms`,
one machine, one clock) against the publish time the origin recorded, so the status polling
interval does not enter them. Exit status 0 iff every step passed.

Must not import: the runtime (nodes are processes). Not deterministic (real processes).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

from phalanx.client.errors import ClientError
from phalanx.client.service_calls import call_service
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.services.gossip_api import (
    GossipPublish,
    GossipPublished,
    GossipStatus,
    GossipStatusCall,
)

NODES: Final = 5
KILLED: Final = ("n4", "n5")
RESTARTED: Final = "n4"
POLL: Final = 0.05
CALL_SECONDS: Final = 1.0
RumorKey = tuple[str, int, int]


class StepFailed(Exception):
    """A step did not happen in time (the message says what was seen)."""


@dataclass(slots=True)
class GossipDemo:
    cluster: ClusterConfig
    procs: NodeProcesses
    rounds: int
    say: Callable[[str], None]
    live: list[str] = field(default_factory=list)
    published: list[RumorKey] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)

    async def statuses(self, nodes: Sequence[str]) -> dict[str, GossipStatus]:
        """The status of each of `nodes` that answers now."""
        out: dict[str, GossipStatus] = {}

        async def one(node: str) -> None:
            try:
                reply = await call_service(self.cluster, node, "gossip",
                                           GossipStatusCall(max_rumors=1000),
                                           seconds=CALL_SECONDS)
            except ClientError:
                return
            if isinstance(reply, GossipStatus):
                out[node] = reply

        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(one, node)
        return out

    async def wait(self, what: str, within: float,
                   done: Callable[[dict[str, GossipStatus]], bool],
                   nodes: Sequence[str] | None = None) -> dict[str, GossipStatus]:
        """Poll the statuses of `nodes` (default: the live ones) until `done`."""
        deadline = time.monotonic() + within
        seen: dict[str, GossipStatus] = {}
        while time.monotonic() < deadline:
            seen = await self.statuses(self.live if nodes is None else nodes)
            if done(seen):
                return seen
            await trio.sleep(POLL)
        raise StepFailed(f"not within {within:g} s: {what} (answered: "
                         f"{', '.join(sorted(seen)) or 'nobody'})")

    async def publish(self, node: str, text: str) -> tuple[RumorKey, int]:
        reply = await call_service(self.cluster, node, "gossip",
                                   GossipPublish(payload=text.encode()), seconds=5.0)
        if not isinstance(reply, GossipPublished):
            raise StepFailed(f"{node} answered {type(reply).__name__} to a publish")
        key = (reply.origin, reply.incarnation, reply.seq)
        self.published.append(key)
        return key, reply.unix_ms

    async def spread(self, origin: str, label: str) -> list[float]:
        """Publish `rounds` rumors at `origin`, one at a time; each one's publish-to-last-
        delivery time over the live nodes, in ms."""
        times = []
        for i in range(self.rounds):
            key, at = await self.publish(origin, f"{label} #{i + 1}")
            seen = await self.wait(
                f"rumor {key} at every live node", 10.0,
                lambda s, key=key: len(s) == len(self.live)  # type: ignore[misc]
                and all(_has(st, key) for st in s.values()))
            last = max(_delivered_ms(st, key) for st in seen.values())
            times.append(float(last - at))
        return times


def _has(status: GossipStatus, key: RumorKey) -> bool:
    return any((d.origin, d.incarnation, d.seq) == key for d in status.deliveries)


def _delivered_ms(status: GossipStatus, key: RumorKey) -> int:
    return next(d.unix_ms for d in status.deliveries if (d.origin, d.incarnation, d.seq) == key)


def _view(status: GossipStatus, node: str) -> tuple[str, int]:
    for m in status.members:
        if m.node == node:
            return m.status, m.incarnation
    return "ALIVE", 0


def _ms(times: Sequence[float]) -> str:
    return (f"median {statistics.median(times):.0f} ms, max {max(times):.0f} ms "
            f"over {len(times)} rumors")


async def run_steps(demo: GossipDemo) -> bool:
    """Steps 1-7 (module docstring); records each step's PASS/FAIL line; True iff all passed."""
    cluster, procs = demo.cluster, demo.procs
    nodes = [n.id for n in cluster.nodes]
    t0 = time.monotonic()
    incarnations: dict[str, int] = {}

    async def step1() -> str:
        procs.start()
        demo.live = list(nodes)
        seen = await demo.wait("every node up, seeing the others alive", 30.0,
                               lambda s: len(s) == NODES and all(
                                   all(m.status == "ALIVE" for m in st.members)
                                   for st in s.values()))
        incarnations.update({n: st.incarnation for n, st in seen.items()})
        return f"{NODES} nodes up, each sees the other {NODES - 1} alive " \
               f"({time.monotonic() - t0:.1f} s after start)"

    async def step2() -> str:
        times = await demo.spread("n1", "before the kills")
        return f"rumors from n1 reached all {NODES} nodes: publish -> last delivery {_ms(times)}"

    killed_at = 0.0

    async def step3() -> str:
        nonlocal killed_at
        for node in KILLED:
            procs.kill(node)
        killed_at = time.monotonic()
        demo.live = [n for n in nodes if n not in KILLED]
        return f"SIGKILLed {', '.join(KILLED)}"

    async def step4() -> str:
        times = await demo.spread("n2", "after the kills")
        return (f"rumors from n2 reached all {len(demo.live)} live nodes: publish -> last "
                f"delivery {_ms(times)}")

    async def step5() -> str:
        def marked(states: tuple[str, ...]) -> Callable[[dict[str, GossipStatus]], bool]:
            return lambda s: len(s) == len(demo.live) and all(
                _view(st, k)[0] in states for st in s.values() for k in KILLED)

        await demo.wait("the killed nodes suspected everywhere", 20.0,
                        marked(("SUSPECT", "DEAD")))
        suspected = time.monotonic() - killed_at
        await demo.wait("the killed nodes dead everywhere", 30.0, marked(("DEAD",)))
        dead = time.monotonic() - killed_at
        return (f"every live node marks {', '.join(KILLED)} SUSPECT by {suspected:.1f} s and "
                f"DEAD by {dead:.1f} s after the kill (as polled)")

    async def step6() -> str:
        started = time.monotonic()
        procs.start([RESTARTED])
        demo.live.append(RESTARTED)
        missed = list(demo.published)
        seen = await demo.wait(f"{RESTARTED} serving", 30.0,
                               lambda s: RESTARTED in s, nodes=[RESTARTED])
        serving = time.monotonic() - started
        new = seen[RESTARTED].incarnation
        if new <= incarnations[RESTARTED]:
            raise StepFailed(f"{RESTARTED} restarted at incarnation {new}, not above "
                             f"{incarnations[RESTARTED]}")
        await demo.wait(f"{RESTARTED} holding all {len(missed)} rumors", 20.0,
                        lambda s: RESTARTED in s and all(_has(s[RESTARTED], k)
                                                         for k in missed), nodes=[RESTARTED])
        caught_up = time.monotonic() - started
        await demo.wait(f"{RESTARTED} alive at incarnation {new} everywhere", 20.0,
                        lambda s: len(s) == len(demo.live) and all(
                            _view(st, RESTARTED) == ("ALIVE", new)
                            for n, st in s.items() if n != RESTARTED))
        rejoined = time.monotonic() - started
        return (f"restarted {RESTARTED} (incarnation {incarnations[RESTARTED]} -> {new}): "
                f"serving after {serving:.1f} s, all {len(missed)} rumors by anti-entropy "
                f"after {caught_up:.1f} s, alive at every live node after {rejoined:.1f} s")

    async def step7() -> str:
        saved, demo.rounds = demo.rounds, 1
        try:
            times = await demo.spread(RESTARTED, "from the restarted node")
        finally:
            demo.rounds = saved
        return (f"a rumor from the restarted {RESTARTED} reached all {len(demo.live)} live "
                f"nodes in {times[0]:.0f} ms")

    steps = (step1, step2, step3, step4, step5, step6, step7)
    for number, step in enumerate(steps, 1):
        try:
            line = await step()
        except (StepFailed, ClientError) as e:
            demo.say(f"FAIL  {number}. {e}")
            demo.results.append(("FAIL", str(e)))
            for later in range(number + 1, len(steps) + 1):
                demo.say(f"SKIP  {later}.")
            return False
        demo.say(f"PASS  {number}. {line}")
        demo.results.append(("PASS", line))
    return True


def run(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """`phalanx demo --scenario gossip` (`phalanx.services.builtin.GOSSIP.demo`)."""
    protocol = args.protocol or DEFAULT_PROTOCOL
    rounds = max(1, getattr(args, "rounds", 5))
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f}s] {text}", flush=True)

    cluster = init_cluster(directory / "cluster", protocol=protocol, nodes=NODES,
                           base_port=find_free_base_port(NODES), services=("gossip",))
    say(f"gossip demo: {NODES} {protocol} nodes with the gossip service (tick 25 ms, "
        f"signed rumors, SWIM) in {cluster.directory}")
    procs = NodeProcesses(cluster)
    try:
        demo = GossipDemo(cluster=cluster, procs=procs, rounds=rounds, say=say)
        passed = trio.run(run_steps, demo)
    finally:
        procs.stop(grace=5.0)
        if delete:
            shutil.rmtree(directory, ignore_errors=True)
    say(f"RESULT: {'PASS' if passed else 'FAIL'} "
        f"({sum(1 for r, _ in demo.results if r == 'PASS')}/7 steps passed)"
        + ("" if delete else f"; logs in {cluster.directory / 'logs'}"))
    if not passed:
        print("phalanx demo: FAILED (see the FAIL line above)", file=sys.stderr)
    return 0 if passed else 1


__all__ = ["GossipDemo", "StepFailed", "run", "run_steps"]

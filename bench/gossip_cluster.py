"""Gossip service figures on a real 5-node loopback cluster (issue 16, item 4).

Prints (1) the idle CPU of each node process with and without the gossip service (the same
cluster layout, Raft, nothing published; /proc/<pid>/stat over --seconds), and (2) the time
from publish to delivery at every live node, with all 5 nodes up and after SIGKILLing 2
(--rounds rumors each, published one at a time; times from the nodes' own delivery records,
`phalanx.demo.gossip`). Linux only (reads /proc).

Usage: `python bench/gossip_cluster.py [--seconds 20] [--rounds 20]` (~1.5 minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio

from phalanx.demo.gossip import KILLED, NODES, GossipDemo
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def idle_cpu(root: Path, *, gossip: bool, seconds: float) -> list[float]:
    cluster = init_cluster(root, nodes=NODES, base_port=find_free_base_port(NODES),
                           services=("gossip",) if gossip else ())
    with NodeProcesses(cluster) as procs:
        procs.start()
        time.sleep(8.0)  # start-up (imports, TLS links, elections) is not idle
        pids = {n: procs.pid(n) for n in procs.node_ids}
        assert all(pids.values()), f"a node died: {procs.exited()}"
        before = {n: cpu_seconds(p) for n, p in pids.items() if p}
        time.sleep(seconds)
        after = {n: cpu_seconds(p) for n, p in pids.items() if p}
        procs.stop(grace=5.0)
    return [100 * (after[n] - before[n]) / seconds for n in sorted(before)]


def spread_times(root: Path, rounds: int) -> tuple[list[float], list[float]]:
    cluster = init_cluster(root, nodes=NODES, base_port=find_free_base_port(NODES),
                           services=("gossip",))
    procs = NodeProcesses(cluster)
    demo = GossipDemo(cluster=cluster, procs=procs, rounds=rounds, say=print)

    async def run() -> tuple[list[float], list[float]]:
        procs.start()
        demo.live = [n.id for n in cluster.nodes]
        await demo.wait("all up", 60.0, lambda s: len(s) == NODES and all(
            m.status == "ALIVE" for st in s.values() for m in st.members))
        await trio.sleep(2.0)
        up = await demo.spread("n1", "all up")
        for node in KILLED:
            procs.kill(node)
        demo.live = [n for n in demo.live if n not in KILLED]
        down = await demo.spread("n2", "two killed")
        return up, down

    try:
        return trio.run(run)
    finally:
        procs.stop(grace=5.0)


def summary(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else times
    return (f"median {statistics.median(times):.0f} ms, p90 {q[-1]:.0f} ms, "
            f"max {max(times):.0f} ms (n={len(times)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-gossip-"))
    try:
        off = idle_cpu(root / "off", gossip=False, seconds=args.seconds)
        on = idle_cpu(root / "on", gossip=True, seconds=args.seconds)
        up, down = spread_times(root / "spread", args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"idle CPU per node over {args.seconds:g} s (% of one core), {NODES} Raft nodes:")
    print("  without gossip: " + " ".join(f"{c:.1f}" for c in off)
          + f"  mean {statistics.mean(off):.2f}")
    print("  with gossip:    " + " ".join(f"{c:.1f}" for c in on)
          + f"  mean {statistics.mean(on):.2f}")
    print(f"  gossip adds {statistics.mean(on) - statistics.mean(off):.2f} points per node "
          "(tick 25 ms)")
    print(f"publish -> delivery at every live node, all {NODES} up: {summary(up)}")
    print(f"publish -> delivery at every live node, {len(KILLED)} killed: {summary(down)}")


if __name__ == "__main__":
    main()

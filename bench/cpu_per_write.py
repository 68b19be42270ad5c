"""CPU milliseconds per write, per node, of a phalanx cluster (real processes, loopback).

Usage (from bench/)::

    ../.venv/bin/python cpu_per_write.py --clients 1,64 --duration 5
    ../.venv/bin/python cpu_per_write.py --clients 1 --profile /tmp/spy   # + py-spy raw stacks
    ../.venv/bin/python cpu_per_write.py --clients 1 --strace      # + system calls per write

Starts a cluster (`_phalanx.PhalanxCluster`, fsync "group" unless `--fsync off`, 100-byte
values), waits for a leader, measures each node's idle CPU (utime+stime from
/proc/<pid>/stat over `--idle` seconds), then drives each client level closed-loop
(`_loadgen.run_level`) and prints, per node and role, the CPU it spent per acknowledged
write (ms), beside throughput, p50 and the load average. CPU per write is robust to this
machine's clock drift in a way wall-clock latency is not: it counts the work done, not
how long the cores were shared.

With ``--profile DIR`` every node (or those of ``--profile-role``) is sampled by py-spy
(``--rate`` Hz, raw collapsed stacks; ``--profile-idle`` keeps waiting threads) during each
level and the idle phase, into ``DIR/c<clients>-<role>-<node>.txt`` and
``DIR/idle-<role>-<node>.txt``. Sampling perturbs the figures printed beside.

With ``--strace`` every node is attached by ``strace -c -f`` during the idle phase and each
level, and the system calls it made per acknowledged write are printed (all; then net of
the idle phase's rate, and the busiest few of those): a count, so unlike CPU time it does
not drift with the machine's load; tracing slows the nodes, so the CPU and latency figures
printed beside it are not comparable with untraced runs.

Must not be imported by the package. Every process it starts is stopped (by pid).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import trio
from _loadgen import make_value, proc_cpu_seconds, run_level
from _phalanx import PhalanxCluster

from phalanx.ops.node_config import load_node_config
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names


def _commit_index(cluster: PhalanxCluster) -> float | None:
    """The first node's `phalanx_commit_index` (Prometheus), or None when unavailable:
    with it, writes per index = requests per PBFT batch (per Raft entry batch)."""
    node = cluster.config.nodes[0].id
    listen = load_node_config(cluster.config.node_config_path(node)).metrics_listen
    if listen is None:
        return None
    try:
        with urllib.request.urlopen(f"http://{listen.host}:{listen.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = re.search(r"(?m)^phalanx_commit_index(?:\{[^}]*\})? (\S+)", text)
    return float(found.group(1)) if found else None


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def _roles(cluster: PhalanxCluster, leader: str) -> dict[str, str]:
    return {node: ("leader" if node == leader else "follower") for node in cluster.procs.node_ids}


def _pids(cluster: PhalanxCluster) -> dict[str, int]:
    return {n: p for n in cluster.procs.node_ids if (p := cluster.procs.pid(n)) is not None}


def _spy(pids: dict[str, int], roles: dict[str, str], prefix: Path, seconds: float,
         rate: int, only: str | None, idle: bool) -> list[subprocess.Popen[bytes]]:
    local = Path(sys.executable).parent / "py-spy"
    spy = str(local) if local.exists() else shutil.which("py-spy")
    if spy is None:
        print("py-spy not found: no profiles", flush=True)
        return []
    return [
        subprocess.Popen(
            [spy, "record", "-r", str(rate), "-d", str(max(1, round(seconds))), "-f", "raw",
             *(["--idle"] if idle else []), "-o", f"{prefix}-{roles[node]}-{node}.txt",
             "--pid", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for node, pid in pids.items()
        if only is None or roles[node] == only
    ]


def _strace(pids: dict[str, int], seconds: float, into: Path) -> list[subprocess.Popen[bytes]]:
    """``strace -c -f`` attached to each node for `seconds` (then SIGINT: it detaches and
    writes its table to ``into/<node>.txt``)."""
    strace = shutil.which("strace")
    if strace is None:
        print("strace not found: no system-call counts", flush=True)
        return []
    into.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["timeout", "-s", "INT", f"{seconds:.1f}", strace, "-c", "-f",
                              "-o", str(into / f"{node}.txt"), "-p", str(pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for node, pid in pids.items()]


def _syscalls(path: Path) -> dict[str, int]:
    """calls per system call from an ``strace -c`` table."""
    calls: dict[str, int] = {}
    if not path.exists():
        return calls
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0].replace(".", "").isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    return calls


def _print_syscalls(into: Path, level: str, order: list[str], roles: dict[str, str],
                    writes: float, *, idle_seconds: float, level_seconds: float) -> None:
    """Per node: the level's calls per write, then the same net of the idle phase's rate
    (ticks, heartbeats, polls: what the node would have done anyway over the level)."""
    for node in order:
        calls = _syscalls(into / level / f"{node}.txt")
        idle = _syscalls(into / "idle" / f"{node}.txt")
        scale = level_seconds / idle_seconds
        net = {name: (n - idle.get(name, 0) * scale) / writes for name, n in calls.items()}
        top = sorted(net.items(), key=lambda kv: -kv[1])[:6]
        print(f"      syscalls/write: {node} {roles[node]} "
              f"{sum(calls.values()) / writes:.2f}, net of idle {sum(net.values()):.2f} ("
              + ", ".join(f"{name} {n:.2f}" for name, n in top) + ")", flush=True)


async def _measure(cluster: PhalanxCluster, args: argparse.Namespace) -> None:
    async with cluster.connected():
        leader = await cluster.wait_ready()
        roles = _roles(cluster, leader)
        pids = _pids(cluster)
        order = sorted(pids, key=lambda n: (roles[n] != "leader", n))
        await trio.sleep(1.0)
        idle_spies: list[subprocess.Popen[bytes]] = []
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            idle_spies = _spy(pids, roles, args.profile / "idle", args.idle, args.rate,
                              args.profile_role, args.profile_idle)
        before = {n: proc_cpu_seconds(p) for n, p in pids.items()}
        if args.strace:
            idle_spies += _strace(pids, args.idle, args.strace_dir / "idle")
        t0 = time.perf_counter()
        await trio.sleep(args.idle)
        elapsed = time.perf_counter() - t0
        for proc in idle_spies:
            await trio.to_thread.run_sync(lambda proc=proc: proc.wait(timeout=60))
        idle = {n: (proc_cpu_seconds(p) - before[n]) / elapsed for n, p in pids.items()}
        print(f"idle ({args.idle:.0f} s, {_load()}): "
              + ", ".join(f"{n} {roles[n]} {idle[n] * 100:.1f}% of a core" for n in order),
              flush=True)
        value = make_value(args.value_size)
        for level in args.clients:
            spies: list[subprocess.Popen[bytes]] = []
            # CPU over the level's whole run (warmup included) divided by every write it
            # acknowledged would mix in the warmup; so bracket the measured window instead:
            # run_level's own meter sums the servers; here each node is read separately.
            start = {n: proc_cpu_seconds(p) for n, p in pids.items()}
            index0 = await trio.to_thread.run_sync(_commit_index, cluster)
            began = time.perf_counter()
            if args.profile is not None:
                spies = _spy(pids, roles, args.profile / f"c{level}", args.warmup + args.duration,
                             args.rate, args.profile_role, args.profile_idle)
            traces = (_strace(pids, args.warmup + args.duration, args.strace_dir / f"c{level}")
                      if args.strace else [])
            result = await run_level(cluster, clients=level, warmup_s=args.warmup,
                                     duration_s=args.duration, value=value,
                                     key_prefix=f"cpw{level}-")
            spent = {n: proc_cpu_seconds(p) - start[n] for n, p in pids.items()}
            wall = time.perf_counter() - began
            index1 = await trio.to_thread.run_sync(_commit_index, cluster)
            for proc in spies + traces:
                await trio.to_thread.run_sync(lambda proc=proc: proc.wait(timeout=60))
            # Writes over the whole bracket: the window's rate times the bracket's span
            # (the warmup and the drain run at the same closed-loop rate).
            writes = max(result.throughput * wall, 1.0)
            per = {n: spent[n] / writes * 1e3 for n in pids}
            batching = ""
            if index0 is not None and index1 is not None and index1 > index0:
                batching = f"  {writes / (index1 - index0):.1f} writes per log index"
            print(f"{level:>4} clients: {result.throughput:8.0f} w/s  p50 {result.p50_ms:6.2f} ms"
                  f"  errors {result.errors}{batching}  {_load()}", flush=True)
            print("      CPU ms/write: "
                  + ", ".join(f"{n} {roles[n]} {per[n]:.3f}" for n in order)
                  + f"  (sum {sum(per.values()):.3f}; loadgen {result.loadgen_cpu * 100:.0f}%"
                  " of a core)", flush=True)
            if traces:
                _print_syscalls(args.strace_dir, f"c{level}", order, roles, writes,
                                idle_seconds=args.idle, level_seconds=wall)


def _client_list(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("client counts must be >= 1")
    return levels


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--clients", type=_client_list, default=[1, 64])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured first")
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--profile", type=Path, default=None, help="py-spy raw stacks into DIR")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--profile-role", choices=("leader", "follower"), default=None,
                   help="profile only the nodes of this role (default: every node)")
    p.add_argument("--profile-idle", action="store_true",
                   help="keep py-spy's idle samples (threads waiting in epoll, locks, ...)")
    p.add_argument("--strace", action="store_true",
                   help="count each node's system calls per write (strace -c -f)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--protocol", choices=protocol_names(), default=DEFAULT_PROTOCOL,
                   help="raft: 3 nodes (roles leader/follower); pbft: 4 replicas (the node "
                   "the client names first is the one called leader)")
    p.add_argument("--fsync", choices=("group", "off"), default="group",
                   help="the nodes' fsync mode: off takes the disk (whose latency this VM "
                   "varies 20-fold) out of a CPU comparison; every write then persists on "
                   "the core task")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.strace_dir = Path(tempfile.mkdtemp(prefix="cpw-strace-"))
    cluster = PhalanxCluster(protocol=args.protocol, workdir=args.workdir, fsync=args.fsync,
                             nodes=get_protocol(args.protocol).default_nodes)
    cluster.start()
    try:
        trio.run(_measure, cluster, args)
    finally:
        cluster.stop()
        shutil.rmtree(args.strace_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

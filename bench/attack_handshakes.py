"""Attack run: a TLS handshake/connection flood against the Raft leader's client port, on a real
3-node cluster (separate processes, loopback TLS, real disks). Does the leader keep leadership?

Steps: start a cluster, find the leader and its term, then one well-behaved client does
sequential puts (one at a time) throughout: a no-flood BASELINE of `--baseline` seconds, the
FLOOD of `--seconds`, and a RECOVERY of `--recovery` seconds after it. The flood comes from its
own process (`bench/_flood.py`, so its CPU never shares this process's GIL): `--connections`
sockets at once against the leader's client port, of which `--idle` present a valid client
certificate and then sit idle, `--stall` connect and send nothing, and the rest loop on TLS
handshakes WITHOUT a certificate (the node does the whole handshake, then refuses). Meanwhile
every 0.25 s: the leader's RSS, open descriptors and CPU (/proc), its accept queue
(/proc/net/tcp) and its `phalanx_is_leader`; every 2 s a fresh certified TLS connection to the
leader is tried (can a NEW client get in?).

Reports: leader and every node's term before/after, elections seen, write throughput and
p50/p99/max latency per phase, the leader's shed counters (`client_connections_shed`,
`client_handshakes_shed`, `client_handshake_failures`, `client_handshake_rate_waits`),
its peak RSS / descriptors / CPU, and the flood's own counters.

Exit status: 0 the leader kept leadership (same leader, no new term on any node), 1 it lost
it (a usable check), 2 the cluster could not be set up.

Usage: .venv/bin/python bench/attack_handshakes.py [--connections 2000] [--seconds 20]
       [--baseline 8] [--idle 400] [--stall 200] [--json]      (`make attack`)
Must not be imported by the package. Loopback only. Every process started here is stopped by
its pid (`NodeProcesses`, the flood's `trio.Process`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import trio
from _loadgen import percentile, proc_cpu_seconds
from _phalanx import PhalanxCluster, PhalanxUnavailable

from phalanx.client.async_client import Client, ClientError
from phalanx.ops.local_cluster import NodeProcesses
from phalanx.ops.node_config import load_node_config

PHASES = ("baseline", "flood", "recovery")
SHED_COUNTERS = ("client_connections_shed", "client_handshakes_shed",
                 "client_handshake_failures", "client_handshake_rate_waits",
                 "client_unauthenticated", "driver_slow_passes", "peer_queue_drops",
                 "peer_connections_shed")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scrape(cluster: PhalanxCluster, node: str) -> dict[str, float]:
    """Every `phalanx_*` number of `node`'s metrics endpoint, by name without the prefix and
    the `_total` suffix ({} if it does not answer)."""
    listen = load_node_config(cluster.config.node_config_path(node)).metrics_listen
    if listen is None:
        raise PhalanxUnavailable(f"{node} has no metrics endpoint")
    try:
        with urllib.request.urlopen(f"http://{listen.host}:{listen.port}/metrics",
                                    timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("phalanx_") or "_created" in line or "_bucket" in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0].removeprefix("phalanx_")
        name = name.removesuffix("_total")
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (bytes) and open descriptors of `pid` ({} once it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":", 1)[0]] = int(line.split()[1]) * 1024
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    return out


def accept_queue(port: int) -> int:
    """Connections waiting in the kernel's accept queue of the loopback listener on `port`
    (/proc/net/tcp: a LISTEN socket's rx_queue is its accept-queue length; -1 if none)."""
    try:
        with open("/proc/net/tcp", encoding="ascii") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return int(fields[4].split(":")[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return -1


@dataclass
class Watch:
    """What the monitors saw during the run."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    phase: str = "baseline"
    peak_rss: int = 0
    peak_fds: int = 0
    peak_queue: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    recovery_rate: list[int] = field(default_factory=list)
    """Puts acknowledged in each second of the recovery phase."""
    base_fds: int = 0
    not_leader_polls: int = 0
    polls: int = 0
    probes: int = 0
    probes_ok: int = 0
    probe_ms: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)


async def writer(client: Client, watch: Watch, stop: trio.Event) -> None:
    """Sequential puts, each timed and filed under the phase it started in."""
    seq = 0
    while not stop.is_set():
        phase = watch.phase
        t0 = time.perf_counter()
        try:
            await client.put(f"w{seq:07d}", b"x" * 100)
            watch.latencies[phase].append(time.perf_counter() - t0)
        except ClientError:
            watch.errors[phase] += 1
        seq += 1


async def monitor(cluster: PhalanxCluster, leader: str, pid: int, port: int, watch: Watch,
                  stop: trio.Event) -> None:
    """Leader RSS/fds/accept queue every 0.25 s and its is_leader gauge every 0.5 s."""
    tick = 0
    while not stop.is_set():
        st = proc_status(pid)
        watch.peak_rss = max(watch.peak_rss, st.get("VmRSS", 0))
        watch.peak_fds = max(watch.peak_fds, st.get("fds", 0))
        phase = watch.phase
        watch.peak_queue[phase] = max(watch.peak_queue[phase], accept_queue(port))
        if tick % 2 == 0:
            m = await trio.to_thread.run_sync(scrape, cluster, leader)
            watch.polls += 1
            if m.get("is_leader", 1.0) != 1.0:
                watch.not_leader_polls += 1
                log(f"  !! {leader} reports is_leader=0 (term {m.get('term', 0):.0f})")
        tick += 1
        await trio.sleep(0.25)


async def probe_new_connections(port: int, context: ssl.SSLContext, watch: Watch,
                                stop: trio.Event) -> None:
    """Every 2 s during the flood: can a new certified client finish a handshake (5 s)?"""
    while not stop.is_set():
        if watch.phase == "flood":
            watch.probes += 1
            t0 = time.perf_counter()
            try:
                with trio.fail_after(5):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    tls = trio.SSLStream(stream, context, server_hostname=None)
                    try:
                        await tls.do_handshake()
                        # The node refuses an unauthorized client right after the handshake;
                        # a status-less connection that is still open after a moment got in.
                        with trio.move_on_after(0.2):
                            await tls.receive_some(1)
                            raise trio.BrokenResourceError("closed by the node")
                    finally:
                        await trio.aclose_forcefully(tls)
                watch.probes_ok += 1
                watch.probe_ms.append((time.perf_counter() - t0) * 1e3)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError):
                pass
        await trio.sleep(2)


def probe_context(cluster: PhalanxCluster) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.load_verify_locations(cafile=cluster.config.ca)
    context.load_cert_chain(cluster.config.client_cert, cluster.config.client_key)
    return context


async def run(args: argparse.Namespace) -> dict[str, object]:
    load = os.getloadavg()[0]
    cluster = PhalanxCluster(protocol="raft", workdir=args.workdir)
    if args.trace_loop:  # the same nodes, their event loops traced (bench/_loop_trace.py)
        tracer = Path(__file__).with_name("_loop_trace.py")
        cluster.procs = NodeProcesses(
            cluster.config, command=lambda path: [sys.executable, str(tracer), str(path)])
    log(f"cluster in {cluster.directory} ({cluster.runner})")
    cluster.start()
    try:
        async with cluster.connected() as client:
            leader = await cluster.wait_ready()
            pid = cluster.procs.pid(leader)
            if pid is None:
                raise PhalanxUnavailable(f"leader {leader} has no process")
            node = next(n for n in cluster.config.nodes if n.id == leader)
            port = node.client_addr.port
            before = {n: await trio.to_thread.run_sync(scrape, cluster, n)
                      for n in cluster.procs.node_ids}
            terms_before = {n: int(m.get("term", 0)) for n, m in before.items()}
            log(f"leader {leader} (pid {pid}, client port {port}), terms {terms_before}")
            watch = Watch()
            watch.base_fds = proc_status(pid).get("fds", 0)
            stop = trio.Event()
            flood_out: dict[str, int] = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer, client, watch, stop)
                nursery.start_soon(monitor, cluster, leader, pid, port, watch, stop)
                nursery.start_soon(probe_new_connections, port, probe_context(cluster),
                                   watch, stop)
                t = time.perf_counter()
                cpu = proc_cpu_seconds(pid)
                log(f"baseline: {args.baseline:g} s of sequential puts, no flood")
                await trio.sleep(args.baseline)
                watch.seconds["baseline"] = time.perf_counter() - t
                watch.cpu["baseline"] = (proc_cpu_seconds(pid) - cpu) / watch.seconds["baseline"]
                nocert = args.connections - args.idle - args.stall
                log(f"flood: {args.connections:,} sockets at once for {args.seconds:g} s "
                    f"({nocert:,} no-certificate handshake loops, {args.idle} idle certified, "
                    f"{args.stall} silent)")
                watch.phase = "flood"
                t, cpu = time.perf_counter(), proc_cpu_seconds(pid)
                children = resource.getrusage(resource.RUSAGE_CHILDREN)
                flood = await trio.lowlevel.open_process(
                    [sys.executable, str(Path(__file__).with_name("_flood.py")),
                     "--port", str(port), "--ca", str(cluster.config.ca),
                     "--cert", str(cluster.config.client_cert),
                     "--key", str(cluster.config.client_key), "--nocert", str(nocert),
                     "--idle", str(args.idle), "--stall", str(args.stall),
                     "--seconds", str(args.seconds)],
                    stdout=subprocess.PIPE)
                try:
                    assert flood.stdout is not None
                    output = b""
                    with trio.fail_after(args.seconds + 60):
                        async for chunk in flood.stdout:
                            output += chunk
                        await flood.wait()
                finally:
                    if flood.returncode is None:
                        flood.kill()
                        await flood.wait()
                watch.seconds["flood"] = time.perf_counter() - t
                reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
                watch.cpu["flood_process"] = (
                    reaped.ru_utime + reaped.ru_stime - children.ru_utime - children.ru_stime
                ) / watch.seconds["flood"]
                watch.cpu["flood"] = (proc_cpu_seconds(pid) - cpu) / watch.seconds["flood"]
                if flood.returncode != 0 or not output.strip():
                    raise PhalanxUnavailable(f"the flood process exited {flood.returncode}")
                flood_out = json.loads(output.decode().strip().splitlines()[-1])
                watch.phase = "recovery"
                t = time.perf_counter()
                log(f"recovery: {args.recovery:g} s of puts after the flood")
                done = len(watch.latencies["recovery"])
                for _ in range(max(1, round(args.recovery))):
                    await trio.sleep(1)
                    now = len(watch.latencies["recovery"])
                    watch.recovery_rate.append(now - done)
                    done = now
                watch.seconds["recovery"] = time.perf_counter() - t
                stop.set()
            await trio.sleep(0.5)
            after = {n: await trio.to_thread.run_sync(scrape, cluster, n)
                     for n in cluster.procs.node_ids}
            leader_after = await cluster.leader()
    finally:
        cluster.stop()
    terms_after = {n: int(m.get("term", 0)) for n, m in after.items()}
    phases = {}
    for phase in PHASES:
        lat = sorted(watch.latencies[phase])
        secs = watch.seconds[phase]
        phases[phase] = {"puts": len(lat), "errors": watch.errors[phase], "seconds": secs,
                         "puts_per_s": len(lat) / secs if secs else 0.0,
                         "p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
                         "max_ms": (lat[-1] * 1e3) if lat else float("nan")}
    shed = {name: after[leader].get(name, 0.0) - before[leader].get(name, 0.0)
            for name in SHED_COUNTERS}
    lost = (leader_after != leader or terms_after != terms_before
            or watch.not_leader_polls > 0)
    return {
        "leader_before": leader, "leader_after": leader_after,
        "terms_before": terms_before, "terms_after": terms_after,
        "elections": int(sum(after[n].get("elections", 0) - before[n].get("elections", 0)
                         for n in after)),
        "not_leader_polls": watch.not_leader_polls, "polls": watch.polls,
        "lost_leadership": lost, "phases": phases, "leader_shed": shed,
        "leader_peak_rss_mib": watch.peak_rss / 2**20, "leader_fds_base": watch.base_fds,
        "leader_peak_fds": watch.peak_fds, "peak_accept_queue": watch.peak_queue,
        "recovery_puts_per_s": watch.recovery_rate, "leader_cpu": watch.cpu,
        "new_connection_probes": watch.probes, "new_connection_probes_ok": watch.probes_ok,
        "new_connection_probe_p50_ms": percentile(sorted(watch.probe_ms), 50),
        "flood": flood_out, "load_before": load, "load_after": os.getloadavg()[0],
    }


def report(r: dict[str, object]) -> str:
    phases = r["phases"]
    assert isinstance(phases, dict)
    lines = [f"leader {r['leader_before']} -> {r['leader_after']}; terms "
             f"{r['terms_before']} -> {r['terms_after']}; {r['elections']} elections; "
             f"is_leader=0 in {r['not_leader_polls']} of {r['polls']} polls: "
             + ("LOST LEADERSHIP" if r["lost_leadership"] else "kept leadership")]
    for phase in PHASES:
        p = phases[phase]
        lines.append(f"  {phase:<9} {p['puts']:6,} puts in {p['seconds']:5.1f} s = "
                     f"{p['puts_per_s']:7,.0f}/s  p50 {p['p50_ms']:6.1f} ms  p99 "
                     f"{p['p99_ms']:7.1f} ms  max {p['max_ms']:7.1f} ms  errors {p['errors']}")
    cpu = r["leader_cpu"]
    assert isinstance(cpu, dict)
    lines.append(f"  leader CPU {cpu.get('baseline', 0):.0%} of a core at baseline, "
                 f"{cpu.get('flood', 0):.0%} under the flood (the flood process: "
                 f"{cpu.get('flood_process', 0):.0%}); peak RSS "
                 f"{r['leader_peak_rss_mib']:.0f} MiB; open fds {r['leader_fds_base']} -> "
                 f"peak {r['leader_peak_fds']}")
    lines.append(f"  leader counters over the run: {r['leader_shed']}")
    lines.append(f"  peak accept queue of the leader's client port: {r['peak_accept_queue']}; "
                 f"puts/s in each second after the flood: {r['recovery_puts_per_s']}")
    lines.append(f"  new certified connections during the flood: "
                 f"{r['new_connection_probes_ok']} of {r['new_connection_probes']} got in "
                 f"(p50 {r['new_connection_probe_p50_ms']:.0f} ms)")
    lines.append(f"  flood process: {r['flood']}")
    lines.append(f"  machine load (1 min) {r['load_before']:.1f} before, "
                 f"{r['load_after']:.1f} after")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit status: 0 leadership kept, 1 lost, 2 setup failed.")
    p.add_argument("--connections", type=int, default=2000,
                   help="flood sockets held at once against the leader's client port")
    p.add_argument("--idle", type=int, default=400,
                   help="of those, certified connections that sit idle")
    p.add_argument("--stall", type=int, default=200,
                   help="of those, silent sockets that never start a handshake")
    p.add_argument("--seconds", type=float, default=20.0, help="flood duration")
    p.add_argument("--baseline", type=float, default=8.0, help="no-flood period first, seconds")
    p.add_argument("--recovery", type=float, default=5.0,
                   help="puts measured after the flood, seconds")
    p.add_argument("--workdir", default=None, help="where to put the cluster (default: tmp)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--trace-loop", action="store_true",
                   help="run the nodes with their event loop traced: scheduler batches over "
                        "PHALANX_LOOP_TRACE_MS (50) are logged to logs/<node>.log, with the "
                        "tasks that took the time (use with --workdir to keep the logs)")
    args = p.parse_args()
    if args.idle < 0 or args.stall < 0 or args.connections - args.idle - args.stall < 0:
        p.error("need --connections >= --idle + --stall (both >= 0)")
    if not 0 < args.connections <= 10_000 or not 0 < args.seconds <= 600:
        p.error("need 0 < --connections <= 10000 and 0 < --seconds <= 600")
    try:
        r = trio.run(run, args)
    except PhalanxUnavailable as e:
        print(f"attack_handshakes: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(r) if args.json else report(r))
    sys.exit(1 if r["lost_leadership"] else 0)


if __name__ == "__main__":
    main()

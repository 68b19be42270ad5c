"""Per-phase latency breakdown of one closed-loop client against a phalanx cluster.

Usage (from bench/): ``../.venv/bin/python latency_trace.py --protocol raft --duration 3``

Starts a cluster (`_phalanx.PhalanxCluster`, fsync "group") with ``PHALANX_TRACE_PHASES``
set, so every node writes its driver's phase events (`phalanx.runtime.phase_trace`), drives ONE
closed-loop writer and records each put's send and reply times on the same system-wide
monotonic clock. With one request in flight, every event a node logs between a put's send
and its reply belongs to that put: the report lists, per node and event, the median offset
of its first occurrence from the client's send, in time order, plus the client's p50.

Must not be imported by the package. Loopback only. Every process it starts is stopped
(`PhalanxCluster.stop`).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import trio
from _loadgen import make_value
from _phalanx import PhalanxCluster

from phalanx.client.async_client import ClientError
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names
from phalanx.runtime.phase_trace import ENV_VAR


def _load(path: Path) -> list[tuple[int, str, str]]:
    """(ns, event name, detail); a peer message's type is part of its event's name."""
    events: list[tuple[int, str, str]] = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 2:
            continue
        detail = parts[2] if len(parts) == 3 else ""
        name = f"{parts[1]}:{detail}" if parts[1] in ("recv", "send") else parts[1]
        events.append((int(parts[0]), name, detail))
    events.sort()
    return events


def breakdown(trace_dir: Path, requests: list[tuple[int, int]]) -> str:
    """The report: median first-occurrence offset (ms) of each node's events per request."""
    nodes = {p.stem: _load(p) for p in sorted(trace_dir.glob("*.trace"))}
    offsets: dict[tuple[str, str], list[float]] = defaultdict(list)
    counts: dict[tuple[str, str], list[int]] = defaultdict(list)
    for sent, answered in requests:
        for node, events in nodes.items():
            times = [t for t, _, _ in events]
            lo = bisect.bisect_left(times, sent)
            hi = bisect.bisect_right(times, answered)
            seen: dict[str, int] = {}
            for t, name, _ in events[lo:hi]:
                if name not in seen:
                    seen[name] = t
                counts[(node, name)].append(1)
            for name, t in seen.items():
                offsets[(node, name)].append((t - sent) / 1e6)
    n = len(requests)
    tails = _reply_tails(nodes, requests)
    rows = sorted(
        ((statistics.median(v), len(v), len(counts[k]), k) for k, v in offsets.items()
         if len(v) >= n // 2),
        key=lambda r: r[0],
    )
    latencies = sorted((b - a) / 1e6 for a, b in requests)
    works = sorted(float(d.split("us")[0]) / 1e3 for events in nodes.values()
                   for _, name, d in events if name == "io_work" and d.endswith(" sync"))
    out = [f"{n} requests; client p50 {statistics.median(latencies):.3f} ms, "
           f"p90 {latencies[int(0.9 * (n - 1))]:.3f} ms",
           f"fsynced persist work (all nodes, {len(works)} batches): p50 "
           f"{works[len(works) // 2] if works else 0:.3f} ms, p90 "
           f"{works[int(0.9 * (len(works) - 1))] if works else 0:.3f} ms",
           f"reply path (the leader's apply to the client's answer): p50 "
           f"{_median_ms(tails)}; between answer and next call (the load generator): p50 "
           f"{_median_ms([b[0] - a[1] for a, b in itertools.pairwise(sorted(requests))])}",
           f"{'median ms':>10} {'in % reqs':>9} {'per req':>8}  node  event"]
    for med, present, total, (node, name) in rows:
        out.append(f"{med:10.3f} {100 * present / n:9.0f} {total / n:8.1f}  {node:5} {name}")
    return "\n".join(out)


def _median_ms(values_ns: list[int]) -> str:
    return f"{statistics.median(values_ns) / 1e6:.3f} ms" if values_ns else "n/a"


def _reply_tails(nodes: dict[str, list[tuple[int, str, str]]],
                 requests: list[tuple[int, int]]) -> list[int]:
    """Per request (one in flight): its answer time minus the leader's last ``apply`` before
    it (the leader is the node that logged the request's ``call``)."""
    tails: list[int] = []
    for sent, answered in requests:
        for events in nodes.values():
            times = [t for t, _, _ in events]
            lo = bisect.bisect_left(times, sent)
            hi = bisect.bisect_right(times, answered)
            window = events[lo:hi]
            if any(name == "call" for _, name, _ in window):
                applies = [t for t, name, _ in window if name == "apply"]
                if applies:
                    tails.append(answered - applies[-1])
                break
    return tails


async def _drive(cluster: PhalanxCluster, *, clients: int, warmup: float, duration: float,
                 value: bytes) -> list[tuple[int, int]]:
    clock = time.monotonic_ns
    out: list[tuple[int, int]] = []
    async with cluster.connected() as client:
        for attempt in range(200):  # until the cluster answers
            # A fresh key per attempt: a signing client requires it "absent", and a timed-out
            # attempt may still have committed (then "warm" again would abort forever).
            key = f"warm-{attempt}"
            try:
                await client.put(key, value, requirements=(
                    {key: b""} if client.signs_transactions else None))
                break
            except ClientError:  # still electing
                await trio.sleep(0.1)
        start = clock()

        async def writer(index: int) -> None:
            seq = 0
            while clock() - start < (warmup + duration) * 1e9:
                t0 = clock()
                key = f"k{index}-{seq}"
                # A signing client (leaderless) names the version it overwrites: "absent"
                # (else `put` first reads the key's base version: a second round trip).
                await client.put(key, value, requirements=(
                    {key: b""} if client.signs_transactions else None))
                t1 = clock()
                seq += 1
                if t0 - start >= warmup * 1e9:
                    out.append((t0, t1))

        async with trio.open_nursery() as nursery:
            for index in range(clients):
                nursery.start_soon(writer, index)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", choices=protocol_names(), default=DEFAULT_PROTOCOL)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--clients", type=int, default=1,
                   help="closed-loop writers; above 1 the per-request attribution mixes "
                   "requests (use the raw traces kept with --keep)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--keep", default=None,
                   help="directory to keep the traces (and breakdown.txt) in")
    args = p.parse_args()
    trace_dir = Path(args.keep or tempfile.mkdtemp(prefix="phalanx-trace-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.trace"):
        old.unlink()
    cluster = PhalanxCluster(protocol=args.protocol, workdir=None,
                             nodes=get_protocol(args.protocol).default_nodes)
    try:
        os.environ[ENV_VAR] = str(trace_dir)  # inherited by the node processes only
        cluster.start()
        del os.environ[ENV_VAR]
        requests = trio.run(lambda: _drive(cluster, clients=args.clients, warmup=args.warmup,
                                           duration=args.duration,
                                           value=make_value(args.value_size)))
    finally:
        cluster.stop()
    report = "\n".join((f"load: {os.getloadavg()}",
                        f"{len(requests) / args.duration:.0f} writes/s",
                        breakdown(trace_dir, requests)))
    (trace_dir / "breakdown.txt").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()

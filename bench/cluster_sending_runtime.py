"""Cluster-sending between two real clusters of processes on loopback, over mutual TLS
(issue 18, item 5): a Raft cluster of 3 (crash certificates) and a PBFT cluster of 4
(Byzantine 2f+1 certificates), `cluster init --service clustersend` + `cluster link`.

Prints, per direction, the send-to-apply latency of values sent one at a time: from the
sending client's write of the outbox entry returning (committed in the sending cluster) to
the value being visible in the receiving cluster's replicated inbox (a STALE read at one
receiving node, polled every 2 ms: the figure includes up to a poll), and the messages per
value from the nodes' metrics pages: inter-cluster messages (CsSend + CsConfirm crossing),
and the service's intra-cluster messages by type (CsSign, CsEcho, CsAck, CsConfirm relays,
CsQuery). The consensus messages of the two orderings are not included.

Usage: `python bench/cluster_sending_runtime.py [--values 30]` (~30 s).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import trio

from phalanx.apps.kv_types import Get, Value
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.client.async_client import open_client
from phalanx.net.client_protocol import ReadConsistency
from phalanx.ops.link import link_clusters
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig
from phalanx.services.clustersend_node import outbox_command

_EVENT = re.compile(r'phalanx_service_events_total\{event="([^"]+)",node="[^"]*",'
                    r'service="clustersend"\} ([0-9.e+]+)')


def scrape(cluster: ClusterConfig, base: int) -> dict[str, float]:
    total: dict[str, float] = {}
    for i, _ in enumerate(cluster.nodes):
        url = f"http://127.0.0.1:{base + 200 + i}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for event, value in _EVENT.findall(r.read().decode()):
                total[event] = total.get(event, 0.0) + float(value)
    return total


async def ready(cluster: ClusterConfig) -> None:
    async with open_client(cluster, timeout=60) as client:
        await client.call(encode_command(Get(key="warm-up")), read_only=True)


async def one_way(src: ClusterConfig, dst: ClusterConfig, src_id: str, dst_id: str,
                  values: int) -> list[float]:
    out = []
    async with open_client(src, timeout=20) as writer, open_client(dst, timeout=20) as reader:
        for seq in range(values):
            value = f"{src.protocol}->{dst.protocol} {seq}".encode()
            await writer.call(outbox_command(dst_id, seq, value))
            committed = time.perf_counter()
            key = f"cs/in/{src_id}/{seq:010d}"
            with trio.fail_after(30):
                while True:
                    result = decode_result(await reader.call(
                        encode_command(Get(key=key)), read_only=True,
                        consistency=ReadConsistency.STALE))
                    if isinstance(result, Value) and result.value == value:
                        break
                    await trio.sleep(0.002)
            out.append(time.perf_counter() - committed)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, default=30, help="values per direction")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cs-bench-"))
    base_a = find_free_base_port(3)
    base_b = base_a
    while abs(base_b - base_a) < 300:
        base_b = find_free_base_port(4)
    a = init_cluster(root / "raft", protocol="raft", nodes=3, base_port=base_a,
                     services=("clustersend",))
    b = init_cluster(root / "pbft", protocol="pbft", nodes=4, base_port=base_b,
                     services=("clustersend",))
    la, lb = link_clusters(a.directory, b.directory)
    procs = [NodeProcesses(a), NodeProcesses(b)]
    try:
        for p in procs:
            p.start()

        async def run() -> None:
            await ready(a)
            await ready(b)
            for src, dst, sl, dl, base_s, base_d in ((a, b, la, lb, base_a, base_b),
                                                     (b, a, lb, la, base_b, base_a)):
                before = {**{f"s:{k}": v for k, v in scrape(src, base_s).items()},
                          **{f"d:{k}": v for k, v in scrape(dst, base_d).items()}}
                lat = await one_way(src, dst, sl.cluster_id, dl.cluster_id, args.values)
                await trio.sleep(1.0)  # the last confirmations and relays
                after = {**{f"s:{k}": v for k, v in scrape(src, base_s).items()},
                         **{f"d:{k}": v for k, v in scrape(dst, base_d).items()}}
                per = {k: (after[k] - before.get(k, 0.0)) / args.values for k in after}
                lat_ms = sorted(x * 1000 for x in lat)
                print(f"== {src.protocol} (n={len(src.nodes)}) -> {dst.protocol} "
                      f"(n={len(dst.nodes)}), {args.values} values one at a time")
                print(f"   send-to-apply ms: median {statistics.median(lat_ms):.1f}  "
                      f"p90 {lat_ms[int(0.9 * (len(lat_ms) - 1))]:.1f}  max {lat_ms[-1]:.1f}"
                      f"  min {lat_ms[0]:.1f}")
                inter = per.get("s:sent_intercluster", 0) + per.get("d:sent_intercluster", 0)
                print(f"   inter-cluster messages per value: {inter:.2f}")
                kinds = ("CsSign", "CsSend", "CsEcho", "CsAck", "CsConfirm", "CsQuery")
                for side, name in (("s", "sending"), ("d", "receiving")):
                    parts = "  ".join(f"{k} {per.get(f'{side}:sent:{k}', 0):.2f}"
                                      for k in kinds if per.get(f"{side}:sent:{k}", 0))
                    print(f"   {name} cluster sent per value: {parts}")
                print(f"   attempts per value: {per.get('s:machine:attempts', 0):.2f} "
                      f"(summed over sending members)")

        trio.run(run)
    finally:
        for p in procs:
            p.stop(grace=5.0)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

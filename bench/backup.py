"""What `phalanx snapshot save` costs a running cluster, and what a restore takes.

An in-process 3-node Raft cluster (real TLS sockets, fsync as configured by `cluster init`)
is loaded with `--keys` keys of `--value-bytes` bytes; then, while a writer keeps writing:
a backup (`request_backup`: the node serialises its state into DATA_DIR/backup on a worker
thread), its transfer and packaging into one file (`fetch_backup`, `package_backup`), a
second backup after the first `--change` of the keys (a contiguous run) changed (the
backup store is content-addressed: only changed pieces are written again), and a restore
into a new cluster plus its first read. The writer's put latency (the client's own
histogram, `Client.latency`) is printed for the second before the backup and for the
backup itself, so the backup's effect on writes shows. Figures are wall times on
whatever machine runs it (no targets).

    .venv/bin/python bench/backup.py [--keys 20000] [--value-bytes 100] [--change 0.01]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import trio

from phalanx.client.async_client import Client, open_client
from phalanx.client.latency import LatencySnapshot
from phalanx.ops.backup import (
    fetch_backup,
    package_backup,
    request_backup,
    restore_snapshot,
)
from phalanx.ops.local_cluster import find_free_base_port, init_cluster, open_cluster
from phalanx.ops.node_config import ClusterConfig, load_node_config
from phalanx.runtime.node import serve_node


def _since(now: Mapping[tuple[str, str], LatencySnapshot],
           then: Mapping[tuple[str, str], LatencySnapshot]) -> LatencySnapshot:
    a, b = now[("write", "ok")], then.get(("write", "ok"))
    counts = tuple(x - (b.counts[i] if b else 0) for i, x in enumerate(a.counts))
    return LatencySnapshot(bounds=a.bounds, counts=counts, count=sum(counts),
                           sum=a.sum - (b.sum if b else 0.0))


def _line(what: str, s: LatencySnapshot) -> str:
    return (f"  writes {what:<16} {s.count:6d} puts, mean {s.mean * 1000:7.2f} ms, p50 <= "
            f"{s.quantile(0.5) * 1000:g} ms, p99 <= {s.quantile(0.99) * 1000:g} ms")


async def _serve(cluster: ClusterConfig, nursery: trio.Nursery) -> None:
    for peer in cluster.nodes:
        await nursery.start(serve_node, load_node_config(cluster.node_config_path(peer.id)))


async def _load(client: Client, keys: range, value: bytes, tasks: int = 32) -> None:
    async def worker(k: int) -> None:
        for i in keys[k::tasks]:
            await client.put(f"key{i:08d}", value)

    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(worker, k)


async def _measure(client: Client, cluster: ClusterConfig, root: Path, keys: int,
                   value_bytes: int, change: float) -> None:
    await trio.sleep(0.5)
    before = client.latency()
    await trio.sleep(1.0)
    mark = client.latency()
    t = time.perf_counter()
    reply, commit = await request_backup(cluster, seconds=120)
    node_s = time.perf_counter() - t
    during = client.latency()
    t = time.perf_counter()
    data = await fetch_backup(cluster, reply, seconds=120)
    saved = await trio.to_thread.run_sync(
        package_backup, cluster, reply, commit, data, root / "b1.phx")
    pack_s = time.perf_counter() - t
    size = (root / "b1.phx").stat().st_size
    print(f"backup 1: index {reply.index}, node wrote it in {node_s:.2f} s, fetched and "
          f"packaged "
          f"in {pack_s:.2f} s, file {size / 1e6:.1f} MB "
          f"({saved.header.data_bytes / 1e6:.1f} MB of state)")
    print(_line("1 s before", _since(mark, before)))
    print(_line("during backup", _since(during, mark)))
    backup_dir = root / "old" / "data" / reply.node / "backup"
    packs_before = {p.name for p in backup_dir.glob("*.pack")}
    await _load(client, range(int(keys * change)), b"w" * value_bytes)  # a contiguous run
    t = time.perf_counter()
    reply2, _ = await request_backup(cluster, seconds=120)
    node2_s = time.perf_counter() - t
    fresh = sum(p.stat().st_size for p in backup_dir.glob("*.pack")
                if p.name not in packs_before)
    print(f"backup 2 after {change:.1%} of the keys changed: index {reply2.index}, "
          f"{node2_s:.2f} s, {fresh / 1e6:.2f} MB of new pack data")


async def bench(root: Path, keys: int, value_bytes: int, change: float) -> Path:
    init_cluster(root / "old", nodes=3, base_port=find_free_base_port(3))
    cluster = open_cluster(root / "old")
    value = b"v" * value_bytes
    async with trio.open_nursery() as nursery:
        await _serve(cluster, nursery)
        async with open_client(cluster, timeout=30) as client:
            t = time.perf_counter()
            await _load(client, range(keys), value)
            print(f"loaded {keys} keys of {value_bytes} B in {time.perf_counter() - t:.1f} s")
            stop = trio.Event()

            async def writer() -> None:
                i = 0
                while not stop.is_set():
                    await client.put(f"live{i % 1000}", value)
                    i += 1

            async with trio.open_nursery() as inner:
                inner.start_soon(writer)
                await _measure(client, cluster, root, keys, value_bytes, change)
                stop.set()
        nursery.cancel_scope.cancel()
    t = time.perf_counter()
    restore_snapshot(root / "b1.phx", root / "new")
    restore_s = time.perf_counter() - t
    new = open_cluster(root / "new")
    async with trio.open_nursery() as nursery:
        t = time.perf_counter()
        await _serve(new, nursery)
        async with open_client(new, timeout=30) as client:
            got = await client.get("key00000000")
            first_s = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    assert got == value
    print(f"restore: new cluster laid out in {restore_s:.2f} s; started, first read after "
          f"{first_s:.2f} s")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--change", type=float, default=0.01)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="phalanx-backup-bench-"))
    try:
        trio.run(bench, root, args.keys, args.value_bytes, args.change)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"(load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()

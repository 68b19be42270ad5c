"""Signed chain transfers per second and latency on real clusters, beside the KV app.

For each protocol (Raft 3 nodes, PBFT 4 nodes) and app (kv: 100-byte puts; chain: signed
transfers between the genesis accounts a1..a5), one fresh cluster of node processes
(`cluster init --app`, fsync "group": every write fsynced, writes batched), `--workers`
closed-loop writers sharing one client for `--seconds`. Each chain worker sends from its own
account with its own nonce counter (no nonce races); every transfer carries a fresh
Ed25519 signature, verified on arrival (admission) and again in apply (the default policy).

Prints one row per (protocol, app): ops/s, p50 and p99 latency, errors. Loopback only.
Must not be imported by the package. Every process started here is stopped by its pid.

    .venv/bin/python bench/chain_cluster.py [--seconds 8] [--workers 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import trio

from phalanx.apps.chain.block import chain_id
from phalanx.apps.chain.tx import TxBody, public_key, sign
from phalanx.appspec.chain_app import account_key, key_path, read_genesis
from phalanx.client.async_client import ClientError, RequestRejected, open_client
from phalanx.client.chain import ChainClient
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig

ACCOUNTS = ("a1", "a2", "a3", "a4", "a5")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _wait_ready(cluster: ClusterConfig) -> None:
    async with open_client(cluster, timeout=2.0, attempt_timeout=0.5) as client:
        deadline = trio.current_time() + 30
        while True:
            try:
                await client.call(b"", read_only=True)
                return
            except RequestRejected:  # an answer (the chain refuses an empty query): ready
                return
            except ClientError:
                if trio.current_time() > deadline:
                    raise
                await trio.sleep(0.2)


async def _load(cluster: ClusterConfig, chain: bool, workers: int, seconds: float
                ) -> tuple[int, int, list[float]]:
    latencies: list[float] = []
    errors = 0
    keys = [account_key(key_path(cluster.directory, a)) for a in ACCOUNTS] if chain else []
    chain_of = chain_id(read_genesis(cluster.app_files["genesis"])) if chain else b""
    async with open_client(cluster, timeout=5.0) as client:
        helper = ChainClient(client)
        stop_at = trio.current_time() + seconds

        async def worker(slot: int) -> None:
            nonlocal errors
            rng = random.Random(slot)
            nonce = 0
            while trio.current_time() < stop_at:
                start = time.perf_counter()
                try:
                    if chain:
                        nonce += 1
                        key = keys[slot % len(keys)]
                        to = public_key(keys[(slot + 1) % len(keys)])
                        body = TxBody(chain_id=chain_of, sender=public_key(key),
                                      nonce=nonce, method="transfer", args=(to, 1))
                        tx = sign(key, body)
                        await helper.submit(tx.raw)
                    else:
                        from phalanx.apps import kv_wire
                        from phalanx.apps.kv_types import Put

                        await client.call(kv_wire.encode_command(
                            Put(key=f"k{rng.randrange(1000)}", value=b"v" * 100)))
                except ClientError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)

        async with trio.open_nursery() as nursery:
            for slot in range(workers):
                nursery.start_soon(worker, slot)
    return len(latencies), errors, latencies


def _one(protocol: str, nodes: int, app: str, chain: bool, args: argparse.Namespace,
         root: Path) -> str:
    cluster = init_cluster(root / f"{protocol}-{app}", protocol=protocol, nodes=nodes, app=app,
                           base_port=find_free_base_port(nodes))
    with NodeProcesses(cluster) as procs:
        procs.start()
        trio.run(_wait_ready, cluster)
        ok, errors, lat = trio.run(_load, cluster, chain, args.workers, args.seconds)
    return (f"{protocol:5} n={nodes}  {app:5}  {ok / args.seconds:8.0f} ops/s  "
            f"p50 {_pct(lat, 0.5) * 1000:6.1f} ms  p99 {_pct(lat, 0.99) * 1000:6.1f} ms  "
            f"errors {errors}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.workers} closed-loop writers, {args.seconds:g} s each, fsync group",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-chain-bench-") as tmp:
        for protocol, nodes in (("raft", 3), ("pbft", 4)):
            for app, chain in (("kv", False), ("chain", True)):
                print(_one(protocol, nodes, app, chain, args, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

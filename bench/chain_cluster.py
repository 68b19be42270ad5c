"""Signed chain transfers per second and latency on real clusters, beside the KV app.

For each protocol (Raft 3 nodes, PBFT 4 nodes) and app (kv: 100-byte puts; chain: signed
transfers between the genesis accounts a1..a5), one fresh cluster of node processes
(`cluster init --app`, fsync "group": every write fsynced, writes batched), `--workers`
closed-loop writers sharing one client for `--seconds`. Each chain worker sends from its own
account with its own nonce counter (no nonce races); every transfer carries a fresh
Ed25519 signature, verified on arrival (admission) and again in apply (the default policy).

The chain runs twice per protocol, in the same run: with the block-certifier service (what
`cluster init --app chain` writes: every node signs every block, collects a quorum
certificate and stores it) and without it (``[block-certifier] enabled = false``). With it,
the row adds the cost per block scraped from n1's metrics page after the load (signatures
received and verified, certificates stored, bytes stored) and the CPU per block of one
node's certifier (sign its block, verify n-1 peers' signatures, build the certificate),
timed in process on the same machine.

Prints one row per (protocol, app): ops/s, p50 and p99 latency, errors. Loopback only.
Must not be imported by the package. Every process started here is stopped by its pid.

    .venv/bin/python bench/chain_cluster.py [--seconds 8] [--workers 5] [--no-kv] [--pairs 2]
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


def _certifier_cpu_us(nodes: int, quorum: int, blocks: int = 500) -> float:
    """One node's certifier CPU per block (us): sign its block, add n-1 peers' signatures
    (each verified unless the block is already certified), as on a real node."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.apps.chain.certificate import (
        BlockCertifier,
        ed25519_signer,
        raw_public_key,
        sign_block,
    )

    secrets = {f"n{i}": Ed25519PrivateKey.generate() for i in range(1, nodes + 1)}
    keys = {n: raw_public_key(k.public_key()) for n, k in secrets.items()}
    chain = bytes(32)
    me = BlockCertifier(node="n1", sign=ed25519_signer(secrets["n1"]), chain_id=chain,
                        node_keys=keys, quorum=quorum)
    peers = [[sign_block(node=n, chain_id=chain, height=h, block_hash=h.to_bytes(32, "big"),
                         sign=ed25519_signer(secrets[n])) for n in sorted(secrets) if n != "n1"]
             for h in range(1, blocks + 1)]
    start = time.process_time()
    for h in range(1, blocks + 1):
        me.local_block(h, h.to_bytes(32, "big"))
        for sig in peers[h - 1]:
            me.add(sig)
    return (time.process_time() - start) / blocks * 1e6


def _scrape(cluster: ClusterConfig) -> dict[str, float]:
    """n1's block-certifier counters from its metrics page (event -> value)."""
    import re
    import urllib.request

    from phalanx.ops.node_config import load_node_config

    config = load_node_config(cluster.node_config_path(cluster.nodes[0].id))
    if config.metrics_listen is None:
        return {}
    addr = config.metrics_listen
    with urllib.request.urlopen(f"http://{addr.host}:{addr.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        label = re.search(r'(?:event|name)="([^"]+)"', line)
        if 'service="block-certifier"' in line and label is not None:
            out[label.group(1)] = float(line.rsplit(" ", 1)[1])
    return out


async def _head(cluster: ClusterConfig) -> int:
    async with open_client(cluster, timeout=5.0) as client:
        return (await ChainClient(client).head()).height


def _one(protocol: str, nodes: int, app: str, chain: bool, args: argparse.Namespace,
         root: Path, *, certifier: bool = True) -> str:
    label = app if not chain else ("chain" if certifier else "chain-nocert")
    cluster = init_cluster(root / f"{protocol}-{label}", protocol=protocol, nodes=nodes,
                           app=app, base_port=find_free_base_port(nodes),
                           service_options={"block-certifier": {
                               "enabled": certifier, "tick_ms": args.cert_tick_ms}})
    extra = ""
    with NodeProcesses(cluster) as procs:
        procs.start()
        trio.run(_wait_ready, cluster)
        ok, errors, lat = trio.run(_load, cluster, chain, args.workers, args.seconds)
        if chain and certifier:
            time.sleep(1.5)  # the metrics page's copy refreshes every second
            height = trio.run(_head, cluster)
            m = _scrape(cluster)
            per = max(1, height)
            got = m.get("received", 0)
            extra = (f"\n      blocks {height} ({ok / per:.1f} transfers/block); n1: "
                     f"{m.get('stored', 0):.0f} certificates stored, "
                     f"{m.get('bytes_stored', 0) / per:.0f} B stored/block, "
                     f"{got / per:.2f} peer signatures received/block (late ones, after the "
                     f"quorum, are dropped unverified), "
                     f"dropped {({k: v for k, v in m.items() if k.startswith('dropped:')})}")
    return (f"{protocol:5} n={nodes}  {label:12}  {ok / args.seconds:8.0f} ops/s  "
            f"p50 {_pct(lat, 0.5) * 1000:6.1f} ms  p99 {_pct(lat, 0.99) * 1000:6.1f} ms  "
            f"errors {errors}{extra}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--no-kv", action="store_true", help="skip the KV rows")
    parser.add_argument("--protocols", default="raft,pbft", help="comma-separated")
    parser.add_argument("--pairs", type=int, default=1,
                        help="chain runs with and without the certifier, order alternating")
    parser.add_argument("--cert-tick-ms", type=int, default=100,
                        help="[block-certifier] tick_ms (how often certificates are fsynced)")
    args = parser.parse_args()
    print(f"{args.workers} closed-loop writers, {args.seconds:g} s each, fsync group",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-chain-bench-") as tmp:
        chosen = args.protocols.split(",")
        for protocol, nodes in (("raft", 3), ("pbft", 4)):
            if protocol not in chosen:
                continue
            if not args.no_kv:
                print(_one(protocol, nodes, "kv", False, args, Path(tmp)), flush=True)
            for pair in range(args.pairs):  # alternate the order: the load here drifts
                for certifier in ((True, False) if pair % 2 == 0 else (False, True)):
                    print(_one(protocol, nodes, "chain", True, args, Path(tmp) / str(pair),
                               certifier=certifier), flush=True)
    from phalanx.apps.chain.certificate import (
        BlockSignature,
        byzantine_certificate_quorum,
        crash_certificate_quorum,
    )
    from phalanx.net.wire import encode

    sig = encode(BlockSignature(chain_id=bytes(32), height=1, block_hash=bytes(32),
                                node="n1", signature=bytes(64)))
    for name, nodes, quorum in (("raft", 3, crash_certificate_quorum(3)),
                                ("pbft", 4, byzantine_certificate_quorum(4))):
        print(f"{name} n={nodes}: per block each node sends {nodes - 1} BlockSignatures of "
              f"{len(sig)} B (payload, before framing/TLS); certifier CPU per block per node "
              f"{_certifier_cpu_us(nodes, quorum):.0f} us (sign 1, verify up to {nodes - 1})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU of N single-client writes through a 3-node Raft cluster run inside ONE process.

Usage (from bench/)::

    ../.venv/bin/python inproc_cpu.py --writes 2000            # process CPU per write
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        ../.venv/bin/python inproc_cpu.py --writes 200 --tick-ms 200
    # ... and again with --writes 400: (Ir(400) - Ir(200)) / 200 = instructions per write

The three nodes (`phalanx.node.open_node`, fsync "group", TLS on loopback, the real peer
transport, driver, WAL and KV replica) and one closed-loop `phalanx.client.Client` share one
trio run: one thread does all the work, so the CPU a write costs, on every node and in the
client, is the process's CPU divided by the writes, with no other process in the figure.
Counting instructions (valgrind) makes it independent of this machine's clock drift; the
difference of two runs removes start-up (certificates, elections, connections). Kernel time
(sends, fsyncs) is not in an instruction count: `--strace`-style syscall counts are a
separate figure.

Not the benchmark of record (`kv.py`: real processes): three event loops in one thread
never wait for one another's scheduling, so wall latency here is a lower bound.

Must not be imported by the package. Loopback only; everything runs under a temporary
directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from phalanx import pki
from phalanx.client import open_client
from phalanx.config import (
    Address,
    CheckpointConfig,
    NodeConfig,
    PeerConfig,
    TimingConfig,
    TlsFiles,
)
from phalanx.node import Node, open_node
from phalanx.ports import free_ports

HOST = "127.0.0.1"


def _configs(root: Path, *, tick_ms: int) -> tuple[list[NodeConfig], Path]:
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    ids = ["n1", "n2", "n3"]
    ports = free_ports(6)
    peer = {i: Address(host=HOST, port=ports[k]) for k, i in enumerate(ids)}
    client = {i: Address(host=HOST, port=ports[3 + k]) for k, i in enumerate(ids)}
    configs = []
    for node_id in ids:
        paths = pki.write_credentials(pki.issue_node_cert(ca, node_id), root / "nodes" / node_id)
        configs.append(NodeConfig(
            id=node_id, protocol="raft", data_dir=root / "data" / node_id,
            peer_listen=peer[node_id], client_listen=client[node_id], metrics_listen=None,
            tls=TlsFiles(ca=paths.ca_certificate, cert=paths.certificate, key=paths.private_key),
            peers=tuple(PeerConfig(id=o, peer_addr=peer[o], client_addr=client[o])
                        for o in ids if o != node_id),
            fsync="group",
            timing=TimingConfig(tick_ms=tick_ms, election_ticks=10, heartbeat_ticks=3),
            checkpoint=CheckpointConfig(every_entries=1_000_000, every_bytes=1 << 30, keep=3),
        ))
    return configs, root


async def _run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="inproc-cpu-") as tmp:
        configs, root = _configs(Path(tmp), tick_ms=args.tick_ms)
        client_paths = pki.write_credentials(
            pki.issue_client_cert(pki.load_ca(root / "ca"), "bench"), root / "client")
        nodes: list[Node] = []
        async with contextlib.AsyncExitStack() as stack:
            for config in configs:
                nodes.append(await stack.enter_async_context(open_node(config)))
            deadline = trio.current_time() + 60
            while (sum(n.core_status().role == "leader" for n in nodes) != 1  # noqa: ASYNC110
                   and trio.current_time() < deadline):
                await trio.sleep(args.tick_ms / 1000)  # polls the nodes' status
            context = pki.client_context(client_paths.ca_certificate,
                                         certificate=client_paths.certificate,
                                         private_key=client_paths.private_key,
                                         check_hostname=False)
            addresses = [(c.id, HOST, c.client_listen.port) for c in configs]
            async with open_client(addresses, ssl_context=context) as kv:
                value = b"v" * args.value_size
                for i in range(args.warmup):
                    await kv.put(f"w{i}", value)
                latencies = []
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for i in range(args.writes):
                    t = time.perf_counter()
                    await kv.put(f"k{i}", value)
                    latencies.append(time.perf_counter() - t)
                cpu = time.process_time() - cpu0
                wall = time.perf_counter() - wall0
            print(f"{args.writes} writes in {wall:.2f} s: CPU {cpu / args.writes * 1e3:.3f} ms "
                  f"per write (all 3 nodes + client, one thread), in-process p50 "
                  f"{statistics.median(latencies) * 1e3:.3f} ms; load "
                  f"{os.getloadavg()[0]:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--tick-ms", type=int, default=10,
                   help="raise it under valgrind, so ticks stay rare while everything crawls")
    args = p.parse_args(argv)
    trio.run(_run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

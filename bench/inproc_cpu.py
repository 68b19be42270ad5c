"""CPU of N single-client writes through a 3-node Raft cluster run inside ONE process.

Usage (from bench/)::

    ../.venv/bin/python inproc_cpu.py --writes 2000            # process CPU per write
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        ../.venv/bin/python inproc_cpu.py --writes 200 --tick-ms 200
    # ... and again with --writes 400: (Ir(400) - Ir(200)) / 200 = instructions per write

The three nodes (`phalanx.runtime.node.open_node`, fsync "group", TLS on loopback, the real peer
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
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from phalanx.client.async_client import open_client
from phalanx.ops import pki
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import NodeConfig, TimingConfig, load_node_config
from phalanx.runtime.node import Node, open_node


def _configs(root: Path, *, tick_ms: int) -> tuple[list[NodeConfig], pki.CredentialPaths]:
    """A 3-node cluster laid out by `phalanx cluster init` (CA, certificates, configs), with
    no metrics listeners and checkpoints out of the way of the measured writes."""
    cluster = init_cluster(
        root / "cluster", nodes=3, base_port=find_free_base_port(3), fsync="group",
        timing=TimingConfig(tick_ms=tick_ms, election_ticks=10, heartbeat_ticks=3),
        checkpoint_every=1_000_000,
    )
    configs = [dataclasses.replace(load_node_config(cluster.node_config_path(n.id)),
                                   metrics_listen=None)
               for n in cluster.nodes]
    client = pki.CredentialPaths(certificate=cluster.client_cert, private_key=cluster.client_key,
                                 ca_certificate=cluster.ca)
    return configs, client


async def _run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="inproc-cpu-") as tmp:
        configs, client_paths = _configs(Path(tmp), tick_ms=args.tick_ms)
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
            addresses = [(c.id, c.client_listen.host, c.client_listen.port) for c in configs]
            async with open_client(addresses, ssl_context=context,
                                   client_id=pki.new_client_id(client_paths.certificate)) as kv:
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

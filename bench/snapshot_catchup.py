"""Snapshot catch-up and recovery of a Raft follower on a real 3-node cluster (separate
processes, loopback TLS, real disks): how long until it serves again, and how many bytes it
was sent.

Scenarios (`--scenario`):
- ``late`` (the default): stop a follower, load the state, restart it (`--wipe`: with an
  empty data directory): it needs the whole checkpoint.
- ``restart``: load, stop a follower, restart it from its own disk (checkpoint + WAL).
- ``wipe``: load, stop a follower, wipe its data directory, restart it: it rejoins from its
  peers (shard-level state transfer: every piece, from both peers in parallel).
- ``lag``: load, stop a follower, write `--lag-percent` of the keys again (`--lag-pattern`
  ``random`` keys, or one ``range`` of keys), restart it: it fetches only the pieces the
  writes touched.
`--piece-memory-mb N` sets the nodes' ``PHALANX_PIECE_MEMORY_MB`` (0: peers serve pieces from
their packs only, as before pieces were kept in memory; default: the node's own default).
`--full` runs the nodes with ``PHALANX_PIECE_TRANSFER=off``: today's whole-checkpoint
InstallSnapshot, for the comparison. Before the restart, the leader's checkpoints settle (its
log no longer reaches back to the follower, so only a snapshot catches it up).

Measured: the time from the follower's process start until its applied index reaches the
leader's (it serves again), the follower's `peer_bytes_in` (everything it received since its
restart) and the change of the leader's `peer_bytes_out` (to both followers); the follower's
process CPU time (all of it since its start) and the peers' during the catch-up (serving).
`--keys N` loads N keys of `--value-bytes` in transactions of 128 puts (fast, for 1M keys);
without it, `--state-mb` of 64 KiB values one put at a time (the 2x-bound run below).
Target (docs/RELIABILITY.md): bytes received <= 2x the checkpoint, time near disk speed.

Usage: .venv/bin/python bench/snapshot_catchup.py [--state-mb 100] [--wipe] [--json]
       .venv/bin/python bench/snapshot_catchup.py --keys 1000000 --scenario wipe [--full]
       (the 1 GB run: --state-mb 1024; it needs ~3x that in free disk and a few minutes)
Must not be imported by the package. Every process started here is stopped by its pid
(`NodeProcesses`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
import urllib.request
from collections.abc import Sequence

import trio
from _loadgen import make_value
from _phalanx import PhalanxCluster, PhalanxUnavailable

from phalanx.apps.kv_types import MAX_TXN_OPS, Put
from phalanx.client.async_client import ClientError
from phalanx.ops.node_config import load_node_config
from phalanx.runtime.piece_transfer import DISABLE_ENV
from phalanx.storage.packs import MAGIC3, decode_manifest
from phalanx.storage.volatile import PIECE_MEMORY_ENV


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scrape(cluster: PhalanxCluster, node: str, name: str) -> float:
    """One counter from `node`'s metrics endpoint (0 if absent)."""
    listen = load_node_config(cluster.config.node_config_path(node)).metrics_listen
    if listen is None:
        raise PhalanxUnavailable(f"{node} has no metrics endpoint")
    with urllib.request.urlopen(f"http://{listen.host}:{listen.port}/metrics",
                                timeout=5) as reply:
        text = reply.read().decode()
    total = 0.0
    for line in text.splitlines():
        base = line.split("{", 1)[0].split(" ", 1)[0]
        if base in (f"phalanx_{name}", f"phalanx_{name}_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape_prefix(cluster: PhalanxCluster, node: str, prefix: str) -> dict[str, float]:
    """Every counter of `node` whose name starts with ``phalanx_<prefix>`` (by name, the
    ``phalanx_`` and ``_total`` cut off)."""
    listen = load_node_config(cluster.config.node_config_path(node)).metrics_listen
    if listen is None:
        raise PhalanxUnavailable(f"{node} has no metrics endpoint")
    with urllib.request.urlopen(f"http://{listen.host}:{listen.port}/metrics",
                                timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        base = line.split("{", 1)[0].split(" ", 1)[0]
        if base.startswith(f"phalanx_{prefix}") and not line.startswith("#"):
            name = base.removeprefix("phalanx_").removesuffix("_total")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def newest_checkpoint_size(cluster: PhalanxCluster, node: str) -> tuple[int, int]:
    """(index, data bytes) of the newest checkpoint in `node`'s data directory (a v3
    checkpoint file is a manifest: its data lives in packs)."""
    data_dir = load_node_config(cluster.config.node_config_path(node)).data_dir
    best = (0, 0)
    for path in data_dir.rglob("checkpoint-*.ckpt"):
        index = int(path.name.removeprefix("checkpoint-").removesuffix(".ckpt"))
        if index <= best[0]:
            continue
        try:
            raw = path.read_bytes()
        except FileNotFoundError:  # collected meanwhile
            continue
        manifest = decode_manifest(raw) if raw[:8] == MAGIC3 else None
        size = len(raw) if manifest is None or isinstance(manifest, str) else manifest.data_len
        best = (index, size)
    return best


async def load_keys(cluster: PhalanxCluster, keys: Sequence[int], value: bytes,
                    concurrency: int) -> None:
    """Put `keys` (``k%08d``) in transactions of `MAX_TXN_OPS` puts."""
    batches = [keys[i:i + MAX_TXN_OPS] for i in range(0, len(keys), MAX_TXN_OPS)]
    at = [0]
    t0 = time.perf_counter()
    step = max(1, len(batches) // 10)

    async def writer() -> None:
        while at[0] < len(batches):
            batch = batches[at[0]]
            at[0] += 1
            writes = [Put(key=f"k{i:08d}", value=value) for i in batch]
            for _attempt in range(100):
                try:
                    await cluster.client.txn((), writes)
                    break
                except ClientError:
                    await trio.sleep(0.05)
            else:
                raise PhalanxUnavailable("a txn failed 100 times")
            if at[0] % step == 0:
                log(f"  {at[0] * MAX_TXN_OPS:,} of {len(keys):,} keys "
                    f"({time.perf_counter() - t0:,.0f} s)")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(writer)


async def settle(cluster: PhalanxCluster, leader: str, within: float) -> tuple[int, int]:
    """Wait until the leader's newest checkpoint stays the same for 3 s; its (index, size)."""
    deadline = time.monotonic() + within
    seen, since = (0, 0), time.monotonic()
    while True:
        index, size = newest_checkpoint_size(cluster, leader)
        if (index, size) != seen:
            seen, since = (index, size), time.monotonic()
        elif index > 0 and time.monotonic() - since >= 3:
            return index, size
        if time.monotonic() > deadline:
            raise PhalanxUnavailable("the leader's checkpoints did not settle")
        await trio.sleep(0.5)


async def churn(cluster: PhalanxCluster) -> None:
    """Small writes to one key, enough that the leader's log (it keeps 100 entries behind
    its checkpoint) no longer reaches back to the stopped follower."""
    for i in range(150):
        await cluster.client.put("zz-churn", b"%d" % i)


async def churn_past(cluster: PhalanxCluster, leader: str, past: int, within: float) -> None:
    """Writes of 64 KiB to one key, one at a time, until the leader's checkpoint is
    `CHURN_MARGIN` entries past `past` (the stopped follower's last index): its log (100
    entries behind its checkpoint) then no longer reaches the follower, nor do the stale
    AppendEntries its transport queued for the follower while it was down (up to 64
    frames). `churn`'s 150 small writes do not make a checkpoint (under a quarter of the
    byte trigger), so a follower that missed little was caught up from the log."""
    value = make_value(64 << 10)
    deadline = time.monotonic() + within
    i = 0
    while (await status_applied(cluster, leader))[1] < past + CHURN_MARGIN:
        if time.monotonic() > deadline:
            raise PhalanxUnavailable("the leader did not checkpoint past the follower")
        for _ in range(16):
            i += 1
            await cluster.client.put("zz-churn", value[i % 256:] + value[:i % 256])
    log(f"churned {i} writes of 64 KiB: the leader checkpointed past {past + CHURN_MARGIN}")


CHURN_MARGIN = 400


async def load(cluster: PhalanxCluster, state_bytes: int, value_size: int,
               concurrency: int) -> int:
    """Put distinct keys until `state_bytes` of values are stored; returns the key count."""
    keys = max(1, state_bytes // value_size)
    value = make_value(value_size)
    next_key = [0]
    done = [0]
    t0 = time.perf_counter()
    step = max(1, keys // 10)

    async def writer() -> None:
        while next_key[0] < keys:
            i = next_key[0]
            next_key[0] += 1
            for _attempt in range(100):
                try:
                    await cluster.client.put(f"k{i:08d}", value)
                    break
                except ClientError:
                    await trio.sleep(0.05)
            else:
                raise PhalanxUnavailable(f"put k{i} failed 100 times")
            done[0] += 1
            if done[0] % step == 0:
                mb = done[0] * value_size / 2**20
                log(f"  loaded {done[0]:,}/{keys:,} keys ({mb:,.0f} MiB, "
                    f"{mb / (time.perf_counter() - t0):,.1f} MiB/s)")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(writer)
    return keys


async def status_applied(cluster: PhalanxCluster, node: str) -> tuple[int, int]:
    """(applied index, last checkpoint) of `node`, or (-1, -1) if it does not answer."""
    try:
        with trio.move_on_after(2.0):
            reply = await cluster.client.status(node)
            return reply.applied_index, reply.last_checkpoint
    except ClientError:
        pass
    return -1, -1


async def run(args: argparse.Namespace) -> dict[str, float]:
    cluster = PhalanxCluster(protocol="raft", workdir=args.workdir,
                             checkpoint_every_bytes=args.checkpoint_every_mb << 20)
    log(f"cluster in {cluster.directory} ({cluster.runner}); scenario {args.scenario}"
        f"{' (whole checkpoints: PHALANX_PIECE_TRANSFER=off)' if args.full else ''}")
    cluster.start()
    try:
        async with cluster.connected():
            leader = await cluster.wait_ready()
            follower = next(n for n in cluster.procs.node_ids if n != leader)
            if args.scenario == "late":
                log(f"leader {leader}; stopping follower {follower}")
                cluster.procs.kill(follower)
            t0 = time.perf_counter()
            if args.keys:
                await load_keys(cluster, range(args.keys), make_value(args.value_bytes),
                                args.concurrency)
                keys = args.keys
            else:
                keys = await load(cluster, args.state_mb << 20, args.value_kb << 10,
                                  args.concurrency)
            log(f"loaded {keys:,} keys in {time.perf_counter() - t0:.1f} s")
            if args.scenario != "late":
                await churn(cluster)
                target, _ = await status_applied(cluster, leader)
                for _ in range(int(args.timeout * 5)):
                    if (await status_applied(cluster, follower))[0] >= target:
                        break
                    await trio.sleep(0.2)
                log("waiting for the follower's checkpoints to settle")
                await settle(cluster, follower, args.timeout)
                log(f"leader {leader}; stopping follower {follower}")
                past = (await status_applied(cluster, follower))[0]
                cluster.procs.kill(follower)
            if args.scenario == "lag":
                n = max(1, keys * args.lag_percent // 100)
                if args.lag_pattern == "range":
                    touched: Sequence[int] = range(keys // 3, keys // 3 + n)
                else:
                    touched = sorted(random.Random(7).sample(range(keys), n))
                log(f"writing {n:,} keys again ({args.lag_pattern})")
                await load_keys(cluster, touched, make_value(args.value_bytes)[::-1],
                                args.concurrency)
            if args.scenario == "lag":
                await churn_past(cluster, leader, past, args.timeout)
            elif args.scenario != "restart":
                await churn(cluster)
            # The last byte trigger's checkpoint may still be written; wait until the newest
            # checkpoint stays the same for 3 s (the tail after it, under a quarter of a
            # trigger, is not checkpointed when idle: the follower gets it as entries).
            log("waiting for the leader's checkpoints to settle")
            index, size = await settle(cluster, leader, args.timeout)
            log(f"leader checkpoint at {index}: {size / 2**20:,.1f} MiB")
            if args.wipe or args.scenario == "wipe":
                data_dir = load_node_config(cluster.config.node_config_path(follower)).data_dir
                shutil.rmtree(data_dir)
                data_dir.mkdir(parents=True)
                log(f"wiped {data_dir}")
            target, _ = await status_applied(cluster, leader)
            out_before = scrape(cluster, leader, "peer_bytes_out")
            peers = [n for n in cluster.procs.node_ids if n != follower]
            peers_cpu = sum(scrape(cluster, n, "process_cpu_seconds") for n in peers)
            log(f"restarting {follower}; catching up to index {target}")
            t1 = time.perf_counter()
            cluster.procs.start([follower])
            last_log = t1
            up = 0.0
            while True:
                got, _ = await status_applied(cluster, follower)
                now = time.perf_counter()
                if got >= 0 and not up:
                    up = now - t1
                    log(f"  {follower} answers after {up:.2f} s (process start, restore)")
                if got >= target:
                    break
                if now - t1 > args.timeout:
                    raise PhalanxUnavailable(f"{follower} not caught up after {args.timeout} s "
                                             f"(applied {got} of {target})")
                if now - last_log >= 5:
                    try:  # a follower still starting has no metrics endpoint yet
                        rx = scrape(cluster, follower, "peer_bytes_in")
                        log(f"  {now - t1:,.0f} s: {follower} applied {got}, received "
                            f"{rx / 2**20:,.1f} MiB")
                    except OSError:
                        log(f"  {now - t1:,.0f} s: {follower} not answering yet")
                    last_log = now
                await trio.sleep(0.05)
            took = time.perf_counter() - t1
            # What it installed (the leader may have checkpointed again since it settled).
            size = max(size, newest_checkpoint_size(cluster, follower)[1])
            received = scrape(cluster, follower, "peer_bytes_in")
            sent = scrape(cluster, leader, "peer_bytes_out") - out_before
            fetched = scrape(cluster, follower, "piece_fetched_bytes")
            reused = scrape(cluster, follower, "piece_reused_pieces")
            resolves = scrape(cluster, follower, "piece_resolves")
            cpu = scrape(cluster, follower, "process_cpu_seconds")
            dropped = scrape_prefix(cluster, follower, "piece_dropped_")
            peers_cpu = sum(scrape(cluster, n, "process_cpu_seconds") for n in peers) - peers_cpu
            served = sum(scrape(cluster, n, "piece_served_bytes") for n in peers)
            from_memory = sum(scrape(cluster, n, "piece_served_from_memory_bytes")
                              for n in peers)
    finally:
        cluster.stop()
    return {"keys": float(keys), "checkpoint_bytes": float(size), "catch_up_s": took,
            "start_s": up, "follower_bytes_in": received, "leader_bytes_out": sent,
            "pieces_fetched_bytes": fetched, "pieces_reused": reused,
            "manifests": resolves, "follower_cpu_s": cpu, "peers_cpu_s": peers_cpu,
            "peers_served_bytes": served,
            "peers_served_from_memory_bytes": from_memory,
            **{f"follower_{k}": v for k, v in dropped.items()},
            "ratio": received / size, "mib_per_s": size / 2**20 / took}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-mb", type=int, default=100,
                   help="KV state to load, MiB (the checkpoint is about this size; 1024 for "
                        "the 1 GB run)")
    p.add_argument("--value-kb", type=int, default=64, help="value size per key, KiB")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent writers")
    p.add_argument("--checkpoint-every-mb", type=int, default=16,
                   help="[checkpoint] every_bytes of the nodes, MiB")
    p.add_argument("--wipe", action="store_true",
                   help="restart the follower with an empty data directory")
    p.add_argument("--scenario", choices=("late", "restart", "wipe", "lag"), default="late",
                   help="what happened to the follower (module docstring)")
    p.add_argument("--keys", type=int, default=0,
                   help="load this many keys in transactions instead of --state-mb")
    p.add_argument("--value-bytes", type=int, default=100, help="value size with --keys")
    p.add_argument("--lag-percent", type=int, default=1,
                   help="lag: percent of the keys written while the follower is down")
    p.add_argument("--lag-pattern", choices=("random", "range"), default="random",
                   help="lag: random keys, or one contiguous range of keys")
    p.add_argument("--full", action="store_true",
                   help="whole-checkpoint InstallSnapshot (PHALANX_PIECE_TRANSFER=off)")
    p.add_argument("--piece-memory-mb", type=int, default=None,
                   help="the nodes' PHALANX_PIECE_MEMORY_MB (0: serve pieces from disk only)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    p.add_argument("--workdir", default=None, help="where to put the cluster (default: tmp)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args()
    if args.full:
        os.environ[DISABLE_ENV] = "off"  # inherited by the node processes
    if args.piece_memory_mb is not None:
        os.environ[PIECE_MEMORY_ENV] = str(args.piece_memory_mb)
    try:
        r = trio.run(run, args)
    except PhalanxUnavailable as e:
        sys.exit(f"snapshot_catchup: {e}")
    if args.json:
        print(json.dumps(r))
        return
    mib = r["checkpoint_bytes"] / 2**20
    print(f"checkpoint {mib:,.1f} MiB: follower caught up in {r['catch_up_s']:.2f} s "
          f"({r['mib_per_s']:,.0f} MiB/s); it received {r['follower_bytes_in'] / 2**20:,.1f} MiB "
          f"({r['ratio']:.2f}x the checkpoint); the leader sent "
          f"{r['leader_bytes_out'] / 2**20:,.1f} MiB to both followers meanwhile; the "
          f"follower process answered {r['start_s']:.2f} s after its start; pieces fetched "
          f"{r['pieces_fetched_bytes'] / 2**20:,.1f} MiB, {r['pieces_reused']:.0f} own reused, "
          f"{r['manifests']:.0f} manifest(s); the peers served "
          f"{r['peers_served_bytes'] / 2**20:,.1f} MiB of pieces, "
          f"{r['peers_served_from_memory_bytes'] / 2**20:,.1f} MiB from memory; follower "
          f"process CPU {r['follower_cpu_s']:.2f} s, the peers' {r['peers_cpu_s']:.2f} s during "
          "the catch-up")


if __name__ == "__main__":
    main()

"""Member catch-up and snapshot cost, phalanx's Raft beside etcd 3.4, in one run.

Both systems, one after the other, same scenario: a 3-member cluster on loopback (fsync on),
one follower SIGKILLed, `--state-mb` MiB of KV state written as `--value-kb` KiB values by 16
concurrent writers, then the follower restarted; timed until it has applied everything the
leader had, with the bytes it received from its peers (phalanx: `peer_bytes_in`; etcd:
`etcd_network_peer_received_bytes_total`). The phalanx half is `bench/snapshot_catchup.py`'s
`run` (its `[checkpoint] every_bytes` 16 MiB). etcd runs with `--snapshot-count
--etcd-snapshot-count` (default 1000 entries) so that, past the 5,000 entries an etcd leader
keeps after a snapshot, the follower needs a snapshot as the phalanx one does. etcd's snapshot
cost: its leader's raft snapshot saves (`etcd_debugging_snap_save_total_duration_seconds`:
count and total) and the time of one `etcdctl snapshot save` of the whole database (a full
copy, what phalanx's pre-v3 checkpoints cost). phalanx's checkpoint cost, in process on the
same state (the KV app over the node's file store, fsync on): the first checkpoint (every
shard new) and one after 1% of the keys changed, consecutive ones (incremental: only the
touched shard; shards are 1024 keys, so 8 KiB values make 8 MiB shards and spread changes
would touch all of them),
wall time and bytes the store wrote (`bench/checkpoint_incremental.py` has the 1M-key
figures).

Usage: cd bench && ../.venv/bin/python catchup_vs_etcd.py [--state-mb 64] [--value-kb 8]
Needs `etcd` and `etcdctl` (apt-get install etcd-server etcd-client); without them it says so
and runs only the phalanx half. Every process is stopped by the pid it was started with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

import snapshot_catchup
import trio
from _etcd import EtcdCluster, EtcdError, HttpConnection, etcd_binary, etcd_version
from _loadgen import LOOPBACK, make_value
from _phalanx import PhalanxUnavailable

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.storage.files import open_file_storage
from phalanx.storage.interface import SyncPolicy

log = snapshot_catchup.log
CONFIG = Configuration(voters=(NodeId("n1"),))


def dir_bytes(path: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def our_checkpoint_cost(state_mb: int, value_kb: int) -> dict[str, float]:
    """Seconds and bytes of a full and of a 1%-changed checkpoint of the KV app."""
    root = tempfile.mkdtemp(prefix="phalanx-ckpt-cost-")
    try:
        storage = open_file_storage(root, sync=SyncPolicy.GROUP)
        replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints,
                          policy=CheckpointPolicy(every_entries=0, every_bytes=0),
                          config=CONFIG)
        keys = (state_mb << 20) // (value_kb << 10)
        value = make_value(value_kb << 10)
        index = 0

        def put(key: int, data: bytes) -> None:
            nonlocal index
            index += 1
            command = kv_wire.encode_command(Put(key=f"k{key:08d}", value=data))
            replica.apply(Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(
                ClientRequest(client_id="loader", request_no=index, command=command),)))

        for i in range(keys):
            put(i, value)
        out: dict[str, float] = {}
        for label in ("full", "one_percent"):
            if label == "one_percent":
                changed = make_value((value_kb << 10) - 1) + b"!"
                for i in range(keys // 100):  # consecutive keys: one shard of 1024 keys
                    put(i, changed)
            before = dir_bytes(root)
            t0 = time.perf_counter()
            replica.checkpoint_now()  # the inline writer: durable on return
            out[f"{label}_s"] = time.perf_counter() - t0
            replica.poll()
            out[f"{label}_bytes"] = float(max(0, dir_bytes(root) - before))
        storage.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def metric(port: int, name: str) -> float:
    """Sum of a metric's samples on the etcd member with client `port` (0 if absent)."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)


async def status(port: int) -> dict[str, object]:
    conn = await HttpConnection.open(LOOPBACK, port)
    try:
        reply: dict[str, object] = json.loads(await conn.post_json("/v3/maintenance/status",
                                                                    b"{}"))
        return reply
    finally:
        await conn.aclose()


async def applied(port: int) -> int:
    """The member's raft applied index (-1 while it does not answer)."""
    try:
        with trio.move_on_after(2):
            reply = await status(port)
            return int(str(reply.get("raftAppliedIndex", reply.get("raftIndex", -1))))
    except (OSError, EtcdError, ValueError, trio.BrokenResourceError):
        pass
    return -1


async def etcd_run(args: argparse.Namespace, binary: str) -> dict[str, float]:
    cluster = EtcdCluster(binary, extra_args=("--snapshot-count",
                                              str(args.etcd_snapshot_count)))
    cluster.start()
    try:
        leader = await cluster.wait_ready()
        follower = next(m for m in cluster.members if m.name != leader.name)
        log(f"etcd: leader {leader.name}; stopping follower {follower.name}")
        cluster.kill(follower.name)
        keys = (args.state_mb << 20) // (args.value_kb << 10)
        value = make_value(args.value_kb << 10)
        next_key = [0]
        t0 = time.perf_counter()

        async def writer() -> None:
            w = await cluster.open_writer(0)
            try:
                while next_key[0] < keys:
                    i = next_key[0]
                    next_key[0] += 1
                    await w.put(f"k{i:08d}".encode(), value)
            finally:
                await w.aclose()

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(writer)
        log(f"etcd: loaded {keys:,} keys in {time.perf_counter() - t0:.1f} s")
        lead = await status(leader.client_port)
        db = float(str(lead.get("dbSize", 0)))
        target = int(str(lead.get("raftAppliedIndex", lead.get("raftIndex", 0))))
        saves = metric(leader.client_port, "etcd_debugging_snap_save_total_duration_seconds_count")
        save_s = metric(leader.client_port, "etcd_debugging_snap_save_total_duration_seconds_sum")
        snap_dir = tempfile.mkdtemp(prefix="etcd-snap-")
        t_save = time.perf_counter()
        await trio.run_process(["etcdctl", f"--endpoints=http://{LOOPBACK}:{leader.client_port}",
                                "snapshot", "save", f"{snap_dir}/snap.db"],
                               capture_stdout=True, capture_stderr=True)
        full_save = time.perf_counter() - t_save
        shutil.rmtree(snap_dir, ignore_errors=True)
        log(f"etcd: db {db / 2**20:.1f} MiB; restarting {follower.name} to index {target}")
        t1 = time.perf_counter()
        cluster.restart(follower.name)
        while True:
            got = await applied(follower.client_port)
            if got >= target:
                break
            if time.perf_counter() - t1 > args.timeout:
                raise EtcdError(f"etcd follower not caught up after {args.timeout} s")
            await trio.sleep(0.05)
        took = time.perf_counter() - t1
        received = metric(follower.client_port, "etcd_network_peer_received_bytes_total")
        snaps = metric(follower.client_port, "etcd_network_snapshot_receive_success")
    finally:
        cluster.stop()
    return {"db_bytes": db, "catch_up_s": took, "follower_bytes_in": received,
            "snapshots_received": snaps, "leader_snap_saves": saves,
            "leader_snap_save_s": save_s, "full_snapshot_save_s": full_save}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mb", type=int, default=64, help="KV state to load, MiB")
    p.add_argument("--value-kb", type=int, default=8, help="value size, KiB")
    p.add_argument("--etcd-snapshot-count", type=int, default=1000,
                   help="etcd --snapshot-count (entries between its snapshots)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    args = p.parse_args()
    ours_args = argparse.Namespace(state_mb=args.state_mb, value_kb=args.value_kb,
                                   concurrency=16, checkpoint_every_mb=16, wipe=False,
                                   timeout=args.timeout, workdir=None, json=False)
    try:
        ours = trio.run(snapshot_catchup.run, ours_args)
    except PhalanxUnavailable as e:
        sys.exit(f"catchup_vs_etcd: phalanx: {e}")
    cost = our_checkpoint_cost(args.state_mb, args.value_kb)
    binary = etcd_binary()
    theirs: dict[str, float] | None = None
    if binary is None or shutil.which("etcdctl") is None:
        log("etcd/etcdctl not installed (apt-get install etcd-server etcd-client): phalanx only")
    else:
        log(etcd_version(binary))
        theirs = trio.run(etcd_run, args, binary)
    state = args.state_mb << 20
    print(f"# {args.state_mb} MiB of state in {args.value_kb} KiB values; follower "
          f"SIGKILLed before the load, restarted after it")
    print("| system | state on disk MiB | catch-up s | follower received MiB | received / state "
          "| snapshot cost |")
    print("|---|---|---|---|---|---|")
    print(f"| phalanx raft | {state / 2**20:.0f} (KV) | {ours['catch_up_s']:.2f} | "
          f"{ours['follower_bytes_in'] / 2**20:.1f} | {ours['follower_bytes_in'] / state:.2f} "
          f"| first checkpoint {cost['full_s']:.2f} s, {cost['full_bytes'] / 2**20:.1f} MiB "
          f"written; after 1% of the keys changed {cost['one_percent_s']:.2f} s, "
          f"{cost['one_percent_bytes'] / 2**20:.1f} MiB |")
    if theirs is not None:
        print(f"| etcd 3.4 | {theirs['db_bytes'] / 2**20:.0f} (bbolt db) | "
              f"{theirs['catch_up_s']:.2f} | {theirs['follower_bytes_in'] / 2**20:.1f} | "
              f"{theirs['follower_bytes_in'] / state:.2f} | {theirs['leader_snap_saves']:.0f} "
              f"raft snapshot saves, {theirs['leader_snap_save_s'] * 1e3:.0f} ms in all; "
              f"full `snapshot save` {theirs['full_snapshot_save_s']:.2f} s; follower "
              f"received {theirs['snapshots_received']:.0f} snapshot(s) |")


if __name__ == "__main__":
    main()

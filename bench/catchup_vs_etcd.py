"""Member catch-up and snapshot cost, phalanx's Raft beside etcd 3.4, in one run.

Both systems, one after the other, per scenario (`--scenarios`, all three by default): a
3-member cluster on loopback (fsync on), `--state-mb` MiB of KV state written as `--value-kb`
KiB values by 16 concurrent writers, and one follower SIGKILLed: ``late``, before the load;
``wipe``, after it, its data directory then removed (etcd: `member remove` + `member add`,
restarted with `--initial-cluster-state existing`; phalanx: restarted empty, it rejoins in
recovery mode and fetches the checkpoint's pieces); ``lag``, after it, then `--lag-percent`
of the keys (one range) written again and both leaders' logs moved past the follower (so
each needs a snapshot). Then the follower restarted; timed until it has applied everything
the leader had, with the bytes it received from its peers (phalanx: `peer_bytes_in`; etcd:
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
       [--scenarios late,wipe,lag] [--lag-percent 1]
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


async def etcdctl(leader_port: int, *args: str, tries: int = 1) -> bytes:
    """`etcdctl` against the member with client `leader_port`; its output. A failure is
    tried again after a second up to `tries` times (etcd refuses a member add for a while
    after a remove: "unhealthy cluster"), then raises `EtcdError` with its stderr."""
    for attempt in range(tries):
        result = await trio.run_process(
            ["etcdctl", f"--endpoints=http://{LOOPBACK}:{leader_port}", *args],
            capture_stdout=True, capture_stderr=True, check=False)
        if result.returncode == 0:
            return bytes(result.stdout)
        if attempt + 1 < tries:
            await trio.sleep(1)
    raise EtcdError(f"etcdctl {' '.join(args)}: {result.stderr.decode(errors='replace')}")


async def etcd_put_keys(cluster: EtcdCluster, keys: range, value: bytes) -> None:
    """Put `keys` (``k%08d``), 16 concurrent writers."""
    at = [keys.start]

    async def writer() -> None:
        w = await cluster.open_writer(0)
        try:
            while at[0] < keys.stop:
                i = at[0]
                at[0] += 1
                await w.put(f"k{i:08d}".encode(), value)
        finally:
            await w.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(writer)


async def etcd_run(args: argparse.Namespace, binary: str, scenario: str) -> dict[str, float]:
    """One etcd run of `scenario` (``late``, ``wipe`` or ``lag``: `ours`)."""
    cluster = EtcdCluster(binary, extra_args=("--snapshot-count",
                                              str(args.etcd_snapshot_count)))
    cluster.start()
    try:
        leader = await cluster.wait_ready()
        follower = next(m for m in cluster.members if m.name != leader.name)
        if scenario == "late":
            log(f"etcd: leader {leader.name}; stopping follower {follower.name}")
            cluster.kill(follower.name)
        keys = (args.state_mb << 20) // (args.value_kb << 10)
        value = make_value(args.value_kb << 10)
        t0 = time.perf_counter()
        await etcd_put_keys(cluster, range(keys), value)
        log(f"etcd: loaded {keys:,} keys in {time.perf_counter() - t0:.1f} s")
        if scenario != "late":
            target = int(str((await status(leader.client_port)).get("raftAppliedIndex", 0)))
            deadline = time.perf_counter() + args.timeout
            while await applied(follower.client_port) < target:
                if time.perf_counter() > deadline:
                    raise EtcdError("etcd follower did not apply the load")
                await trio.sleep(0.1)
            log(f"etcd: stopping follower {follower.name}")
            cluster.kill(follower.name)
        membership_s = 0.0
        if scenario == "lag":
            n = max(1, keys * args.lag_percent // 100)
            log(f"etcd: writing {n:,} keys again (one range)")
            await etcd_put_keys(cluster, range(keys // 3, keys // 3 + n), value[::-1])
            # As phalanx's run churns until its leader's log no longer reaches back: small
            # writes past the entries an etcd leader keeps after a snapshot (5,000 plus
            # --snapshot-count), so its follower needs a snapshot too.
            churn = 5000 + 2 * args.etcd_snapshot_count
            log(f"etcd: {churn:,} small writes (its leader's log no longer reaches back)")
            w = await cluster.open_writer(0)
            try:
                for i in range(churn):
                    await w.put(b"zz-churn", b"%d" % i)
            finally:
                await w.aclose()
        if scenario == "wipe":
            shutil.rmtree(cluster.data_dir(follower.name))
            t_m = time.perf_counter()
            listed = json.loads(await etcdctl(leader.client_port, "member", "list", "-w", "json"))
            member_id = next(m["ID"] for m in listed["members"] if m["name"] == follower.name)
            await etcdctl(leader.client_port, "member", "remove", f"{member_id:x}")
            await etcdctl(leader.client_port, "member", "add", follower.name,
                          f"--peer-urls=http://{LOOPBACK}:{follower.peer_port}", tries=30)
            membership_s = time.perf_counter() - t_m
            log(f"etcd: wiped {follower.name}'s data dir; member remove + add took "
                f"{membership_s:.2f} s")
        lead = await status(leader.client_port)
        db = float(str(lead.get("dbSize", 0)))
        target = int(str(lead.get("raftAppliedIndex", lead.get("raftIndex", 0))))
        saves = metric(leader.client_port, "etcd_debugging_snap_save_total_duration_seconds_count")
        save_s = metric(leader.client_port, "etcd_debugging_snap_save_total_duration_seconds_sum")
        full_save = 0.0
        if scenario == "late":
            snap_dir = tempfile.mkdtemp(prefix="etcd-snap-")
            t_save = time.perf_counter()
            await etcdctl(leader.client_port, "snapshot", "save", f"{snap_dir}/snap.db")
            full_save = time.perf_counter() - t_save
            shutil.rmtree(snap_dir, ignore_errors=True)
        log(f"etcd: db {db / 2**20:.1f} MiB; restarting {follower.name} to index {target}")
        t1 = time.perf_counter()
        cluster.restart(follower.name, existing=scenario == "wipe")
        up = 0.0
        while True:
            got = await applied(follower.client_port)
            if got >= 0 and not up:
                up = time.perf_counter() - t1
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
    return {"db_bytes": db, "catch_up_s": took, "start_s": up, "follower_bytes_in": received,
            "snapshots_received": snaps, "leader_snap_saves": saves,
            "leader_snap_save_s": save_s, "full_snapshot_save_s": full_save,
            "membership_s": membership_s}


def ours(args: argparse.Namespace, scenario: str) -> dict[str, float]:
    """One phalanx run of `scenario` (`bench/snapshot_catchup.py`'s): ``late`` (the follower
    is down during the whole load), ``wipe`` (its data directory is removed after the load)
    or ``lag`` (it misses `--lag-percent` of the keys, one range, written again)."""
    keys = (args.state_mb << 20) // (args.value_kb << 10)
    run_args = argparse.Namespace(
        state_mb=args.state_mb, value_kb=args.value_kb, concurrency=16, checkpoint_every_mb=16,
        wipe=False, timeout=args.timeout, workdir=None, json=False, scenario=scenario,
        full=False, keys=0 if scenario == "late" else keys, value_bytes=args.value_kb << 10,
        lag_percent=args.lag_percent, lag_pattern="range")
    return trio.run(snapshot_catchup.run, run_args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mb", type=int, default=64, help="KV state to load, MiB")
    p.add_argument("--value-kb", type=int, default=8, help="value size, KiB")
    p.add_argument("--etcd-snapshot-count", type=int, default=1000,
                   help="etcd --snapshot-count (entries between its snapshots)")
    p.add_argument("--lag-percent", type=int, default=1,
                   help="lag: percent of the keys written while the follower is down")
    p.add_argument("--scenarios", default="late,wipe,lag",
                   help="comma-separated: late, wipe, lag (module docstring)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    args = p.parse_args()
    scenarios = [x.strip() for x in args.scenarios.split(",") if x.strip()]
    unknown = set(scenarios) - {"late", "wipe", "lag"}
    if unknown:
        sys.exit(f"catchup_vs_etcd: unknown scenario(s) {', '.join(sorted(unknown))}")
    binary = etcd_binary()
    if binary is None or shutil.which("etcdctl") is None:
        log("etcd/etcdctl not installed (apt-get install etcd-server etcd-client): phalanx only")
        binary = None
    else:
        log(etcd_version(binary))
    results: dict[str, tuple[dict[str, float], dict[str, float] | None]] = {}
    for scenario in scenarios:  # interleaved: ours, then etcd, per scenario
        try:
            mine = ours(args, scenario)
        except PhalanxUnavailable as e:
            sys.exit(f"catchup_vs_etcd: phalanx: {e}")
        theirs = trio.run(etcd_run, args, binary, scenario) if binary is not None else None
        results[scenario] = (mine, theirs)
    cost = our_checkpoint_cost(args.state_mb, args.value_kb) if "late" in scenarios else None
    state = args.state_mb << 20
    print(f"# {args.state_mb} MiB of state in {args.value_kb} KiB values; `uptime` load "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("| scenario | system | serves after s | answers after s | follower received MiB "
          "| received / state | notes |")
    print("|---|---|---|---|---|---|---|")
    label = {"late": "down during the whole load", "wipe": "data directory wiped",
             "lag": f"missed {args.lag_percent}% of the writes (one key range)"}
    for scenario, (mine, theirs) in results.items():
        note = (f"pieces fetched {mine['pieces_fetched_bytes'] / 2**20:.1f} MiB, "
                f"{mine['pieces_reused']:.0f} own reused; peers served "
                f"{mine['peers_served_from_memory_bytes'] / 2**20:.1f} MiB from memory; "
                f"follower CPU {mine['follower_cpu_s']:.1f} s")
        if scenario == "late" and cost is not None:
            note += (f"; first checkpoint {cost['full_s']:.2f} s, "
                     f"{cost['full_bytes'] / 2**20:.1f} MiB written; after 1% of the keys "
                     f"changed {cost['one_percent_s']:.2f} s, "
                     f"{cost['one_percent_bytes'] / 2**20:.1f} MiB")
        print(f"| {label[scenario]} | phalanx raft | {mine['catch_up_s']:.2f} | "
              f"{mine['start_s']:.2f} | {mine['follower_bytes_in'] / 2**20:.1f} | "
              f"{mine['follower_bytes_in'] / state:.2f} | {note} |")
        if theirs is None:
            continue
        note = (f"db {theirs['db_bytes'] / 2**20:.0f} MiB; {theirs['snapshots_received']:.0f} "
                f"snapshot(s) received")
        if scenario == "wipe":
            note += f"; member remove + add {theirs['membership_s']:.2f} s before the start"
        if scenario == "late":
            note += (f"; {theirs['leader_snap_saves']:.0f} raft snapshot saves, "
                     f"{theirs['leader_snap_save_s'] * 1e3:.0f} ms in all; full `snapshot "
                     f"save` {theirs['full_snapshot_save_s']:.2f} s")
        print(f"| {label[scenario]} | etcd 3.4 | {theirs['catch_up_s']:.2f} | "
              f"{theirs['start_s']:.2f} | {theirs['follower_bytes_in'] / 2**20:.1f} | "
              f"{theirs['follower_bytes_in'] / state:.2f} | {note} |")


if __name__ == "__main__":
    main()

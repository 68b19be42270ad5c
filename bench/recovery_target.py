"""Recovery-time objective benchmark: checkpoint interval against recovery time against
throughput cost, and the target held under a write burst.

Run: `.venv/bin/python bench/recovery_target.py [--keys 1000000] [--target 2]` (~1-2 min).
Real files in a temp dir; the replica layer in process with the node runtime's threaded
checkpoint writer and GC pacer.

For each policy (no checkpoints, fixed intervals, `[checkpoint] recovery_target`): load a
`--keys`-key KV state, checkpoint it and restart from it (so the target has measured the
load rate, as on every start of a node after its first), then apply a write burst of
`--burst-mb` MB of commands (puts of `--value-bytes` values to keys spread over the key
space: the state grows by the burst) back to back, appending each to the WAL in batches of
64 (`--fsync off` by default, so the figure is the checkpoints' CPU and GIL cost, not the
disk's). The burst then continues to just before the next checkpoint would start, the
checkpoint in flight is let finish, and the process "crashes": a fresh replica on the same
directory loads the newest checkpoint and replays the WAL after it, timed (load and replay
apart). That is the worst point for the policy with its last checkpoint durable; a crash
while a checkpoint is still being written replays what arrived during that write too, which
the target's rule budgets for (`phalanx.apps.recovery_target`: `written_bytes`): the `worst`
column adds the bytes applied during the run's last checkpoint write at the restart's replay
rate.

Columns: interval (MiB of commands; for the target, the one it chose at the end), checkpoints
written during the burst, burst throughput (applies/s) and its cost against no checkpoints,
the restart's load and replay seconds, and whether load + replay (and the worst case) stayed
under the target. Not measured here: process start, the WAL read into a Raft core and its
re-emission of committed entries (a node restart pays those too; docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from phalanx.apps import kv_wire
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.recovery_target import RecoveryTarget
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    NodeId,
)
from phalanx.net import wire
from phalanx.storage.files import Storage, open_file_storage
from phalanx.storage.interface import SyncPolicy
from storage import kv_state_bytes  # bench/storage.py

CONFIG = Configuration(voters=(NodeId("n1"),))
BATCH = 64
MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    name: str
    interval_bytes: int | None  # None: no checkpoints
    during_write: int  # command bytes applied during the last checkpoint write of the burst
    checkpoints: int
    applies_per_s: float
    load_s: float
    replay_s: float
    replayed_bytes: int
    replay_rate: float  # command bytes replayed per second at the restart
    checkpoint_mb: float
    chosen: str = ""  # the target's estimate at the end of the burst


def put(index: int, keys: int, value: bytes, rng: random.Random) -> Entry:
    request = ClientRequest(
        client_id=f"client-{index % 64}", request_no=index,
        command=kv_wire.encode_command(Put(key=f"key{rng.randrange(keys * 2):08d}",
                                           value=value)))
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(request,))


def open_replica(path: str, sync: SyncPolicy, policy: CheckpointPolicy,
                 recovery: RecoveryTarget | None) -> tuple[Replica, Storage]:
    storage = open_file_storage(path, sync=sync)
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                      decode_entry=wire.decode_entry,
                      writer=ThreadedCheckpointWriter(storage.checkpoints), policy=policy,
                      config=CONFIG, gc_pacer=GcPacer(), recovery=recovery)
    return replica, storage


def run(name: str, root: str, args: argparse.Namespace, *, every_bytes: int | None,
        target: float | None) -> Run:
    path = os.path.join(root, name.replace(" ", "_"))
    sync = SyncPolicy.GROUP if args.fsync == "group" else SyncPolicy.OFF
    storage = open_file_storage(path, sync=sync)
    recovery = (RecoveryTarget(target, clock=time.perf_counter) if target is not None
                else None)
    policy = CheckpointPolicy(every_entries=0, every_bytes=every_bytes or 0)
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                      decode_entry=wire.decode_entry,
                      writer=ThreadedCheckpointWriter(storage.checkpoints), policy=policy,
                      config=CONFIG, gc_pacer=GcPacer(), recovery=recovery)
    machine = replica.machine
    assert isinstance(machine, KvStateMachine)
    machine.restore(kv_state_bytes(args.keys))
    rng = random.Random(7)
    value = b"v" * args.value_bytes
    first = put(1, args.keys, value, rng)
    storage.wal.append(1, wire.encode(first))
    replica.apply(first)
    replica.checkpoint_now()
    while replica.status().checkpoint_in_flight is not None:  # the base checkpoint
        time.sleep(0.01)
        replica.poll()
    # A node that restarted once: its load rate is measured (a first run has only the
    # default's guess, DEFAULT_LOAD_RATE).
    replica.close()
    storage.close()
    del replica, machine
    gc.collect()
    gc.unfreeze()
    replica, opened = open_replica(path, sync, policy, recovery)
    storage = opened
    replica.restore_latest()
    machine = replica.machine
    index, burst, since = 1, args.burst_mb * 1_000_000, 0
    applied_bytes, base_written, started_at = 0, replica.status().checkpoints_written, 0
    done, during_write = base_written, 0  # bytes applied during the last checkpoint's write
    batch: list[tuple[int, bytes]] = []
    start = time.perf_counter()
    while True:
        index += 1
        entry = put(index, args.keys, value, rng)
        size = len(entry.requests[0].command)
        if applied_bytes >= burst:  # past the burst: stop just before the next trigger
            interval = recovery.interval_bytes if recovery is not None else every_bytes
            if interval is None or since + size >= interval:
                break
        batch.append((index, wire.encode(entry)))
        if len(batch) == BATCH:
            storage.wal.append_many(batch)
            storage.wal.sync()
            batch = []
        replica.apply(entry)
        applied_bytes += size
        since += size
        status = replica.status()
        if status.checkpoints_written != done:
            done, during_write = status.checkpoints_written, since
        if status.checkpoint_in_flight is not None and status.checkpoint_in_flight != started_at:
            started_at, since = status.checkpoint_in_flight, 0
        replica.poll()
    elapsed = time.perf_counter() - start
    if batch:
        storage.wal.append_many(batch)
    storage.wal.sync()
    applies = index - 2
    chosen = ""
    if recovery is not None:
        est = recovery.estimate()
        chosen = (f"load {est.load_rate / 1e6:.0f} MB/s, replay {est.replay_rate / 1e6:.1f} "
                  f"MB/s, ckpt {est.checkpoint_bytes / MIB:.0f} MiB -> interval "
                  f"{est.interval_bytes / MIB:.1f} MiB, worst {est.worst_seconds:.2f} s"
                  f"{'' if est.feasible else ' (INFEASIBLE)'}")
    replica.close()  # the checkpoint in flight completes: the point before the next one
    written = replica.status().checkpoints_written - base_written
    interval_bytes = (recovery.interval_bytes if recovery is not None else every_bytes)
    storage.close()
    del replica, machine
    gc.collect()
    gc.unfreeze()

    clock_total = time.perf_counter()
    probe = RecoveryTarget(1.0, clock=time.perf_counter)  # records the load's time
    again, storage2 = open_replica(path, sync, CheckpointPolicy(every_entries=0, every_bytes=0),
                                   probe)
    report = again.restore_latest()
    total = time.perf_counter() - clock_total
    est = probe.estimate()
    load = est.checkpoint_bytes / est.load_rate if probe.load_samples else 0.0
    replayed_bytes = report.replayed * size
    replay = max(0.0, total - load)
    again.close()
    storage2.close()
    del again
    gc.collect()
    gc.unfreeze()
    shutil.rmtree(path, ignore_errors=True)
    return Run(name=name, interval_bytes=interval_bytes, during_write=during_write,
               checkpoints=written,
               applies_per_s=applies / elapsed, load_s=load, replay_s=replay,
               replayed_bytes=replayed_bytes,
               replay_rate=replayed_bytes / replay if replay > 0 else 0.0,
               checkpoint_mb=est.checkpoint_bytes / MIB, chosen=chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys loaded before the burst")
    parser.add_argument("--target", type=float, default=2.0,
                        help="recovery_target in seconds (default 2)")
    parser.add_argument("--burst-mb", type=int, default=24,
                        help="MB of put commands in the burst (default 24)")
    parser.add_argument("--value-bytes", type=int, default=256, help="value size (default 256)")
    parser.add_argument("--intervals", default="4,16",
                        help="fixed intervals to compare, MiB (default 4,16)")
    parser.add_argument("--fsync", choices=("off", "group"), default="off",
                        help="WAL fsync per batch of 64 (group) or none (default off)")
    args = parser.parse_args(argv)
    fixed = [int(x) for x in args.intervals.split(",") if x]
    root = tempfile.mkdtemp(prefix="rto-bench-")
    runs: list[Run] = []
    try:
        runs.append(run("none", root, args, every_bytes=None, target=None))
        for mib in fixed:
            runs.append(run(f"every {mib} MiB", root, args, every_bytes=mib * MIB, target=None))
        runs.append(run(f"target {args.target:g} s", root, args, every_bytes=None,
                        target=args.target))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = runs[0].applies_per_s
    print(f"# {args.keys:,} keys, burst {args.burst_mb} MB of {args.value_bytes}-byte puts, "
          f"fsync {args.fsync}, target {args.target:g} s")
    print("| policy | interval MiB | ckpts | applies/s | cost | restart load s | replay s "
          "| load+replay s | worst s | held |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        total = r.load_s + r.replay_s
        interval = "-" if r.interval_bytes is None else f"{r.interval_bytes / MIB:.1f}"
        # a crash while the next checkpoint is written replays what arrives meanwhile too
        rate = r.replay_rate or max((x.replay_rate for x in runs), default=0.0)
        worst = total + r.during_write / rate if rate else total
        held = "yes" if worst <= args.target else ("restart only" if total <= args.target
                                                   else "no")
        print(f"| {r.name} | {interval} | {r.checkpoints} | {r.applies_per_s:,.0f} | "
              f"{(1 - r.applies_per_s / base) * 100:+.1f}% | {r.load_s:.2f} | "
              f"{r.replay_s:.2f} | {total:.2f} | {worst:.2f} | {held} |")
    for r in runs:
        if r.chosen:
            print(f"{r.name}: {r.chosen}")
        print(f"{r.name}: restart replayed {r.replayed_bytes / MIB:.1f} MiB at "
              f"{r.replay_rate / 1e6:.1f} MB/s, loaded a {r.checkpoint_mb:.0f} MiB checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())

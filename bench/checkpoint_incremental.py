"""Checkpoint cost against the keys changed since the previous checkpoint, old layout (v2: one
file, the whole state every time) against the content-addressed one (v3: only the shards that
changed, plus a small manifest).

Run: `.venv/bin/python bench/checkpoint_incremental.py [--keys 1000000] [--changed 1,1000,100000]
[--clustered] [--rounds 5] [--layouts 2,3]` (~4-10 min at 1M keys, more on a loaded machine;
real files in a temp dir, fsync on).

For each layout, a `--keys` KV store is loaded and checkpointed once (the base); then for each
count N of `--changed`: N keys spread over the key space are rewritten and one checkpoint is
taken with nothing else running ("idle"), then N more and one checkpoint while applies run back
to back ("busy": its duration and the worst single apply meanwhile). Printed per row:
- time: the idle checkpoint's wall time, split into the app's serialisation steps (the
  KV fold, packing and hashing the shards a write touched) and the store's part (looking up
  pieces, writing the new ones, fsyncs, the manifest, collection); and the writer thread's
  CPU time for each part (`time.thread_time`: what load on the machine does not inflate;
  the store's wall time minus its CPU is mostly fsync, whose latency is printed too);
- written: bytes the save wrote (v2: the file; v3: new pieces, groups and manifest), and of
  those, `copied`: pieces moved out of packs the previous checkpoints left mostly unused
  (compaction, paid for by earlier rewrites: a round after a busy one copies its leftovers);
- on disk: the data directory's size after the idle checkpoint (all retained checkpoints);
- busy: the busy checkpoint's wall time and the worst apply latency while it ran (target
  <= 5 ms; the applies it shares the CPU with stretch its wall time), and the worst of the
  applies the OS did not preempt (`ru_nivcsw` unchanged, as `storage.py` does).
Targets (issue 20) at 1M keys: one changed key -> <= 20 ms of writing and <= 64 KiB written;
100k changed keys -> cost proportional to the shards touched; apply stall <= 5 ms.
The load average is printed: above the CPU count every wall time is inflated.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import ByteView, OsDirectory
from phalanx.storage.interface import LoadedCheckpoint, Piece, StoredCheckpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storage import CONFIG, kv_state_bytes, put_entry  # a sibling bench script


class TimedStore:
    """A `CheckpointStore` that times its save: the part spent in the app's steps (inside
    `next()` of the chunks) and the rest (the store's own)."""

    def __init__(self, inner: FileCheckpointStore) -> None:
        self.inner = inner
        self.app_s = 0.0
        self.total_s = 0.0
        self.app_cpu = 0.0
        self.total_cpu = 0.0

    def save(self, checkpoint: StoredCheckpoint) -> None:
        self.inner.save(checkpoint)

    def save_stream(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece]) -> int:
        self.app_s = self.app_cpu = 0.0
        start, cpu = time.perf_counter(), time.thread_time()
        length = self.inner.save_stream(index, meta, self._timed(iter(chunks)))
        self.total_s = time.perf_counter() - start
        self.total_cpu = time.thread_time() - cpu
        return length

    def _timed(self, chunks: Iterator[bytes | Piece]) -> Iterator[bytes | Piece]:
        clock, cpu = time.perf_counter, time.thread_time
        while True:
            t0, c0 = clock(), cpu()
            try:
                chunk = next(chunks)
            except StopIteration:
                self.app_s += clock() - t0
                self.app_cpu += cpu() - c0
                return
            self.app_s += clock() - t0
            self.app_cpu += cpu() - c0
            yield chunk

    def load_latest(self) -> LoadedCheckpoint:
        return self.inner.load_latest()

    def read_view(self, index: int) -> ByteView:
        return self.inner.read_view(index)

    def indexes(self) -> list[int]:
        return self.inner.indexes()


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    layout: int
    changed: int
    seconds: float
    app_s: float
    store_s: float
    app_cpu: float
    store_cpu: float
    written: int
    copied: int
    on_disk: int
    busy_s: float
    stall_ms: float
    unpreempted_ms: float = 0.0


def fsync_ms(path: str, times: int = 7) -> float:
    """The median time to append 4 KiB to a file and fsync it, here: the floor under every
    durable save (v2 fsyncs its file and the directory; v3 its pack, manifest and the
    directory)."""
    name = os.path.join(path, "fsync-probe")
    took = []
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        for _ in range(times):
            t0 = time.perf_counter()
            os.write(fd, bytes(4096))
            os.fsync(fd)
            took.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.remove(name)
    return sorted(took)[times // 2] * 1e3


def disk_bytes(path: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


class Scenario:
    """One layout's store and replica over a loaded KV state."""

    def __init__(self, root: str, keys: int, layout: int, *, clustered: bool) -> None:
        self.clustered = clustered
        self.path = os.path.join(root, f"v{layout}")
        self.keys = keys
        self.store = TimedStore(FileCheckpointStore(OsDirectory(self.path), keep=3,
                                                    layout=layout))
        machine = KvStateMachine()
        machine.restore(kv_state_bytes(keys))
        self.writer = ThreadedCheckpointWriter(self.store)
        self.pacer = GcPacer()
        self.replica = Replica(machine, checkpoints=self.store,
                               writer=self.writer,
                               policy=CheckpointPolicy(every_entries=0, every_bytes=0),
                               config=CONFIG, gc_pacer=self.pacer)
        self.n = 0
        self.unpreempted = 0.0
        self.pacer.settle()

    def key(self, n: int) -> str:
        """Spread: a stride of 7919 keys, so N changes touch ~min(N, shards) shards;
        clustered: consecutive keys from a point that moves with `n`, ~N/1000 shards."""
        if self.clustered:
            return f"key{(n * 1 + (n // 100_000) * 337_000) % self.keys:08d}"
        return f"key{(n * 7919) % self.keys:08d}"

    def change(self, count: int, value: bytes) -> None:
        for _ in range(count):
            self.n += 1
            self.replica.apply(put_entry(self.n, self.key(self.n), value))

    def checkpoint(self, *, absorb: bool = False) -> float:
        """An idle checkpoint's wall seconds (`absorb`: none if nothing was applied since)."""
        start = time.perf_counter()
        if not self.replica.checkpoint_now():
            if absorb:
                return 0.0
            raise SystemExit("the checkpoint did not start")
        self.writer.wait()
        elapsed = time.perf_counter() - start
        if any(t.index == 0 for t in self.replica.poll()) or (
                self.replica.status().checkpoint_in_flight is not None):
            raise SystemExit(f"checkpoint failed: {self.replica.status()}")
        return elapsed

    def busy_checkpoint(self) -> tuple[float, float]:
        """A checkpoint while applying back to back: (wall seconds, worst apply seconds)."""
        start = time.perf_counter()
        if not self.replica.checkpoint_now():
            raise SystemExit("the checkpoint did not start")
        worst = unpreempted = 0.0
        while self.replica.status().checkpoint_in_flight is not None:
            self.n += 1
            entry = put_entry(self.n, self.key(self.n), b"busy")
            switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
            t0 = time.perf_counter()
            self.replica.apply(entry)
            took = time.perf_counter() - t0
            worst = max(worst, took)
            if took > unpreempted and (
                    resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw == switches):
                unpreempted = took
        self.unpreempted = unpreempted
        return time.perf_counter() - start, worst

    def close(self) -> None:
        self.replica.close()
        gc.unfreeze()


def run(root: str, keys: int, layout: int, counts: list[int], *, clustered: bool,
        rounds: int, busy_max: int) -> list[Result]:
    print(f"  layout v{layout}: loading {keys:,} keys ...", flush=True)
    sc = Scenario(root, keys, layout, clustered=clustered)
    sc.change(1, b"base")
    base = sc.checkpoint()
    print(f"  layout v{layout}: base checkpoint {base:.2f} s, "
          f"{sc.store.inner.stats.written:,} bytes", flush=True)
    results = []
    for i, count in enumerate(counts):
        for r in range(rounds if count < 1000 else 1):
            sc.checkpoint(absorb=True)  # the previous busy round's applies
            sc.change(count, b"idle-%d-%d" % (i, r))
            seconds = sc.checkpoint()
            st = sc.store
            idle = Result(layout=layout, changed=count, seconds=seconds,
                          app_s=st.app_s, store_s=st.total_s - st.app_s,
                          app_cpu=st.app_cpu, store_cpu=st.total_cpu - st.app_cpu,
                          written=st.inner.stats.written, copied=st.inner.stats.copied,
                          on_disk=disk_bytes(sc.path),
                          busy_s=0.0, stall_ms=0.0)
            if count > busy_max:
                results.append(idle)
                continue
            sc.change(count, b"busy-%d-%d" % (i, r))
            busy_s, stall = sc.busy_checkpoint()
            results.append(dataclasses.replace(idle, busy_s=busy_s, stall_ms=stall * 1e3,
                                               unpreempted_ms=sc.unpreempted * 1e3))
        r = results[-1]
        print(f"    {count:>7,} changed: {r.seconds * 1e3:8.1f} ms, {r.written:>11,} B written",
              flush=True)
    sc.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--changed", default="1,1000,100000",
                        help="comma-separated counts of changed keys (default 1,1000,100000)")
    parser.add_argument("--layouts", default="2,3", help="which layouts (default 2,3)")
    parser.add_argument("--clustered", action="store_true",
                        help="change consecutive keys (N keys touch ~N/1000 shards) instead of "
                             "keys spread over the whole key space (N touch ~min(N, shards))")
    parser.add_argument("--busy-max", type=int, default=1000,
                        help="take the busy checkpoint (stall measure) only for counts up to "
                             "this (default 1000: 100k more applies and a long checkpoint "
                             "each would add minutes)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of each count under 1000 (different keys each round: the "
                             "shard a key falls in varies in size; default 5)")
    args = parser.parse_args(argv)
    try:
        counts = [int(c) for c in args.changed.split(",")]
        layouts = [int(v) for v in args.layouts.split(",")]
    except ValueError:
        parser.error("--changed and --layouts take comma-separated integers, e.g. 1,1000")
    if any(c < 1 for c in counts) or not set(layouts) <= {2, 3}:
        parser.error("--changed counts must be >= 1 and --layouts among 2,3")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-ckpt-") as root:
        print(f"checkpoint cost against changed keys ({args.keys:,} keys, files in {root}, "
              f"fsync on, {os.cpu_count()} CPUs)")
        for layout in layouts:
            results += run(root, args.keys, layout, counts, clustered=args.clustered,
                           rounds=args.rounds, busy_max=args.busy_max)
        probe = fsync_ms(root)
    load = os.getloadavg()
    print(f"\nload average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
          f"one 4 KiB append + fsync here: {probe:.1f} ms (median of 7)")
    print("idle: wall ms (app steps + store) and the writer thread's CPU ms (app + store); "
          "busy: wall ms and the worst apply meanwhile")
    print(f"{'layout':<6} {'changed':>8} {'idle wall':>10} {'app':>8} {'store':>8} "
          f"{'app CPU':>8} {'st. CPU':>8} {'written':>12} {'copied':>10} {'on disk':>12} "
          f"{'busy wall':>10} {'max stall':>10} {'unpreempt.':>10}")
    for r in results:
        print(f"v{r.layout:<5} {r.changed:>8,} {r.seconds * 1e3:>10.1f} {r.app_s * 1e3:>8.1f} "
              f"{r.store_s * 1e3:>8.1f} {r.app_cpu * 1e3:>8.1f} {r.store_cpu * 1e3:>8.1f} "
              f"{r.written:>12,} {r.copied:>10,} {r.on_disk:>12,} "
              + (f"{r.busy_s * 1e3:>10.1f} {r.stall_ms:>10.2f} {r.unpreempted_ms:>10.2f}"
                 if r.busy_s else "         -"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Diagnose apply stalls during a checkpoint: which pauses come from the GC, which from the writer.

`bench/storage.py` reports the maximum apply stall while a 1M-key checkpoint is written; this
script explains it. It applies entries while the threaded writer serialises a checkpoint and
records (1) every apply slower than `--stall-ms`, with its own CPU time and whether the OS
preempted it (`getrusage` context switches: on a loaded machine most slow applies are just
that), (2) every garbage-collector pass, in CPU and wall time (`gc.callbacks`), and (3) every
stretch in which the writer thread ran longer than `--gap-ms` between its GIL yields, in wall
time and in the writer's own CPU time. `--rounds N` takes N checkpoints back to back: from the
second on, the overlay of the previous round's writes is merged in, and the previous fold is
adopted and the replaced base taken apart while applying. Run it with and without `--no-gc`
to see the GC's share.

    .venv/bin/python bench/checkpoint_stall.py [--keys 1000000] [--rounds 2] [--no-gc]

Same-run A/B at load 10-12 (2 rounds, 1M keys; session 3): before the sorted, sharded base
(b439728): checkpoints of 32-50 s, writer CPU stretches up to 126-188 ms, gen-1 GC passes up
to 10-16 ms CPU, unpreempted applies up to 17-37 ms. After: checkpoints of 3.3-5.4 s, writer
CPU stretches up to 7-9 ms (upper bound on GIL holds: it includes GIL-free syscalls), GC
passes <= 1.1 ms CPU, no apply above 2.5 ms that the OS had not preempted.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import phalanx.apps.kv_checkpoint as kv_module
import phalanx.apps.writer as writer_module
import storage as bench
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.storage import open_file_storage
from phalanx.storage.interface import SyncPolicy


class _YieldClock:
    """Stands in for the writer module's `time`: records how long the writer ran between
    `time.sleep(0)` yields."""

    def __init__(self, gap_s: float, yield_s: float | None = None) -> None:
        self.gap_s = gap_s
        self.yield_s = yield_s
        """How long the writer's GIL yields sleep instead of what it asks (`--yield-us`)."""
        self.last = time.perf_counter()
        self.last_cpu: float | None = None  # per thread: set on the writer's first yield
        self.gaps: list[float] = []
        self.cpu_gaps: list[float] = []
        """The same stretches in the writer thread's own CPU time: unlike wall time, not
        inflated when a loaded machine preempts the thread."""
        self.perf_counter = time.perf_counter
        self.monotonic = time.monotonic

    def sleep(self, seconds: float) -> None:
        now = time.perf_counter()
        cpu = time.thread_time()
        if now - self.last > self.gap_s:
            self.gaps.append(now - self.last)
        if self.last_cpu is not None and cpu - self.last_cpu > self.gap_s:
            self.cpu_gaps.append(cpu - self.last_cpu)
        time.sleep(seconds if self.yield_s is None else self.yield_s)
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()


@dataclass(frozen=True, slots=True, kw_only=True)
class Stall:
    """One slow apply: when, its wall and own-CPU time, and the thread's context switches
    meanwhile. A voluntary switch ("wait") is a GIL or lock wait; an involuntary one means
    the OS preempted the thread, so the wall time says more about the machine's load than
    about the code."""

    at: float
    wall: float
    cpu: float
    waits: int
    preempted: int


class _StepTimer:
    """Times every serialisation step of the KV snapshot (one `next()` of its chunks) in the
    writer's own CPU time: the longest one bounds how long the writer holds the GIL beyond
    its slice."""

    def __init__(self) -> None:
        self.longest: list[float] = []
        self.count = 0

    def wrap(self, chunks: Callable[[Any], Iterator[bytes]]) -> Callable[[Any], Iterator[bytes]]:
        def timed(snapshot: Any) -> Iterator[bytes]:
            inner = chunks(snapshot)
            while True:
                c0 = time.thread_time()
                try:
                    chunk = next(inner)
                except StopIteration:
                    return
                self.longest = sorted([*self.longest, time.thread_time() - c0])[-5:]
                self.count += 1
                yield chunk
        return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--stall-ms", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="checkpoints back to back: from the second on, the state has an "
                        "overlay of the previous round's writes, and the previous fold is "
                        "adopted and the replaced base taken apart while applying")
    parser.add_argument("--yield-us", type=float, default=None,
                        help="make the writer's GIL yields sleep this long instead (an "
                        "experiment on the GIL hand-off: 0 is time.sleep(0))")
    parser.add_argument("--switch-ms", type=float, default=None,
                        help="set the interpreter's GIL switch interval (sys.setswitchinterval) "
                             "to this many ms; default: leave it as it is (5 ms)")
    parser.add_argument("--changed", type=int, default=1,
                        help="keys rewritten before the first checkpoint (spread over the key "
                             "space; 100000 rewrites every shard, as bench/storage.py's second "
                             "checkpoint does)")
    parser.add_argument("--no-gc", action="store_true", help="disable the GC during the run")
    parser.add_argument("--no-pacer", action="store_true",
                        help="freeze once after loading only (no GcPacer re-freezes)")
    args = parser.parse_args()

    steps = _StepTimer()
    kv_module.KvSnapshot.chunks = steps.wrap(kv_module.KvSnapshot.chunks)  # type: ignore[method-assign]
    clock = _YieldClock(args.gap_ms / 1e3,
                        None if args.yield_us is None else args.yield_us / 1e6)
    writer_module.time = clock  # type: ignore[assignment]
    root = tempfile.mkdtemp(prefix="phalanx-stall-")
    storage = open_file_storage(os.path.join(root, "ckpt"), sync=SyncPolicy.GROUP)
    machine = KvStateMachine()
    machine.restore(bench.kv_state_bytes(args.keys))
    replica = Replica(
        machine,
        checkpoints=storage.checkpoints,
        writer=ThreadedCheckpointWriter(storage.checkpoints),
        policy=CheckpointPolicy(every_entries=0, every_bytes=0),
        config=bench.CONFIG,
        gc_pacer=None if args.no_pacer else GcPacer(),
    )
    replica.apply(bench.put_entry(1, "key00000000", b"new"))
    for i in range(2, args.changed + 1):
        replica.apply(bench.put_entry(i, f"key{(i * 7919) % args.keys:08d}", b"changed"))
    gc.collect()
    gc.freeze()
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1e3)
    if args.no_gc:
        gc.disable()
    passes: list[tuple[int, float, float]] = []
    started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        # The pass runs on the thread that triggered it, so thread_time is its CPU time.
        if phase == "start":
            started[0] = time.perf_counter()
            started[1] = time.thread_time()
        else:
            passes.append((int(info["generation"]), time.perf_counter() - started[0],
                           time.thread_time() - started[1]))

    gc.callbacks.append(on_gc)
    stalls: list[Stall] = []
    begin = time.perf_counter()
    clock.last = begin
    n = max(args.changed, 1) + 1
    durations: list[float] = []
    for _ in range(args.rounds):
        started_round = time.perf_counter()
        # Stretches are per checkpoint: the writer's idle time and the previous save (CRC
        # and writes with the GIL released) are not a stretch of holding the GIL.
        clock.last, clock.last_cpu = started_round, None
        replica.checkpoint_now()
        while replica.status().checkpoint_in_flight is not None:
            entry = bench.put_entry(n, f"key{(n * 7919) % args.keys:08d}", b"new")
            usage = resource.getrusage(resource.RUSAGE_THREAD)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            replica.apply(entry)
            took = time.perf_counter() - t0
            if took * 1e3 > args.stall_ms:
                after = resource.getrusage(resource.RUSAGE_THREAD)
                stalls.append(Stall(at=t0 - begin, wall=took, cpu=time.thread_time() - c0,
                                    waits=after.ru_nvcsw - usage.ru_nvcsw,
                                    preempted=after.ru_nivcsw - usage.ru_nivcsw))
            n += 1
        durations.append(time.perf_counter() - started_round)
    gc.callbacks.remove(on_gc)
    gc.enable()
    replica.close()
    storage.close()
    shutil.rmtree(root, ignore_errors=True)  # checkpoints of tens of MB: do not leave them

    print(f"{n - 2} applies during {args.rounds} back-to-back checkpoint(s) of {args.keys:,} "
          f"keys taking " + ", ".join(f"{d:.2f}" for d in durations)
          + f" s (GC {'off' if args.no_gc else 'on'})")
    worst = sorted(stalls, key=lambda s: -s.wall)[:8]
    print(f"applies slower than {args.stall_ms:g} ms: {len(stalls)}, of which preempted by the "
          f"OS: {sum(1 for s in stalls if s.preempted)}; worst (wall / own CPU, GIL waits, "
          "preemptions):")
    for s in worst:
        print(f"  {s.wall * 1e3:.1f} ms / {s.cpu * 1e3:.1f} ms at {s.at:.2f} s, "
              f"{s.waits} waits, {s.preempted} preemptions")
    clean = sorted((s for s in stalls if not s.preempted), key=lambda s: -s.wall)[:5]
    print(f"  without an OS preemption: {sum(1 for s in stalls if not s.preempted)}; worst "
          "(GIL waits, GC, our own work): "
          + (", ".join(f"{s.wall * 1e3:.1f} ms ({s.cpu * 1e3:.1f} ms CPU, {s.waits} waits)"
                       for s in clean) or "none"))
    slow = sorted(passes, key=lambda p: -p[2])[:5]
    print(f"GC passes: {len(passes)}; slowest (CPU / wall): "
          + ", ".join(f"gen{g} {c * 1e3:.1f} / {d * 1e3:.1f} ms" for g, d, c in slow))
    print(f"serialisation steps: {steps.count}; longest (writer CPU): "
          + ", ".join(f"{d * 1e3:.2f} ms" for d in reversed(steps.longest)))
    print(f"writer runs longer than {args.gap_ms:g} ms between yields: {len(clock.gaps)}; longest: "
          + ", ".join(f"{g * 1e3:.0f} ms" for g in sorted(clock.gaps, reverse=True)[:5]))
    print(f"  in writer CPU time: {len(clock.cpu_gaps)}; longest: "
          + ", ".join(f"{g * 1e3:.1f} ms" for g in sorted(clock.cpu_gaps, reverse=True)[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

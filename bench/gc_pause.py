"""The cyclic collector's pauses in a replica applying batched entries, with the GC pacer
counting per command (the tree) or per log entry (before issue 23's raftelect fix).

Run: `.venv/bin/python bench/gc_pause.py` (~1 min), `--help` for the flags.

What is measured: one process per run applies `--writes` KV puts (unique keys,
`--value-size` bytes) in log entries of `--batch` commands (a pipelined Raft leader's
`ProposeBatch`) through a `Replica` with a `GcPacer`, as `phalanx node run` does, and keeps
every entry alive as the Raft core's in-memory log does between checkpoints. Every
collection is timed with the main thread's CPU clock (`time.thread_time_ns`: the machine's
load does not inflate it) from `gc.callbacks`; the report gives, per arm, the longest
generation-2 pass, the number of generation-2 passes and their total, the longest pass of
any generation, and the CPU per write of the applies (the collector's time included). Arms
alternate (A B B A ...), each run in a fresh process (the collector is process-global).

Arm `entry` is the old accounting (`note_apply()` once per entry, emulated by a pacer that
ignores the count); arm `command` the tree's. While a full pass runs, the node's event
loop is frozen (the GIL is held): a Raft leader sends no heartbeat.

Must not be imported by the package.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.kv_wire import encode_command
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.storage.memory import MemoryDisk


class PerEntryPacer(GcPacer):
    """The accounting before the fix: a log entry is one apply, whatever it holds."""

    def note_apply(self, applies: int = 1) -> None:
        super().note_apply(1)


def run_arm(arm: str, writes: int, batch: int, value_size: int) -> dict[str, float]:
    pacer = PerEntryPacer() if arm == "entry" else GcPacer()
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk().open().checkpoints,
                      gc_pacer=pacer, policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    passes: list[tuple[int, int]] = []  # (generation, CPU ns)
    started = [0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time_ns()
        else:
            passes.append((info["generation"], time.thread_time_ns() - started[0]))

    value = b"v" * value_size
    log: list[Entry] = []  # the Raft core keeps its entries in memory until a checkpoint
    gc.callbacks.append(timer)
    apply_ns = 0
    try:
        for index in range(1, writes // batch + 1):
            entry = Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=tuple(
                ClientRequest(client_id="c", request_no=index * batch + i,
                              command=encode_command(Put(key=f"key-{index}-{i}", value=value)))
                for i in range(batch)))
            log.append(entry)
            t0 = time.thread_time_ns()
            replica.apply(entry)
            apply_ns += time.thread_time_ns() - t0
    finally:
        gc.callbacks.remove(timer)
    full = [ns for generation, ns in passes if generation == 2]
    done = (writes // batch) * batch
    return {
        "gen2_passes": len(full),
        "gen2_max_ms": max(full, default=0) / 1e6,
        "gen2_total_ms": sum(full) / 1e6,
        "any_max_ms": max((ns for _, ns in passes), default=0) / 1e6,
        "freezes": pacer.freezes,
        "apply_us_per_write": apply_ns / 1e3 / done,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writes", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=256, help="commands per log entry (256)")
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--arm", choices=("entry", "command"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.writes, args.batch, args.value_size)))
        return
    import os

    print(f"{args.writes:,} puts in entries of {args.batch}, {args.value_size}-byte values; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'arm':8} {'gen2 passes':>11} {'gen2 max ms':>11} {'gen2 total ms':>13} "
          f"{'any max ms':>10} {'freezes':>7} {'apply us/write':>14}")
    order = (("entry", "command"), ("command", "entry"))
    for i in range(args.pairs):
        for arm in order[i % 2]:
            out = subprocess.run([sys.executable, __file__, "--arm", arm, "--writes",
                                  str(args.writes), "--batch", str(args.batch), "--value-size",
                                  str(args.value_size)], check=True, capture_output=True,
                                 text=True).stdout
            r = json.loads(out)
            print(f"{arm:8} {r['gen2_passes']:>11} {r['gen2_max_ms']:>11.1f} "
                  f"{r['gen2_total_ms']:>13.1f} {r['any_max_ms']:>10.1f} {r['freezes']:>7} "
                  f"{r['apply_us_per_write']:>14.2f}", flush=True)
    print("(CPU of the main thread; entry = one apply per log entry, before the fix; "
          "command = one per command)")


if __name__ == "__main__":
    main()

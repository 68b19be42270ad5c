"""What serving checkpoint pieces to a peer costs a node, from memory against from its pack
files (the page cache), isolated from TLS, framing and the network: the CPU time of reading
every piece of a checkpoint in the ranges a fetcher asks for (`read_piece_range`, 1 MiB),
as `phalanx.runtime.piece_transfer` serves a `PieceRequest`.

A checkpoint of `--mb` MiB in `--piece-kb` KiB pieces (random bytes, fsync off) is written to a
real directory by a store with piece memory and by one without (`memory_bytes` 0); then each
serves it whole, interleaved (memory, disk, memory, disk... `--rounds` times), the packs
having just been written (so in the page cache, as on a node that checkpointed recently).
Prints the process CPU time per round and per MiB, the median of each, and the load.

Usage: .venv/bin/python bench/piece_serve.py [--mb 117] [--piece-kb 120] [--rounds 5]
Must not be imported by the package.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import tempfile
import time

from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import SyncPolicy
from phalanx.storage.packs import BytesPiece

RANGE = 1 << 20


def serve_all(store: FileCheckpointStore, pieces: list[tuple[bytes, int]]) -> int:
    """Read every piece in `RANGE` ranges, as a peer's requests ask; returns the bytes."""
    total = 0
    for digest, length in pieces:
        for at in range(0, length, RANGE):
            total += len(store.read_piece_range(digest, at, min(RANGE, length - at)))
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=117, help="checkpoint size, MiB")
    p.add_argument("--piece-kb", type=int, default=120, help="piece size, KiB (a KV shard)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of each")
    args = p.parse_args()
    rng = random.Random(1)
    count = (args.mb << 20) // (args.piece_kb << 10)
    raws = [rng.randbytes(args.piece_kb << 10) for _ in range(count)]
    chunks = [BytesPiece(hashlib.sha256(r).digest(), r) for r in raws]
    roots = {}
    stores = {}
    try:
        for label, budget in (("memory", (args.mb + 8) << 20), ("disk", 0)):
            roots[label] = tempfile.mkdtemp(prefix=f"phalanx-piece-serve-{label}-")
            store = FileCheckpointStore(OsDirectory(roots[label]), sync=SyncPolicy.OFF,
                                        memory_bytes=budget)
            store.save_stream(1, b"", chunks)
            stores[label] = store
        _, pieces = stores["disk"].piece_list(1)
        cpu: dict[str, list[float]] = {"memory": [], "disk": []}
        for _ in range(args.rounds):
            for label in ("memory", "disk"):
                t0 = time.process_time()
                served = serve_all(stores[label], pieces)
                cpu[label].append(time.process_time() - t0)
                assert served == count * (args.piece_kb << 10)
        mib = count * args.piece_kb / 1024
        print(f"# {count} pieces of {args.piece_kb} KiB ({mib:.0f} MiB) served in 1 MiB ranges, "
              f"{args.rounds} interleaved rounds; load {os.getloadavg()[0]:.1f}")
        for label, times in cpu.items():
            print(f"{label:6}: CPU s per round {', '.join(f'{t:.3f}' for t in times)}; median "
                  f"{statistics.median(times):.3f} s = "
                  f"{statistics.median(times) / mib * 1e3:.2f} ms per MiB")
        print(f"memory hits {stores['memory'].memory.hits}, disk-side memory hits "
              f"{stores['disk'].memory.hits}")
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

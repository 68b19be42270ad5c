"""Process-wide memory tuning for a node process (`phalanx node run`), applied once at start.

Owns: `tune_malloc`.

Why, arenas: glibc's malloc gives each thread that allocates its own arena (up to 8 per
core). A node allocates from the core task's thread, trio's worker threads (fsync,
persistence) and the checkpoint writer, and everything a Python thread allocates beyond
pymalloc's 512-byte blocks (commands, dict tables, frames) goes to that thread's arena. Memory
freed in one arena is not reused by another, so a busy node holds several partly empty heaps.
The GIL already serialises nearly all allocation, so extra arenas buy no parallelism; two
arenas cut a 1M-key node's RSS by about 15 MiB in `bench/kv.py`'s RSS phase.

Why, a fixed mmap threshold: glibc serves a block of 128 KiB or more with its own `mmap`, but
raises that threshold (up to 32 MiB) each time such a block is freed, so later blocks of that
size come from the heap, whose holes are not given back to the OS. A node allocates and frees
MiB-sized blocks all the time (the KV base's packed shards, checkpoint output, frames): after
a bulk load of 1M keys, up to ~90 MiB of free heap stayed resident (measured in-process).
Fixing the threshold keeps every such block in its own mapping, returned to the OS when freed.

Only the node entry point calls this (never library code: an embedding program owns its
process). A `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` already in the environment wins
for that setting. Not glibc (musl, macOS): nothing happens.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter numbers (malloc.h)."""
MMAP_THRESHOLD = 256 * 1024


def tune_malloc(*, arenas: int = 2, mmap_threshold: int = MMAP_THRESHOLD) -> tuple[str, ...]:
    """Apply the module's two settings; returns the names of those applied.

    Call before the process starts threads (arenas already created stay). Raises
    `ValueError` for values out of range (our own misuse).
    """
    if arenas < 1 or mmap_threshold < 4096:
        raise ValueError(f"need arenas >= 1 and mmap_threshold >= 4096, got {arenas}, "
                         f"{mmap_threshold}")
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return ()
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied: list[str] = []
    for env, param, value in (("MALLOC_ARENA_MAX", M_ARENA_MAX, arenas),
                              ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, mmap_threshold)):
        if env not in os.environ and mallopt(param, value):
            applied.append(env)
    return tuple(applied)

"""Process-wide memory tuning for a node process (`phalanx node run`), applied once at start.

Owns: `limit_malloc_arenas`.

Why: glibc's malloc gives each thread that allocates its own arena (up to 8 per core). A node
allocates from the core task's thread, trio's worker threads (fsync, persistence) and the
checkpoint writer, and everything a Python thread allocates beyond pymalloc's 512-byte blocks
(commands, dict tables, frames) goes to that thread's arena. Memory freed in one arena is not
reused by another, so a busy node holds several partly empty heaps. The GIL already serialises
nearly all allocation, so extra arenas buy no parallelism; two arenas cut a 1M-key node's RSS
by about 15 MiB in `bench/kv.py`'s RSS phase.

Only the node entry point calls this (never library code: an embedding program owns its
process). A `MALLOC_ARENA_MAX` already in the environment wins. Not glibc (musl, macOS):
nothing happens.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
"""glibc's `mallopt` parameter number for the arena limit (malloc.h)."""


def limit_malloc_arenas(count: int = 2) -> bool:
    """Ask glibc to use at most `count` malloc arenas; True if it did.

    Call before the process starts threads (arenas already created stay). Raises
    `ValueError` for a `count` below 1 (our own misuse).
    """
    if count < 1:
        raise ValueError(f"arena count must be >= 1, got {count}")
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))

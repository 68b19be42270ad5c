"""Process-wide memory tuning for a node process (`phalanx node run`), applied once at start.

Owns: `use_system_malloc` / `system_malloc_exec` (a node process runs on glibc's malloc, not
Python's small-object allocator), `tune_malloc`, `trim_malloc` and `TrimPolicy` (when a node
gives free heap back).

Why glibc's malloc for a node (`PYTHONMALLOC=malloc`): Python's own allocator (pymalloc)
carves small objects (up to 512 bytes: keys, values, map nodes, messages) out of 1 MiB arenas
and returns an arena to the OS only when every block in it is free. A node's KV overlays hold
hundreds of thousands of such objects between two checkpoints; once a checkpoint folds them
into the packed base they are freed, but the few long-lived objects born among them keep their
arenas resident: after a 1M-key load most of a node's memory sat in arenas of free pools.
glibc's malloc takes the same blocks from its heap, and `malloc_trim` (below) hands free
pages inside it back: about half the memory, for a few percent of throughput at 64 clients
(docs/BENCHMARKS.md, design measurements).
`PYTHONMALLOC` must be set before the interpreter starts, so the `phalanx node run` command
re-executes itself once with it (`use_system_malloc`, called by `phalanx.cli.main.main` before it
imports the node runtime, ~0.7 s of imports that the re-executed interpreter alone then pays);
a `PYTHONMALLOC` already in the environment wins (`PYTHONMALLOC=pymalloc phalanx node run ...`
keeps Python's allocator).

Why, arenas: glibc's malloc gives each thread that allocates its own arena (up to 8 per
core). A node allocates from the core task's thread, trio's worker threads (fsync,
persistence) and the checkpoint writer, and everything a Python thread allocates beyond
pymalloc's 512-byte blocks (commands, dict tables, frames) goes to that thread's arena. Memory
freed in one arena is not reused by another, so a busy node holds several partly empty heaps.
The GIL already serialises nearly all allocation, so extra arenas buy no parallelism; two
arenas cut a 1M-key node's RSS (docs/BENCHMARKS.md).

Why, a fixed mmap threshold: glibc serves a block of 128 KiB or more with its own `mmap`, but
raises that threshold (up to 32 MiB) each time such a block is freed, so later blocks of that
size come from the heap, whose holes are not given back to the OS. A node allocates and frees
MiB-sized blocks all the time (the KV base's packed shards, checkpoint output, frames): after
a bulk load of 1M keys, tens of MiB of free heap stayed resident (docs/BENCHMARKS.md).
Fixing the threshold keeps every such block in its own mapping, returned to the OS when freed.

Why, trimming: glibc returns free memory to the OS only at the top of a heap; holes inside
it (the Raft log's commands after a compaction, a replaced KV base's packed keys and offsets,
checkpoint and network buffers: blocks between pymalloc's 512 bytes and the mmap threshold)
stay resident. `malloc_trim(0)` hands their pages back (`madvise`; figures in
docs/BENCHMARKS.md). It costs milliseconds of C time with the GIL released, holding each
malloc arena's lock in turn, so it runs on a worker thread and only when there is something
to give back: `TrimPolicy` asks for one after each checkpoint, once the checkpoint is done
and the state had a few seconds to adopt its fold, and again later, once it has freed the
layers the fold replaced.

Only the node entry point calls this (never library code: an embedding program owns its
process). A `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` already in the environment wins
for that setting. Not glibc (musl, macOS): nothing happens.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter numbers (malloc.h)."""
MMAP_THRESHOLD = 256 * 1024


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


def system_malloc_exec(
    environ: Mapping[str, str], orig_argv: Sequence[str], executable: str, *, glibc: bool
) -> tuple[str, list[str], dict[str, str]] | None:
    """What `use_system_malloc` executes (path, argv, environment), or None when it should
    not: `PYTHONMALLOC` is already set (the user's choice, or this is the re-executed
    process), the C library is not glibc, or the interpreter's command line is unknown."""
    if "PYTHONMALLOC" in environ or not glibc or not executable or len(orig_argv) < 2:
        return None
    return executable, [executable, *orig_argv[1:]], {**environ, "PYTHONMALLOC": "malloc"}


def use_system_malloc() -> None:
    """Re-execute this process (same pid, same arguments) on glibc's malloc (module docstring),
    unless `system_malloc_exec` says not to. Call first thing in a process's entry point,
    before it starts threads or opens anything; only the `phalanx node run` command does (an
    embedding program owns its process)."""
    plan = system_malloc_exec(os.environ, sys.orig_argv, sys.executable, glibc=_glibc())
    if plan is not None:
        path, argv, env = plan
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(path, argv, env)


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


def trim_malloc() -> bool:
    """Give free heap pages back to the OS (glibc `malloc_trim(0)`); True if any were.

    Blocks for its duration (up to a few ms after a large free) without the GIL: call it on a
    worker thread. Not glibc: does nothing and returns False."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))


class TrimPolicy:
    """When to call `trim_malloc`: twice after each checkpoint (the fold it builds replaces
    the whole base, and the Raft log is compacted behind it), `settle` and `again` seconds
    after the checkpoint count last changed, and only while no checkpoint is being written;
    also once `settle` seconds after start (recovery frees its parse buffers). The second
    trim catches what the replica's idle housekeeping freed after the first: it takes the
    replaced layers apart a few pieces per idle tick, seconds for a million keys. Pure: the
    caller passes the time and the replica's counters."""

    __slots__ = ("_due_at", "_seen", "again", "settle")

    def __init__(self, *, now: float, settle: float = 3.0, again: float = 15.0) -> None:
        if settle < 0 or again < settle:
            raise ValueError(f"need 0 <= settle <= again, got {settle}, {again}")
        self.settle = settle
        self.again = again
        self._seen: int | None = None
        self._due_at: list[float] = [now + settle]

    def due(self, *, now: float, checkpoints_written: int, in_flight: bool) -> bool:
        """Whether to trim now."""
        if checkpoints_written != self._seen:
            if self._seen is not None:
                self._due_at = [now + self.settle, now + self.again]
            self._seen = checkpoints_written
        if in_flight or not self._due_at or now < self._due_at[0]:
            return False
        while self._due_at and now >= self._due_at[0]:
            self._due_at.pop(0)  # one trim covers every time already passed
        return True

"""Keep CPython's cyclic garbage collector from stalling apply in a process with a large state.

Owns: `GcPacer`, an opt-in policy the replica layer calls at two points: after it loads a
large state (`settle`), and every `every_applies` applies (`note_apply`: an apply is one
command, so a log entry holding a batch of commands counts as that many).

Why: a replica's state (an `immutables.Map` of a million keys is ~300k tracked map nodes)
is long-lived and acyclic, yet every full ("generation 2") pass of the cyclic collector walks
all of it: 200-350 ms with the process frozen, triggered by nothing more than the allocations
of ordinary applies. `gc.freeze()` moves every tracked object into the permanent generation,
which no pass walks. Freezing once after loading is not enough: each apply path-copies a few
map nodes that then live on (one per distinct key written), so a full pass a few hundred
thousand applies later walks them all again. The pacer re-freezes every `every_applies`
applies (default 256), after a young-generation collection (`gc.collect(1)`, which walks at most
generations 0 and 1: a fraction of a millisecond), so no full pass ever has more than
about `every_applies` applies' worth of objects to walk.

Trade-off, stated: frozen objects are never examined for reference cycles again. Reference
counting still frees them the moment they become unreachable (map nodes, entries, bytes: the
replica's data is acyclic), but a reference cycle that had already survived into the old
generation when a freeze ran is kept until the process exits. The young collection before
each freeze reclaims the cycles that die young, which is where they die in practice. That
is why the pacer is opt-in: the node runtime and the benchmarks turn it on; an embedding
program that manages the collector itself leaves it off.

Process-global by nature (the collector is), so use one pacer per process.
Must not import: consensus cores, trio, the simulator. Not used by the simulator.
"""

from __future__ import annotations

import gc

__all__ = ["GcPacer"]


class GcPacer:
    """Freezes long-lived objects out of the collector's full passes (see the module docstring).

    Args:
        every_applies: applies between re-freezes. Smaller keeps every pass shorter at the
            cost of more frequent young collections. Each apply leaves a few young map nodes
            (path copies), and a collection costs ~1-2 us per young map node (each visits
            up to 32 children, mostly cache misses): at 2048 a generation-1 pass took 3-5
            ms, at 256 about 1 ms (1M-key state, 2-core machine), for ~1 us more GC time
            per apply.
    """

    def __init__(self, *, every_applies: int = 256) -> None:
        if every_applies < 1:
            raise ValueError(f"every_applies must be >= 1, got {every_applies}")
        self.every_applies = every_applies
        self._since = 0
        self.freezes = 0
        """How many times the pacer froze the heap (tests, metrics)."""

    def settle(self) -> None:
        """After loading a large state (a checkpoint, a replay, an installed snapshot):
        collect the young generations and freeze everything, the new state included. No full
        pass: it would walk the whole state once more, for the cycles of a load that makes
        none."""
        gc.collect(1)
        self._freeze()
        self._since = 0

    def note_apply(self, applies: int = 1) -> None:
        """Count `applies` applies (the commands of one log entry); once `every_applies`
        are counted, collect the young generations and freeze. The replica passes an
        entry's command count, not 1: a batched entry (Raft's `ProposeBatch`) holds up to
        256 commands, and counting it as one apply let a pipelined node write ~65,000
        commands between freezes, whose objects every full pass then walked: 50 ms of CPU
        with the GIL held, 150-280 ms of wall time on a loaded 2-core machine, long enough
        for a leader's followers to time out (docs/BENCHMARKS.md, "Elections under
        pipelined load")."""
        self._since += applies
        if self._since >= self.every_applies:
            if gc.isenabled():  # e.g. replay pauses the collector: nothing to pace then
                gc.collect(1)
                self._freeze()
            self._since = 0

    def _freeze(self) -> None:
        gc.freeze()
        self.freezes += 1

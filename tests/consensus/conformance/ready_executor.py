"""One `Ready` carried out in the contract's order against pluggable hooks: the shared executor
of the hand-driven test clusters (`tests/consensus/raft/raft_harness.py`,
`tests/consensus/pbft/pbft_harness.py`). The simulator's `SimNode`, which the conformance
suite's `SimCluster` drives, keeps its own (hot, queue-based) executor.

Owns: `ReadyExecutor`. A harness builds one per cluster from its hooks (each takes the node
first) and calls `run(node, ready)` after every `core.step`. `run` does, in this order
(`phalanx.consensus.core.Ready` states the contract):

    observe(node, ready)            before anything: a trace that compares the Ready with the
                                    state it is about to change
    0. send(node, s)                for each `early_messages` entry
    1. persist(node, ready)         when `ready.has_persistence`: every durable write of the
                                    Ready (snapshot, truncation, entries, hard state,
                                    core_state), synchronous and durable on return;
       install(node, snapshot)      then, when `ready.snapshot` is set: restore the app
    2. send(node, s)                for each `messages` entry
    3. apply(node, entry)           for each `committed` entry, in order; with
                                    `checkpoint_every=K`, an applied index that is a multiple
                                    of K is noted for step 6
    4. read(node, r), reject(node, j), abort(node, a)   for each `reads` / `rejected` /
                                    `aborted` entry
    5. feed(node, Persisted(number))    when `ready.number` (the Ready had persistence)
    6. feed(node, CheckpointTaken(i, checkpoint(node, i)))   for each noted index, in order

Options (the ordering each harness needs):
- `checkpoint_every`: 0 (the harness takes checkpoints itself, through `checkpoint(node, i)`)
  or K > 0 (the replica layer checkpoints every K applied indices, PBFT-style; the data is
  asked of the `checkpoint` hook only when it is fed, after `Persisted`).
- re-entrancy: `feed` is the harness's own step function, so the Ready of a fed input is
  carried out at once, depth first, before `run` goes on (a checkpoint noted in step 3 is
  fed after everything `Persisted` caused). Both harnesses want this; a queued driver
  (SimNode) steps those inputs after the Ready instead, which this executor does not model.
- `read` / `reject` default to ignoring the answers (a harness that never answers clients).
  `abort` has no default that ignores: a Ready with `aborted` entries and no `abort` hook
  raises (an abort is a definite outcome a harness must account for, not a retry hint).

Rules: the executor holds no state of its own between `run` calls and never steps a core
itself: every input goes through `feed`, so the harness's crash/"down" checks apply.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import (
    Abort,
    CheckpointTaken,
    Input,
    Persisted,
    ReadState,
    Ready,
    Rejection,
    Send,
    Snapshot,
)
from phalanx.consensus.types import Entry, NodeId


def _ignore(node: NodeId, item: object) -> None:
    pass


class ReadyExecutor:
    """Carries out Readys for every node of one hand-driven cluster (see the module doc)."""

    __slots__ = ("_abort", "_apply", "_checkpoint", "_feed", "_install", "_observe",
                 "_persist", "_read", "_reject", "_send", "checkpoint_every")

    def __init__(
        self,
        *,
        feed: Callable[[NodeId, Input], None],
        persist: Callable[[NodeId, Ready], None],
        install: Callable[[NodeId, Snapshot], None],
        send: Callable[[NodeId, Send], None],
        apply: Callable[[NodeId, Entry], None],
        read: Callable[[NodeId, ReadState], None] = _ignore,
        reject: Callable[[NodeId, Rejection], None] = _ignore,
        abort: Callable[[NodeId, Abort], None] | None = None,
        checkpoint: Callable[[NodeId, int], bytes] | None = None,
        observe: Callable[[NodeId, Ready], None] | None = None,
        checkpoint_every: int = 0,
    ) -> None:
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, not {checkpoint_every}")
        if checkpoint_every and checkpoint is None:
            raise ValueError("checkpoint_every needs a checkpoint hook")
        self._feed = feed
        self._persist = persist
        self._install = install
        self._send = send
        self._apply = apply
        self._read = read
        self._reject = reject
        self._abort = abort
        self._checkpoint = checkpoint
        self._observe = observe
        self.checkpoint_every = checkpoint_every

    def run(self, node: NodeId, ready: Ready) -> None:
        """Carry out `ready`, which `node`'s core just returned."""
        if self._observe is not None:
            self._observe(node, ready)
        send = self._send
        for s in ready.early_messages:  # 0. they may leave before the persist
            send(node, s)
        if ready.has_persistence:  # 1. persist, then restore the app from a snapshot
            self._persist(node, ready)
            if ready.snapshot is not None:
                self._install(node, ready.snapshot)
        for s in ready.messages:  # 2. send
            send(node, s)
        every = self.checkpoint_every
        due: list[int] = []
        for e in ready.committed:  # 3. apply
            self._apply(node, e)
            if every and e.index % every == 0:
                due.append(e.index)
        for r in ready.reads:  # 4. answer
            self._read(node, r)
        for j in ready.rejected:
            self._reject(node, j)
        if ready.aborted:
            if self._abort is None:
                raise RuntimeError(f"{node} aborted {len(ready.aborted)} request(s) but this "
                                   "executor has no abort hook")
            for a in ready.aborted:
                self._abort(node, a)
        if ready.number:  # 5. durable
            self._feed(node, Persisted(number=ready.number))
        for index in due:  # 6. the replica layer's checkpoints
            self.checkpoint(node, index)

    def checkpoint(self, node: NodeId, index: int) -> None:
        """Take a checkpoint of `node`'s app at `index` (the `checkpoint` hook's data) and
        feed `CheckpointTaken` to its core."""
        if self._checkpoint is None:
            raise ValueError("this executor has no checkpoint hook")
        data = self._checkpoint(node, index)
        self._feed(node, CheckpointTaken(index=index, data=data))

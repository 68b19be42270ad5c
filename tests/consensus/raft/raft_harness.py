"""A tiny in-test Raft cluster: cores wired by hand through a message queue, each `Ready`
carried out by the shared `ReadyExecutor` (tests/consensus/conformance/ready_executor.py:
early messages, persist to an in-memory disk, send, apply, answer, then `Persisted`); this
module only supplies its hooks and a trace of every Ready.

Used by the unit tests and the data-driven interaction tests. Every node applies committed
entries to a list of commands and checks that it receives each index exactly once, in order.
Crash = lose the core (the disk keeps everything persisted; this harness persists every
Ready synchronously); messages reaching a crashed node are lost.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.consensus.core import (
    Ready,
    Receive,
    Snapshot,
    Submit,
    Tick,
    snapshot_bytes,
)
from phalanx.consensus.raft import RaftBugs, RaftConfig, RaftCore, RaftInput, RaftRestoredState
from phalanx.consensus.types import (
    ClientRequest,
    Entry,
    EntryKind,
    HardState,
    Message,
    NodeId,
)

_CONFORMANCE = str(Path(__file__).resolve().parents[1] / "conformance")
if _CONFORMANCE not in sys.path:
    sys.path.insert(0, _CONFORMANCE)
from ready_executor import ReadyExecutor  # noqa: E402  (the shared Ready order)


def fmt_entry(e: Entry) -> str:
    if e.kind is EntryKind.NOOP:
        return f"{e.index}@{e.term} noop"
    if e.kind is EntryKind.COMMAND:
        return f"{e.index}@{e.term} " + ",".join(r.command.decode() for r in e.requests)
    assert e.config is not None
    c = e.config
    s = "v=" + ",".join(c.voters)
    if c.voters_outgoing:
        s += " out=" + ",".join(c.voters_outgoing)
    if c.learners:
        s += " l=" + ",".join(c.learners)
    return f"{e.index}@{e.term} conf({s})"


@dataclass
class Disk:
    """What survives a crash: hard state, latest snapshot, log entries after it."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)
    app_checkpoint: tuple[int, bytes] | None = None

    def persist(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snapshot = rd.snapshot
            self.entries = []
            self.app_checkpoint = (rd.snapshot.meta.index, rd.snapshot.data)
        if rd.truncate_from is not None:
            self.entries = [e for e in self.entries if e.index < rd.truncate_from]
        for e in rd.entries:
            base = self.snapshot.meta.index if self.snapshot else 0
            last = self.entries[-1].index if self.entries else base
            assert e.index == last + 1, f"non-contiguous append {e.index} after {last}"
            self.entries.append(e)
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state

    def restored(self) -> RaftRestoredState:
        return RaftRestoredState(hard_state=self.hard_state, snapshot=self.snapshot,
                                 entries=tuple(self.entries))


@dataclass
class Node:
    core: RaftCore
    disk: Disk
    config: RaftConfig
    app: list[str] = field(default_factory=list)
    applied_index: int = 0
    up: bool = True
    reads: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)


def encode_app(cmds: list[str]) -> bytes:
    return "|".join(cmds).encode()


def decode_app(data: bytes) -> list[str]:
    return data.decode(errors="replace").split("|") if data else []


class Cluster:
    """Nodes n1..nN, a FIFO network with partitions, and a trace of everything that happens."""

    def __init__(self, *, bugs: frozenset[str] = frozenset(), **config_kwargs: object) -> None:
        self.bugs = RaftBugs.from_names(bugs)
        """Deliberate bugs every node has (test-only; `consensus/raft/bugs.py`)."""
        self.nodes: dict[NodeId, Node] = {}
        self.queue: list[tuple[NodeId, NodeId, Message]] = []
        self.blocked: set[tuple[NodeId, NodeId]] = set()
        self.trace: list[str] = []
        self.config_kwargs = config_kwargs
        self.seed = 0
        self.verbose = True
        self.committed_at: dict[int, Entry] = {}
        """Every entry any node applied, by index: checks State Machine Safety."""
        self.executor = ReadyExecutor(
            feed=lambda n, inp: self.step(n, inp),
            persist=lambda n, rd: self.nodes[n].disk.persist(rd),
            install=self._install, send=lambda n, s: self.queue.append((n, s.to, s.message)),
            apply=self._apply,
            read=lambda n, r: self.nodes[n].reads.append((r.request.command.decode(), r.index)),
            reject=lambda n, j: self.nodes[n].rejected.append(j.request.command.decode()),
            checkpoint=self._checkpoint, observe=self._observe)
        """Carries out every Ready in the contract's order through the hooks below."""

    # ---------------------------------------------------------------- membership

    def add_node(self, nid: NodeId, voters: tuple[NodeId, ...],
                 learners: tuple[NodeId, ...] = (), **overrides: object) -> Node:
        kwargs: dict[str, object] = {**self.config_kwargs, **overrides}
        cfg = RaftConfig(node_id=nid, voters=voters, learners=learners, **kwargs)  # type: ignore[arg-type]
        self.seed += 1
        core = RaftCore(cfg, rng=random.Random(self.seed), restored=None, bugs=self.bugs)
        node = Node(core=core, disk=Disk(), config=cfg)
        self.nodes[nid] = node
        return node

    def add_nodes(self, n: int, **overrides: object) -> None:
        ids = tuple(NodeId(f"n{i}") for i in range(1, n + 1))
        for nid in ids:
            self.add_node(nid, ids, **overrides)

    # ---------------------------------------------------------------- stepping

    def log(self, line: str) -> None:
        if self.verbose:
            self.trace.append(line)

    def step(self, nid: NodeId, inp: RaftInput) -> None:
        node = self.nodes[nid]
        if not node.up:
            return
        before = (node.core.role, node.core.term)
        rd = node.core.step(inp)
        after = (node.core.role, node.core.term)
        if before != after:
            self.log(f"{nid} became {after[0].value} at term {after[1]}")
        self._handle_ready(nid, node, rd)

    def _handle_ready(self, nid: NodeId, node: Node, rd: Ready) -> None:
        """Carry out `rd` (tests wrap this to watch every Ready)."""
        self.executor.run(nid, rd)

    # -- the executor's hooks (the Ready order itself lives in `ready_executor`)

    def _install(self, nid: NodeId, snap: Snapshot) -> None:
        node = self.nodes[nid]
        node.app = decode_app(snapshot_bytes(snap.data))
        node.applied_index = snap.meta.index

    def _apply(self, nid: NodeId, e: Entry) -> None:
        node = self.nodes[nid]
        assert e.index == node.applied_index + 1, (nid, e.index, node.applied_index)
        prev = self.committed_at.setdefault(e.index, e)
        assert prev == e, f"State Machine Safety violated at {e.index}: {prev} vs {e}"
        node.applied_index = e.index
        node.app.extend(r.command.decode() for r in e.requests)

    def _checkpoint(self, nid: NodeId, index: int) -> bytes:
        node = self.nodes[nid]
        data = encode_app(node.app)
        node.disk.app_checkpoint = (index, data)
        return data

    def _observe(self, nid: NodeId, rd: Ready) -> None:
        if self.verbose:
            self._log_ready(nid, self.nodes[nid], rd)

    def _log_ready(self, nid: NodeId, node: Node, rd: Ready) -> None:
        if rd.snapshot is not None:
            m = rd.snapshot.meta
            self.log(f"{nid} install snapshot {m.index}@{m.term}")
        if rd.truncate_from is not None:
            self.log(f"{nid} truncate from {rd.truncate_from}")
        if rd.entries:
            self.log(f"{nid} append " + " | ".join(fmt_entry(e) for e in rd.entries))
        old = node.disk.hard_state
        hs = rd.hard_state
        if hs is not None and (hs.term, hs.vote) != (old.term, old.vote):
            self.log(f"{nid} hardstate term={hs.term} vote={hs.vote or '-'}")
        for s in (*rd.early_messages, *rd.messages):
            self.log(f"{nid}->{s.to} {s.message}")
        if rd.committed:
            self.log(f"{nid} apply " + " | ".join(fmt_entry(e) for e in rd.committed))
        for r in rd.reads:
            self.log(f"{nid} read {r.request.command.decode()} at index {r.index}")
        for j in rd.rejected:
            hint = f" (leader {j.leader_hint})" if j.leader_hint else ""
            self.log(f"{nid} reject {j.request.command.decode()}: {j.reason}{hint}")

    # ---------------------------------------------------------------- network

    def deliver(self, pred: Callable[[NodeId, NodeId, Message], bool] | None = None,
                limit: int | None = None, skip: int = 0) -> int:
        """Deliver the queued messages matching `pred` (one round: not those they produce),
        leaving the first `skip` matching ones queued (to reorder messages)."""
        batch, keep = [], []
        for item in self.queue:
            if (pred is None or pred(*item)) and (limit is None or len(batch) < limit):
                if skip > 0:
                    skip -= 1
                    keep.append(item)
                    continue
                batch.append(item)
            else:
                keep.append(item)
        self.queue = keep
        for src, dst, msg in batch:
            if (src, dst) in self.blocked or dst not in self.nodes or not self.nodes[dst].up:
                self.log(f"dropped {src}->{dst} {msg}")
                continue
            self.step(dst, Receive(src=src, message=msg))
        return len(batch)

    def drop(self, pred: Callable[[NodeId, NodeId, Message], bool] | None = None) -> int:
        keep = [m for m in self.queue if not (pred is None or pred(*m))]
        n = len(self.queue) - len(keep)
        self.queue = keep
        return n

    def stabilize(self, max_rounds: int = 1000) -> None:
        for _ in range(max_rounds):
            if not self.deliver():
                return
        raise AssertionError("cluster did not stabilize")

    def partition(self, *groups: tuple[NodeId, ...]) -> None:
        self.blocked = set()
        for g in groups:
            for h in groups:
                if g is not h:
                    self.blocked.update((a, b) for a in g for b in h)

    def heal(self) -> None:
        self.blocked = set()

    # ---------------------------------------------------------------- faults & helpers

    def crash(self, nid: NodeId) -> None:
        """Stop `nid`. Messages already in flight stay in flight: those reaching it while it
        is down are lost, later ones (and its own last words) are delivered."""
        self.nodes[nid].up = False

    def restart(self, nid: NodeId) -> None:
        node = self.nodes[nid]
        self.seed += 1
        node.core = RaftCore(node.config, rng=random.Random(self.seed),
                             restored=node.disk.restored(), bugs=self.bugs)
        cp = node.disk.app_checkpoint
        node.app = decode_app(cp[1]) if cp else []
        node.applied_index = cp[0] if cp else 0
        node.up = True

    def tick(self, nid: NodeId, n: int = 1) -> None:
        for _ in range(n):
            self.step(nid, Tick())

    def tick_election(self, nid: NodeId) -> None:
        """Tick until `nid`'s randomized election timeout fires."""
        core = self.nodes[nid].core
        self.tick(nid, max(1, core.randomized_timeout - core.election_elapsed))

    def propose(self, nid: NodeId, command: str, *, read_only: bool = False,
                client: str = "c", request_no: int = 0) -> None:
        req = ClientRequest(client_id=client, request_no=request_no,
                            command=command.encode(), read_only=read_only)
        self.step(nid, Submit(request=req))

    def checkpoint(self, nid: NodeId, index: int | None = None) -> None:
        node = self.nodes[nid]
        idx = node.applied_index if index is None else index
        if idx != node.applied_index:
            raise ValueError("this harness checkpoints at the applied index only")
        self.executor.checkpoint(nid, idx)
        # The driver would also compact its durable log; the restart path needs the
        # snapshot meta, which the core recorded.
        snap = node.core.snapshot
        if snap is not None:
            node.disk.snapshot = snap
            node.disk.entries = [e for e in node.disk.entries if e.index > snap.meta.index]

    def leader(self) -> NodeId | None:
        leaders = [n for n, node in self.nodes.items()
                   if node.up and node.core.role.value == "leader"]
        best = max(leaders, key=lambda n: self.nodes[n].core.term, default=None)
        return best

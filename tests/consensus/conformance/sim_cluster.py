"""A seeded cluster of the simulator's own replicas (`phalanx.jepsen.sim.node.SimNode`: the
simulator's `Ready` executor over a memory disk, the `ReadyPersister` and the KV replica),
built from a `Subject`'s `ProtocolSetup`, with crash points inside a `Ready` and a record
of every input, output and application.

Owns: `SimCluster`, `Probe` (wraps each core: records its inputs and Readys, and cuts a
Ready at a crash point) and the crash points `CUTS`:

- ``early``: the Ready's `early_messages` went out, nothing was persisted (its durable
  writes, PBFT's durable record included, are undone);
- ``persist``: step 1 is durable, no message of step 2 was sent, nothing applied;
- ``send``: persisted and sent, nothing applied;
- ``persisted``: the whole Ready was carried out, but `Persisted(number)` never reached the
  core (SimNode's own `crash_point`).

After a cut the probe swallows every input until the node is crashed (at the same virtual
instant), so nothing the core did after the cut can leave it. The node restarts from its
disk only, a little later.

Checked as it runs: the setup's invariant checker (election safety, log matching,
committed-durable, agreement, validity) and its message watch (one Raft vote per term,
one PBFT vote per (kind, view, seq)); `applied` records every entry the state machine
really applied, per node, in `Segment`s (from a boot or an installed checkpoint on).

Rules: deterministic (every random draw from `random.Random(seed)` children; virtual time).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from subjects import Subject

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import Applied, Replica
from phalanx.consensus.core import EMPTY_READY, Core, CoreStatus, Input, Ready
from phalanx.consensus.types import ClientRequest, Entry, Message, NodeId, SnapshotMeta
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.network import NetworkConfig, SimNetwork
from phalanx.jepsen.sim.node import SimNode
from phalanx.jepsen.sim.pbft import DurableStateCore
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage
from phalanx.storage.memory import MemoryDisk

MS = 1_000_000
CUTS = ("early", "persist", "send", "persisted")
KEYS = ("k0", "k1", "k2")


class Probe:
    """A core as the cluster drives it: records inputs and Readys, and cuts a Ready at a
    crash point chosen by `cut(probe, ready)`."""

    def __init__(self, inner: Core, name: str, cut: Callable[[Probe, Ready], str | None],
                 record: bool) -> None:
        self.inner = inner
        self.name = name
        self._cut = cut
        self.dead: str | None = None
        self.inputs: list[Input] | None = [] if record else None
        self.readys: list[Ready] | None = [] if record else None

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        if self.dead is not None:
            return EMPTY_READY  # crashed at a cut: nothing after it may leave the node
        if self.inputs is not None:
            self.inputs.append(inp)
        undo = _durable_undo(self.inner)
        ready = self.inner.step(inp)
        if self.readys is not None:
            self.readys.append(ready)
        point = self._cut(self, ready) if ready.has_persistence else None
        if point is None:
            return ready
        self.dead = point
        if point == "early":
            undo()
            return Ready(early_messages=ready.early_messages)
        if point == "persist":
            return dataclasses.replace(ready, messages=(), committed=(), reads=(), rejected=())
        if point == "send":
            return dataclasses.replace(ready, committed=(), reads=(), rejected=())
        return ready  # "persisted": SimNode's crash_point crashes before Persisted


def _durable_undo(core: Core) -> Callable[[], None]:
    """How to take back the durable writes of the step about to run: the simulator keeps
    PBFT's durable record in `DurableStateCore`'s cells, written at step time (the memory
    disk's synchronous fsync), so a crash before that Ready is persisted must restore it."""
    if not isinstance(core, DurableStateCore):
        return lambda: None
    cells: dict[str, Any] = core._cells
    lossy: dict[str, Any] | None = core._lossy
    node = core.node_id
    before = cells.get(node)

    def undo() -> None:
        if before is None:
            cells.pop(node, None)
        else:
            cells[node] = before
        if lossy is not None:
            lossy.pop(node, None)

    return undo


def unwrap(core: Core) -> Core:
    return core.inner if isinstance(core, Probe) else core


@dataclass(slots=True)
class Segment:
    """What a node's state machine applied from one starting point on: its boot (the
    restored checkpoint) or a checkpoint installed from peers (state transfer)."""

    start: int
    """The replica's applied index at the start."""
    how: str
    """"boot" or "install"."""
    indices: list[int] = field(default_factory=list)


@dataclass
class _Sink:
    answers_all: bool
    answered: set[tuple[str, int]] = field(default_factory=set)

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        self.answered.add((client_id, request_no))

    def reject(self, node: str, request: ClientRequest, leader_hint: str | None) -> None:
        pass

    def abort(self, node: str, request: ClientRequest, reason: str) -> None:
        self.answered.add((request.client_id, request.request_no))


class SimCluster:
    """Nodes of one subject over a `SimNetwork` (messages go through the codec)."""

    def __init__(self, subject: Subject, seed: int, *, record: bool = False,
                 crash_p: float = 0.0, network: NetworkConfig | None = None) -> None:
        self.subject = subject
        self.setup = setup = subject.make_setup()
        root = random.Random(seed)
        self.loop = loop = EventLoop()
        self.trace = Trace(loop)
        self.checker = setup.checker or InvariantChecker(leader_role=setup.leader_role)
        self.codec = setup.codec
        self.names = setup.names
        self.network = SimNetwork(
            loop, random.Random(root.getrandbits(64)), self.trace, self._deliver,
            config=network or NetworkConfig(),
            encode=self.codec.encoder(), decode=self.codec.decoder(Message),  # type: ignore[arg-type]
            watch=self._watch if setup.watch_send is not None else None,
            watch_types=setup.watch_types)
        self.sink = _Sink(answers_all=setup.replies is not None)
        self.crash_rng = random.Random(root.getrandbits(64))
        self.crash_p = crash_p
        self.cuts: dict[str, int] = dict.fromkeys(CUTS, 0)
        self.record = record
        self.probes: dict[str, list[Probe]] = {n: [] for n in self.names}
        self.rng_states: dict[str, list[object]] = {n: [] for n in self.names}
        self.applied: dict[str, list[Segment]] = {n: [] for n in self.names}
        self.committed: dict[int, Entry] = {}
        self.problems: list[str] = []
        self.issued: dict[tuple[str, int], ClientRequest] = {}
        self.done: set[tuple[str, int]] = set()
        self.nodes: dict[str, SimNode] = {}
        for name in self.names:
            node = SimNode(
                name, loop=loop, rng=random.Random(root.getrandbits(64)), trace=self.trace,
                send=self.network.send, clients=self.sink, checker=self.checker,
                make_core=self._make_core, make_replica=self._make_replica,
                codec=_Codec(self.codec), observe=lambda c: setup.observe(unwrap(c)),
                tick_ns=10 * MS)
            node.crash_point = lambda n, _r: isinstance(n.core, Probe) and n.core.dead is not None
            self.nodes[name] = node
            self.network.route(name, node.deliver)
        self._requests = 0
        self.to_outsiders = 0

    # -- building (SimNode's factories, wrapped) --------------------------------------------

    def _make_core(self, name: str, durable: DurableState, rng: random.Random) -> Core:
        self.rng_states[name].append(rng.getstate())
        probe = Probe(self.setup.make_core(name, durable, rng), name, self._cut, self.record)
        self.probes[name].append(probe)
        return probe

    def _make_replica(self, name: str, storage: Storage, durable: DurableState) -> Replica:
        replica = self.setup.make_replica(name, storage, durable)
        lives = self.applied[name]
        lives.append(Segment(start=replica.applied_index, how="boot"))
        apply, install = replica.apply, replica.install

        def installing(meta: SnapshotMeta, data: bytes) -> None:
            install(meta, data)
            lives.append(Segment(start=replica.applied_index, how="install"))

        def recording(entry: Entry) -> tuple[Applied, ...]:
            before = replica.applied_index
            out = apply(entry)
            if replica.applied_index != before:
                lives[-1].indices.append(entry.index)
                known = self.committed.setdefault(entry.index, entry)
                if known.requests != entry.requests:
                    self.problems.append(f"{name} applied {entry} at {entry.index}, "
                                         f"another node {known}")
                for r in entry.requests:
                    self.done.add((r.client_id, r.request_no))
            return out

        replica.apply = recording  # type: ignore[method-assign]
        replica.install = installing  # type: ignore[method-assign]
        return replica

    def reference(self) -> Replica:
        """A fresh replica that applied the committed sequence once, in order."""
        replica = self.setup.make_replica("ref", MemoryDisk("ref").open(),
                                          DurableState(hard_state=None, snapshot=None,
                                                       snapshot_data=None, entries=()))
        for index in sorted(self.committed):
            replica.apply(self.committed[index])
        return replica

    # -- crashes -----------------------------------------------------------------------------

    def _cut(self, probe: Probe, ready: Ready) -> str | None:
        if not self.crash_p or self.crash_rng.random() >= self.crash_p:
            return None
        down = sum(1 for n in self.nodes.values()
                   if not isinstance(n.core, Probe) or n.core.dead is not None)
        if down + 1 > self.faulty:
            return None
        point = self.crash_rng.choice(CUTS)
        self.cuts[point] += 1
        node = self.nodes[probe.name]
        self.trace(f"CONFORMANCE cut {probe.name} at {point}")
        incarnation = node.incarnation

        def crash() -> None:
            if node.incarnation == incarnation:
                node.crash(lose_unfsynced=False)

        self.loop.call_later(0, crash)
        self.loop.call_later(self.crash_rng.randrange(1 * MS, 30 * MS), node.restart)
        return point

    @property
    def faulty(self) -> int:
        n = len(self.names)
        return (n - 1) // 3 if self.setup.replies is not None else (n - 1) // 2

    # -- traffic -----------------------------------------------------------------------------

    def _watch(self, src: str, dst: str, message: Message) -> None:
        watch = self.setup.watch_send
        assert watch is not None
        problem = watch(src, dst, message)
        if problem is not None:
            self.checker.record("vote-safety", self.loop.now, problem)

    def _deliver(self, src: str, dst: str, message: Message) -> None:
        node = self.nodes.get(dst)
        if node is None:  # a reply to a hostile sender outside the cluster: nobody there
            self.to_outsiders += 1
            return
        node.deliver(src, message)

    def leader(self) -> str | None:
        for name in self.names:
            core = self.nodes[name].core
            if core is not None and core.status().role == self.setup.leader_role:
                return name
        return None

    def submit(self, request: ClientRequest) -> None:
        """Send `request` where the protocol's clients send it (BFT: every replica)."""
        key = (request.client_id, request.request_no)
        self.issued[key] = request
        if self.setup.replies is not None:
            self.setup.replies.record(request)
            targets = list(self.names)
        else:
            leader = self.leader()
            targets = [leader] if leader is not None else list(self.names)
        for name in targets:
            self.nodes[name].submit(request)

    def new_request(self, client: str = "c1") -> ClientRequest:
        self._requests += 1
        no = self._requests
        command = kv_wire.encode_command(
            Put(key=KEYS[no % len(KEYS)], value=f"{client}:{no}".encode()))
        make = self.setup.client_request
        if make is not None:  # the protocol's clients wrap commands (leaderless: signed txs)
            return make(client, no, command)
        return ClientRequest(client_id=client, request_no=no, command=command)

    def workload(self, until_ns: int, *, every_ns: int = 20 * MS, window: int = 3) -> None:
        """Run to `until_ns`, keeping up to `window` requests outstanding, retrying each
        outstanding one every `every_ns` (the same number: the replica deduplicates)."""
        while self.loop.now < until_ns:
            pending = [k for k in self.issued if k not in self.done]
            for key in pending:
                self.submit(self.issued[key])
            for _ in range(window - len(pending)):
                self.submit(self.new_request())
            self.run(min(until_ns, self.loop.now + every_ns))

    def run(self, until_ns: int) -> None:
        self.loop.run_until(until_ns)
        self.check_logs()

    def check_logs(self) -> None:
        logs = {n: self.nodes[n].log for n in self.names}
        self.checker.check_log_matching(logs, self.loop.now)
        self.checker.check_committed_durable(logs, self.loop.now)

    def heal(self) -> None:
        """No more crashes; every node up."""
        self.crash_p = 0.0
        for node in self.nodes.values():
            node.restart()

    def settle(self, budget_ns: int = 3_000 * MS) -> None:
        """Heal, then run until every issued request is applied and every node applied the
        same highest index (or the budget runs out: the caller's assertions then fail)."""
        self.heal()
        end = self.loop.now + budget_ns
        while self.loop.now < end:
            pending = [k for k in self.issued if k not in self.done]
            for key in pending:
                self.submit(self.issued[key])
            if not pending and self.loop.now % (200 * MS) == 0:
                # A replica that fell behind learns it from new traffic (PBFT catches up at
                # the next checkpoint): keep a trickle of requests going.
                self.submit(self.new_request())
            self.run(self.loop.now + 20 * MS)
            tops = {n: self.nodes[n].replica.applied_index  # type: ignore[union-attr]
                    for n in self.names}
            # Pending again after the run: the trickle request just issued counts too.
            pending = [k for k in self.issued if k not in self.done]
            if not pending and len(set(tops.values())) == 1 and self.committed:
                return

    def kv(self, replica: Replica) -> tuple[bytes | None, ...]:
        machine = replica.machine
        assert isinstance(machine, KvStateMachine)
        return tuple(machine.get(k) for k in KEYS)


class _Codec:
    """A node's persistence codec (`Registry.encoder()`/`decoder()`, as the simulator's)."""

    __slots__ = ("decode", "encode")

    def __init__(self, registry: Any) -> None:
        self.encode: Callable[[object], bytes] = registry.encoder()
        self.decode: Callable[[bytes], object] = registry.decoder()

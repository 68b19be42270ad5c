"""One simulated replica: a consensus core driven by the `Ready` ordering rule over a memory
disk and the replica layer, with crash, restart, pause and clock-rate skew.

Owns: `SimNode`. It carries out every `Ready` exactly as `phalanx.consensus.core.Ready`
orders: send `early_messages` → persist (through `phalanx.runtime.persistence.ReadyPersister`; the
memory disk's fsync is instantaneous in virtual time) → send → apply committed entries in
order → answer rejected and aborted requests and reads → feed `Persisted(number)` back. Inputs
produced while handling a Ready (Persisted, CheckpointTaken) are queued and stepped after
it, never re-entrantly.

Faults:
- `crash(lose_unfsynced)`: the core, the replica and every queued input vanish; with
  `lose_unfsynced` the memory disk also loses (or tears) its un-fsynced writes (a machine
  crash), otherwise written data survive (a process crash: the page cache survives).
- `restart()`: reopen storage, `load()` the durable state, rebuild core and replica.
- `lose_disk()`: a crash that also replaces the disk with an empty one, IDENTITY included
  (`phalanx.runtime.identity`, modelled by `identity`): the restart then decides, as the runtime
  does (`phalanx.runtime.identity.amnesia`), that the node must recover before it votes.
- `retire()`: a crash after which `restart` does nothing (removed from the membership).
- `pause()/resume()`: no ticks; messages and client requests queue until resumed. With
  `fresh_clock` (`ProtocolSpec.deadline_clock`: a core that compares `Tick.now_ms` with
  deadlines) `resume` steps a `Tick` with the current time before the queued inputs, as the
  runtime does after a gap (`phalanx.runtime.fresh_clock`); without it, that core would judge
  them by its reading from before the pause.
- `clock_rate`: the tick period is divided by it (a fast clock ticks more often), and the
  node's wall clock (`Tick.now_ms`: `SIM_EPOCH_MS` plus virtual time, `wall_clock_ms`) runs
  `clock_rate` times as fast. The wall clock survives crashes (it is the machine's).
- `crash_point`: called after every carried-out Ready that had persistence; when it returns
  True the node crashes right there (BUGGIFY-style: after persisting and sending, before
  any further input), e.g. between granting a vote and hearing the next RequestVote.

Rules: deterministic (a per-node `random.Random`, virtual time only); the core, replica and
invariant checker are injected, so the node knows no protocol beyond the `Core` contract.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from phalanx.apps.replica import ApplyStatus, Replica
from phalanx.consensus._fastpath import slot_twin
from phalanx.consensus.core import (
    EMPTY_READY,
    Core,
    Input,
    Persisted,
    ReadState,
    Ready,
    Receive,
    Send,
    Submit,
    Tick,
)
from phalanx.consensus.types import ClientRequest, HardState, Message
from phalanx.jepsen.sim.invariants import InvariantChecker, LogMirror
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.runtime.identity import Identity, amnesia
from phalanx.runtime.persistence import Codec, DurableState, ReadyPersister, commit_only_change
from phalanx.storage.files import Storage
from phalanx.storage.memory import MemoryDisk

_UNANSWERED = (ApplyStatus.EXPIRED, ApplyStatus.SESSION_EXPIRED, ApplyStatus.INVALID)
"""Outcomes the simulated node does not answer (the client's retry is answered later; a
malformed transaction's client times out)."""

SIM_EPOCH_MS = 1_700_000_000_000
"""The wall clock of every simulated node at virtual time 0 (ms since the Unix epoch)."""
_RECEIVE_TWIN = slot_twin(Receive)
_PERSISTED_TWIN = slot_twin(Persisted)

CoreFactory = Callable[[str, DurableState, random.Random], Core]
ReplicaFactory = Callable[[str, Storage, DurableState], Replica]
"""Builds a node's replica over its storage and restores it (checkpoint + committed replay)."""


class ClientSink(Protocol):
    answers_all: bool
    """True (BFT): a node answers every request it executes, not only those submitted to it,
    as a real PBFT replica answers a client's subscribed connection
    (`phalanx.runtime.waiters`): a client that sent to the primary alone gets f+1 answers."""

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None: ...

    def reject(self, node: str, request: ClientRequest, leader_hint: str | None) -> None: ...

    def abort(self, node: str, request: ClientRequest, reason: str) -> None:
        """`node` says `request` will never be applied (`phalanx.consensus.core.Abort`)."""
        ...


@dataclass(slots=True)
class NodeStats:
    steps: int = 0
    crashes: int = 0
    restarts: int = 0
    applied: int = 0


class SimNode:
    def __init__(
        self,
        name: str,
        *,
        loop: EventLoop,
        rng: random.Random,
        trace: Trace,
        send: Callable[[str, str, Message], None],
        clients: ClientSink,
        checker: InvariantChecker,
        make_core: CoreFactory,
        make_replica: ReplicaFactory,
        codec: Codec,
        observe: Callable[[Core], tuple[str, int, int]],
        tick_ns: int,
        fresh_clock: bool = False,
    ) -> None:
        self.name = name
        self.fresh_clock = fresh_clock
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self._send = send
        self.clients = clients
        self.checker = checker
        self.make_core = make_core
        self.make_replica = make_replica
        self.codec = codec
        self.observe = observe
        self.tick_ns = tick_ns
        self.clock_rate = 1.0
        self._clock_ns = 0
        """This node's wall clock, ns of (skewed) virtual time since `SIM_EPOCH_MS`."""
        self._clock_at = loop.now
        """The virtual time `_clock_ns` was last advanced to."""
        self.disk = MemoryDisk(name)
        self.identity: Identity | None = Identity(cluster="sim", node=name, state="new")
        """The IDENTITY file of the disk (`phalanx.runtime.identity`); None once the disk is
        lost."""
        self.stats = NodeStats()
        self.incarnation = 0
        self.core: Core | None = None
        self.replica: Replica | None = None
        self.persister: ReadyPersister | None = None
        self._saved_hs = HardState()
        self.log = LogMirror()
        self.paused = False
        self._paused_inbox: list[Input] = []
        self._inputs: deque[Input] = deque()
        self._stepping = False
        self._reads: list[ReadState] = []
        self._client_requests: dict[tuple[str, int], ClientRequest] = {}
        self.retired = False
        """Removed from the membership and stopped for good (`retire`)."""
        self.crash_point: Callable[[SimNode, Ready], bool] | None = None
        self.outbox: Callable[[str, tuple[Send, ...]], None] | None = None
        """When set, carries out each Ready's (early) messages as a whole, `outbox(name,
        sends)`, instead of one `send` each (`phalanx.jepsen.sim.dissemination`: broadcasts
        through gossip)."""
        self._observed: tuple[str, int, int] | None = None
        """The last (role, term, commit) handed to the checker in this incarnation."""

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.core is not None

    def start(self) -> None:
        """Boot (or reboot) from whatever the disk holds durably."""
        if self.core is not None:
            raise RuntimeError(f"{self.name} is already running")
        storage = self.disk.open()
        self.persister = ReadyPersister(
            wal=storage.wal,
            hard_state=storage.hard_state,
            checkpoints=storage.checkpoints,
            codec=self.codec,
        )
        durable = self.persister.load()
        verdict = amnesia(
            identity=self.identity,
            has_state=(durable.hard_state is not None or durable.snapshot is not None
                       or bool(durable.entries) or durable.core_state is not None),
            has_hard_state=durable.hard_state is not None or durable.core_state is not None,
            state_lost=durable.lost_reason)
        self.identity = Identity(cluster="sim", node=self.name, state=verdict.next_state)
        if verdict.recovering:
            durable = dataclasses.replace(durable, recovering=True)
            self.trace(f"{self.name} RECOVERING {verdict.reason}")
        self._saved_hs = durable.hard_state or HardState()
        if durable.snapshot is not None:
            self.log = LogMirror(
                snapshot_index=durable.snapshot.index,
                snapshot_term=durable.snapshot.term,
                entries=durable.entries,
            )
        else:
            self.log = LogMirror(entries=durable.entries)
        self.replica = self.make_replica(self.name, storage, durable)
        self.core = self.make_core(self.name, durable, self.rng)
        self.incarnation += 1
        self._observed = None
        self.trace(
            f"{self.name} START incarnation={self.incarnation} hard_state={durable.hard_state} "
            f"snapshot={durable.snapshot.index if durable.snapshot else 0} "
            f"log={len(durable.entries)}"
        )
        self._schedule_tick(self.incarnation)

    def crash(self, *, lose_unfsynced: bool) -> None:
        if self.core is None:
            return
        self.core = None
        self.replica = None
        self.persister = None
        self.paused = False
        self._paused_inbox.clear()
        self._inputs.clear()
        self._reads.clear()
        self._client_requests.clear()
        self.stats.crashes += 1
        if lose_unfsynced:
            self.disk.crash(self.rng)
        self.trace(f"{self.name} CRASH lose_unfsynced={lose_unfsynced}")

    @property
    def recovering(self) -> bool:
        """Lost its disk and has not caught up yet (as its IDENTITY records)."""
        return self.identity is None or self.identity.state == "recovering"

    def lose_disk(self) -> None:
        """Crash, and come back (at `restart`) with an empty disk and no IDENTITY."""
        self.crash(lose_unfsynced=False)
        self.disk = MemoryDisk(self.name)
        self.identity = None
        self.trace(f"{self.name} LOSE DISK")

    def restart(self) -> None:
        if self.core is None and not self.retired:
            self.stats.restarts += 1
            self.start()

    def retire(self) -> None:
        """Crash for good: no later `restart` (a node removed from the membership)."""
        self.crash(lose_unfsynced=False)
        self.retired = True

    def pause(self) -> None:
        if self.core is not None and not self.paused:
            self.paused = True
            self.trace(f"{self.name} PAUSE")

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        self.trace(f"{self.name} RESUME")
        inbox, self._paused_inbox = self._paused_inbox, []
        if self.fresh_clock:  # the time first: the inbox queued while the clock ran on
            inbox.insert(0, Tick(now_ms=self.wall_clock_ms()))
        for inp in inbox:
            self.step(inp)
        self._schedule_tick(self.incarnation)

    # -- inputs ------------------------------------------------------------------------------

    def _schedule_tick(self, incarnation: int) -> None:
        period = max(1, int(self.tick_ns / self.clock_rate))
        self.loop.call_later(period, lambda: self._on_tick(incarnation))

    def wall_clock_ms(self) -> int:
        """This node's wall clock now (ms since the Unix epoch): `SIM_EPOCH_MS` plus the
        virtual time elapsed, each stretch scaled by the `clock_rate` in force when it is
        read (ticks are, likewise, re-timed at the next one). Never goes backwards."""
        now = self.loop.now
        if now > self._clock_at:
            self._clock_ns += int((now - self._clock_at) * self.clock_rate)
            self._clock_at = now
        return SIM_EPOCH_MS + self._clock_ns // 1_000_000

    def _on_tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation or self.core is None or self.paused:
            return  # a stale timer of an earlier life, or paused (resume re-arms)
        self.step(Tick(now_ms=self.wall_clock_ms()))
        replica = self.replica
        if replica is not None and replica.idle_checkpoints and self.core is not None:
            replica.maintain()  # the idle checkpoint rule, as the runtime's idle ticks
            for taken in replica.poll():
                self.step(taken)
        identity = self.identity
        if identity is not None and identity.state != "member" and self.core is not None:
            status = self.core.status()  # as the runtime's `_record_membership` does
            if not status.recovering and (identity.state == "recovering" or status.term > 0
                                          or status.commit_index > 0):
                if identity.state == "recovering":
                    self.trace(f"{self.name} RECOVERED at commit {status.commit_index}")
                self.identity = dataclasses.replace(identity, state="member")
        self._schedule_tick(incarnation)

    def deliver(self, src: str, message: Message) -> None:
        core = self.core
        if core is None:
            return
        # `Receive(src=src, message=message)` through its layout twin (`_fastpath.slot_twin`;
        # `NodeId(src)` is the identity at run time): no call on this hot path.
        inp = _RECEIVE_TWIN()
        inp.src = src
        inp.message = message
        inp.__class__ = Receive
        if self.paused or self._stepping or self._inputs:
            self.step(inp)
            return
        # `step(inp)` for the common case (nothing queued), without the queue round trip,
        # then `_drain()` for what the Ready caused (Persisted, CheckpointTaken).
        self._stepping = True
        try:
            ready = core.step(inp)
            self.stats.steps += 1
            if ready is not EMPTY_READY:
                self._handle(ready, core)
        finally:
            self._stepping = False
        if self._inputs:
            self._drain()

    def submit(self, request: ClientRequest) -> None:
        if self.core is None:
            return
        self._client_requests[(request.client_id, request.request_no)] = request
        self.step(Submit(request=request))

    def submit_many(self, requests: tuple[ClientRequest, ...],
                    batch: Callable[[tuple[ClientRequest, ...]], Input]) -> None:
        """Several client requests in one step (`batch`: `ProtocolSetup.submit_batch`), as
        the runtime steps the writes of one driver pass."""
        if self.core is None:
            return
        for request in requests:
            self._client_requests[(request.client_id, request.request_no)] = request
        self.step(batch(requests))

    def step(self, inp: Input) -> None:
        """Feed one input and carry out the resulting Readys (and the inputs they cause)."""
        if self.core is None:
            return
        if self.paused:
            self._paused_inbox.append(inp)
            return
        self._inputs.append(inp)
        if not self._stepping:
            self._drain()

    def _drain(self) -> None:
        """Step the queued inputs in order, and those their Readys cause."""
        inputs = self._inputs
        self._stepping = True
        stats = self.stats
        try:
            while inputs and self.core is not None:  # a Ready may crash the node
                core = self.core
                ready = core.step(inputs.popleft())
                stats.steps += 1
                if ready is not EMPTY_READY:
                    # (EMPTY_READY: nothing to persist, send or apply: neither the term nor
                    # the commit index moved (either would be a hard state to persist), and
                    # any role change is a step down, which the election-safety check
                    # ignores.)
                    self._handle(ready, core)
        finally:
            self._stepping = False

    # -- the Ready ordering rule ------------------------------------------------------------

    def _handle(self, ready: Ready, core: Core) -> None:
        """Carry out one Ready of `core`, then hand the checker what it observes."""
        persister, replica = self.persister, self.replica
        assert persister is not None
        assert replica is not None
        send = self._send
        name = self.name
        outbox = self.outbox
        # 0. Messages that depend on nothing unpersisted may go at once.
        if outbox is not None and ready.early_messages:
            outbox(name, ready.early_messages)
        else:
            for out in ready.early_messages:
                send(name, out.to, out.message)
        # 1. Persist first. Like the runtime's group commit, a hard state that changes only
        # the commit index is not written (restoring commit is an optimisation, never needed
        # for safety), so restarts here also start from an older commit index.
        # `ready.has_persistence`, inlined.
        persists = (ready.hard_state is not None or bool(ready.entries)
                    or ready.truncate_from is not None or ready.snapshot is not None
                    or ready.core_state is not None)
        if persists:
            hs = ready.hard_state
            defer = hs is not None and commit_only_change(self._saved_hs, hs)
            if hs is not None and not defer:
                self._saved_hs = hs
            persister.persist(ready, install=replica.install, defer_hard_state=defer)
            if ready.snapshot is not None:
                meta = ready.snapshot.meta
                self.log.install_snapshot(meta.index, meta.term)
                self.trace(f"{self.name} INSTALL snapshot index={meta.index} term={meta.term}")
            if ready.truncate_from is not None:
                self.log.truncate_from(ready.truncate_from)
            if ready.entries:
                self.log.append(ready.entries)
        # 2. Then send.
        if outbox is not None and ready.messages:
            outbox(name, ready.messages)
        else:
            for out in ready.messages:
                send(name, out.to, out.message)
        # 3. Apply committed entries in order.
        committed = ready.committed
        if committed:
            now = self.loop.now
            observe_apply = self.checker.observe_apply
            for entry in committed:
                observe_apply(name, entry, now)
                for outcome in replica.apply(entry):
                    if outcome.status not in _UNANSWERED:
                        self._answer(outcome.client_id, outcome.request_no, outcome.result)
            self.stats.applied += len(committed)
        # 4. Answer rejections and aborts now and reads once applied.
        for rejection in ready.rejected:
            key = (rejection.request.client_id, rejection.request.request_no)
            if self._client_requests.pop(key, None) is not None:
                self.clients.reject(self.name, rejection.request, rejection.leader_hint)
        for abort in ready.aborted:
            # A definite outcome, answered like an executed request: to the client that
            # submitted it here, and under matching replies to every client.
            key = (abort.request.client_id, abort.request.request_no)
            asked = self._client_requests.pop(key, None) is not None
            if asked or self.clients.answers_all:
                self.clients.abort(self.name, abort.request, abort.reason)
        if ready.reads:
            self._reads.extend(ready.reads)
        if self._reads:
            self._serve_reads(replica)
        # 5. Report durability.
        if persists:
            done = _PERSISTED_TWIN()  # `Persisted(number=ready.number)`, as in `deliver`
            done.number = ready.number
            done.__class__ = Persisted
            self._inputs.append(done)
        if committed:
            # The replica layer checkpoints synchronously (inline writer) and compacts the WAL
            # once the checkpoint is durable; the core learns of it after this Ready.
            self._inputs.extend(replica.poll())
        # 6. Hand the checker what it observes; maybe crash right here (BUGGIFY).
        observed = self.observe(core)
        if observed != self._observed:
            # (Equal: nothing the checker looks at moved since the last call in this
            # incarnation, so both checks would find what they found then; violations are
            # recorded once.)
            self._observed = observed
            role, term, commit = observed
            at = self.loop.now
            checker = self.checker
            checker.observe_role(name, role=role, term=term, log=self.log, at_ns=at)
            checker.observe_commit(name, incarnation=self.incarnation, commit=commit, at_ns=at)
        if persists and self.crash_point is not None and self.crash_point(self, ready):
            self.crash(lose_unfsynced=False)

    def _serve_reads(self, replica: Replica) -> None:
        applied = replica.applied_index
        waiting: list[ReadState] = []
        for read in self._reads:
            if read.index <= applied:
                request = read.request
                self._answer(
                    request.client_id, request.request_no, replica.query(request.command)
                )
            else:
                waiting.append(read)
        self._reads = waiting

    def _answer(self, client_id: str, request_no: int, result: bytes) -> None:
        asked = self._client_requests.pop((client_id, request_no), None) is not None
        if asked or self.clients.answers_all:
            self.clients.answer(self.name, client_id, request_no, result)

"""What the simulator needs to know about a protocol: how to build a core from durable
state, the replica layer over the KV app, the codec, and how to observe a core cheaply.

Owns: `ProtocolSetup` (what a protocol's `ProtocolSpec.sim` function returns) and
`protocol_setup(name, ...)`, which looks the protocol up in the registry
(`phalanx.protocols`). The setups themselves live beside the protocols' other simulator
parts (`phalanx.jepsen.sim.raft`, `phalanx.jepsen.sim.pbft`).

Also owns `durable_ready(ready, hard)`, the Ready a durable-record wrapper hands the node
(PBFT's `DurableStateCore`, the leaderless `_DurableCell`): once per step, so built through
`Ready`'s layout twin rather than `dataclasses.replace`.

Rules: imports no concrete core. Observation reads attributes instead of `status()` on the
hot path (status builds a dataclass per call), and must not change the core.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from phalanx.apps.interface import StateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus._fastpath import READY_TWIN
from phalanx.consensus.core import Core, Input, Ready
from phalanx.consensus.types import (
    ClientRequest,
    HardState,
    Message,
)
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.net.codec import Registry
from phalanx.protocols import get as get_protocol
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage

if TYPE_CHECKING:
    from phalanx.jepsen.sim.loop import EventLoop
    from phalanx.jepsen.sim.node import SimNode

Observation = tuple[str, int, int]
"""(role, term, commit index) of a core."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolSetup:
    """A protocol's simulator parts. A node's incarnation is built by `make_replica` first,
    then `make_core` (`SimNode`'s order, which every driver of a setup keeps): a core may
    read its replica (the leaderless core reads the applied versions through it)."""

    names: tuple[str, ...]
    codec: Registry
    make_core: Callable[[str, DurableState, random.Random], Core]
    make_replica: Callable[[str, Storage, DurableState], Replica]
    observe: Callable[[Core], Observation]
    leader_role: str
    checker: InvariantChecker | None = None
    """The protocol's own checker (PBFT: agreement over batches, validity); default Raft's."""
    replies: ReplyFilter | None = None
    """BFT clients: where requests go (`targets`), results need f+1 matching replies."""
    byzantine: tuple[str, ...] = ()
    """Nodes that may lie: their executions are not checked (a throwaway checker)."""
    description: str = ""
    recovers_lost_disk: bool = False
    """The core has a recovery mode for a node that lost its disk (`DurableState.recovering`):
    the `lose-disk` fault wipes a node's disk only then (else it is a plain kill)."""
    watch_send: Callable[[str, str, Message], str | None] | None = None
    watch_types: frozenset[type] | None = None
    """The message classes `watch_send` can object to (None: every class); others skip it."""
    """A white-box check of every message a node sends (state kept per run): returns the
    text of a violated protocol invariant, or None. Raft's: one vote per term per voter."""
    client_request: Callable[[str, int, bytes], ClientRequest] | None = None
    """How this protocol's client sends app `command` as request `request_no` of
    `client_id` (`client_request(client_id, request_no, command)`), for a harness that
    issues bare app commands (the conformance suite); None: a plain `ClientRequest`. The
    leaderless setup's signs a transaction (`phalanx.jepsen.sim.leaderless`)."""
    submit_batch: Callable[[tuple[ClientRequest, ...]], Input] | None = None
    """The input that steps several client writes at once, as the runtime's `propose_batch`
    does for the writes of one driver pass (the leaderless core's `SubmitBatch`: their
    endorsements under one signature), or None (one `Submit` each). The CPU model uses it
    for the client requests a busy node finds waiting (`SimNetwork.local`)."""
    workload: Callable[[WorkloadEnv], SimWorkload] | None = None
    """The protocol's own clients and end-of-run checks, replacing the register clients,
    the final reads and the linearizability check (the leaderless core: signed
    transactions, an eventually consistent model). Every node then answers every
    transaction it applies or aborts (`answers_all`)."""
    deadline_clock: bool = False
    """The protocol's `ProtocolSpec.deadline_clock` (set by `protocol_setup`): its nodes step a
    fresh `Tick` first on resume (`SimNode.fresh_clock`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadEnv:
    """What a protocol's workload (`ProtocolSetup.workload`) sees of one run."""

    loop: EventLoop
    rng: random.Random
    trace: Callable[[str], None]
    nodes: Mapping[str, SimNode]
    submit: Callable[[str, ClientRequest], None]
    """Deliver a request to a node after the client's latency (dropped if it is down)."""
    clients: int
    keys: int


class SimWorkload(Protocol):
    """A protocol's own clients and checks (see `ProtocolSetup.workload`). `run` starts it
    once the nodes booted, stops it halfway through the liveness window (`final_ns`: the end
    of the run) and calls `check` at the end."""

    @property
    def ok(self) -> int: ...

    @property
    def infos(self) -> int: ...

    def start(self) -> None: ...

    def stop(self, final_ns: int) -> None: ...

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None: ...

    def abort(self, node: str, client_id: str, request_no: int) -> None: ...

    def check(self) -> list[str]:
        """The violations found after quiescence (empty when the run is correct)."""
        ...

    def commit_latencies_ns(self) -> tuple[int, ...]:
        """Each committed operation's time from issue to the client's decision (virtual
        ns), in issue order (benches)."""
        ...

    def commit_times_ns(self) -> tuple[tuple[int, int], ...]:
        """Each committed operation's (issue, decision) virtual times, in the order of
        `commit_latencies_ns` (benches that measure a window of the run)."""
        ...


class ReplyFilter(Protocol):
    """The client side of a BFT protocol (see `phalanx.jepsen.sim.pbft.BftReplies`)."""

    def record(self, request: ClientRequest) -> None:
        """A client issued `request`."""
        ...

    def targets(self, request: ClientRequest, claims: Sequence[str | None]) -> tuple[str, ...]:
        """The replicas to send `request` to, given each replica's claim of who is primary."""
        ...

    def reply(self, node: str, client_id: str, request_no: int, result: bytes) -> bytes | None:
        """Feed one replica's reply; the accepted result exactly once, else None."""
        ...


Knobs = tuple[tuple[str, int | bool | str], ...]
"""Protocol tuning chosen per seed (swarm testing), as sorted `(name, value)` pairs: the
protocol's own config fields (e.g. Raft's `pre_vote`) plus `checkpoint_every`; `phalanx sim
--set NAME=VALUE` fixes one on every seed (a str value, e.g. the leaderless core's
`stuck_resolution=pbft`, only where the protocol's field is a str)."""


def protocol_setup(
    name: str,
    *,
    bugs: frozenset[str],
    nodes: int,
    checkpoint_every: int = 200,
    knobs: Knobs = (),
    seed: int = 0,
    byzantine: int = 0,
    twins: int = 0,
    app: str = "",
) -> ProtocolSetup:
    """The setup of protocol `name` (its `ProtocolSpec.sim`) for a cluster of `nodes`
    replicas `n1..nN`.

    `app` ("": the KV store) names your own state machine (``FILE.py:FACTORY`` or
    ``MODULE:FACTORY``): the replicas run it and its own clients drive it
    (`phalanx.jepsen.sim.app_clients`).

    `knobs` override configuration fields of the protocol (unknown names raise TypeError:
    our own misuse) and `checkpoint_every`. `byzantine` replicas lie with seeded behaviours
    and `twins` replicas are twinned, on a protocol that tolerates Byzantine replicas.

    Raises:
        UnknownProtocol: no protocol of that name is registered.
        ValueError: Byzantine replicas asked of a protocol that does not tolerate them; an
            app that will not load, cannot be tested or cannot run on this protocol.
    """
    spec = get_protocol(name)
    if (byzantine or twins) and spec.byzantine is None:
        raise ValueError(f"protocol {name!r} does not tolerate Byzantine replicas")
    setup: SimSetup = spec.sim.load()
    if not app:
        built = setup(nodes=nodes, bugs=bugs, checkpoint_every=checkpoint_every, knobs=knobs,
                      seed=seed, byzantine=byzantine, twins=twins)
        return replace(built, deadline_clock=spec.deadline_clock)
    from phalanx.appspec.custom import machine_factory
    from phalanx.appspec.spec import AppConfigError
    from phalanx.jepsen.sim.app_clients import app_setup

    try:
        machine = machine_factory(app)
    except AppConfigError as e:
        raise ValueError(str(e)) from None
    built = app_setup(setup(nodes=nodes, bugs=bugs, checkpoint_every=checkpoint_every,
                            knobs=knobs, seed=seed, byzantine=byzantine, twins=twins,
                            machine=machine), machine, app)
    return replace(built, deadline_clock=spec.deadline_clock)


class SimSetup(Protocol):
    """The signature of a `ProtocolSpec.sim` function (see `protocol_setup`)."""

    def __call__(self, *, nodes: int, bugs: frozenset[str], checkpoint_every: int,
                 knobs: Knobs, seed: int, byzantine: int, twins: int,
                 machine: Callable[[], StateMachine] | None = None) -> ProtocolSetup:
        """`machine`: a fresh state machine for a replica (None: the KV store); a setup
        whose protocol cannot run an arbitrary machine raises ValueError."""
        ...


_READY_FIELDS = ("number", "early_messages", "snapshot", "truncate_from", "entries",
                 "hard_state", "must_sync", "messages", "committed", "reads", "rejected",
                 "core_state", "aborted")
if tuple(f.name for f in dataclasses.fields(Ready)) != _READY_FIELDS:  # pragma: no cover
    raise TypeError("Ready's fields changed: update durable_ready")


def durable_ready(ready: Ready, hard: HardState) -> Ready:
    """``dataclasses.replace(ready, core_state=None, hard_state=hard, must_sync=True)``:
    the same object, built through `Ready`'s layout twin (~4x cheaper; a wrapper that keeps
    the core's record itself does this on every step)."""
    out = READY_TWIN()
    out.number = ready.number
    out.early_messages = ready.early_messages
    out.snapshot = ready.snapshot
    out.truncate_from = ready.truncate_from
    out.entries = ready.entries
    out.hard_state = hard
    out.must_sync = True
    out.messages = ready.messages
    out.committed = ready.committed
    out.reads = ready.reads
    out.rejected = ready.rejected
    out.core_state = None
    out.aborted = ready.aborted
    out.__class__ = Ready
    return out  # type: ignore[no-any-return]

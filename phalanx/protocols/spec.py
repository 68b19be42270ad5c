"""What the rest of phalanx knows about a protocol: `ProtocolSpec`, one per protocol.

Owns: `ProtocolSpec` (the registry entry), `FaultModel`, `CallStrategy`, and the interfaces
the runtime (`ProtocolNode`) and the node's Byzantine modes (`ByzantineSupport`) load through
it. The runtime, the client, the CLI, the simulator, the harness and the benches decide
everything protocol-specific from a spec, never by comparing protocol names.

Invariants: importing this module (and a spec) is cheap: no core, trio, TLS or harness is
imported until a lazy reference (`Lazy`) is resolved, so the client and the CLI's parsers
read specs without loading any core. A spec is immutable.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import random

    from phalanx.apps.interface import StateMachine
    from phalanx.apps.replica import CheckpointPolicy, Replica
    from phalanx.apps.transactions import TransactionLayer
    from phalanx.consensus.core import Core, Ready
    from phalanx.consensus.types import ClientRequest, Message
    from phalanx.ops.node_config import NodeConfig
    from phalanx.runtime.persistence import DurableState, StateJournal
    from phalanx.storage.interface import SyncPolicy

T = TypeVar("T")


class FaultModel(enum.Enum):
    """What the protocol tolerates: f crashed nodes of n = 2f+1, or f Byzantine of n = 3f+1."""

    CRASH = "crash"
    BYZANTINE = "byzantine"

    def max_faults(self, n: int) -> int:
        """f for a cluster of `n` nodes."""
        return (n - 1) // 2 if self is FaultModel.CRASH else (n - 1) // 3

    def nodes_for(self, f: int) -> int:
        """The smallest cluster that tolerates `f` faults."""
        return 2 * f + 1 if self is FaultModel.CRASH else 3 * f + 1


class CallStrategy(enum.Enum):
    """How a client calls the cluster.

    LEADER: send to the node believed to lead, follow REDIRECT hints, rotate on failure; one
    reply is the answer. MATCHING_REPLIES: send to the node that orders (or every node),
    accept a result once f+1 distinct nodes return the same one (nodes subscribe the client
    with a `ClientHello` so backups answer requests they did not receive). ENDORSEMENT: see
    the member."""

    LEADER = "leader"
    MATCHING_REPLIES = "matching-replies"
    ENDORSEMENT = "endorsement"
    """The leaderless core: the client signs each request as a
    `phalanx.consensus.leaderless.messages.Transaction` (its key from the cluster's client
    keyring, an absolute deadline), sends it to every node, and accepts f+1 matching results,
    or fails it on f+1 ABORTED replies."""


class ProposerRule(enum.Enum):
    """Who proposed a committed entry, as every replica can tell from the entry alone (the
    `BatchInfo.proposer` of an app's blocks)."""

    NONE = "none"
    """Not derivable: the proposer is "" (Raft: a term's leader is not a function of the
    term; PBFT: a replica records the view it saw the commit in, which can differ between
    replicas across a view change)."""
    TERM_ROUND_ROBIN = "term-round-robin"
    """The entry's term names it: the sorted members' ``term % n``-th (a protocol whose
    entries carry the agreed proposing view)."""


@dataclass(frozen=True, slots=True)
class Lazy(Generic[T]):
    """A ``"module:attribute"`` reference, imported on first `load()` (keeps specs cheap)."""

    target: str

    def load(self) -> T:
        module, _, attr = self.target.partition(":")
        value: T = getattr(importlib.import_module(module), attr)
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltCore:
    """A node's core and how the driver feeds it.

    Attributes:
        core: the core (possibly a Byzantine wrapper).
        propose_batch: steps several client writes at once, or None (Submit each).
        lazy: which outgoing messages the driver may hold until the next message to the same
            peer or the next tick (pure commit notices), or None.
        supersedes: whether a new message to a peer makes a held one redundant (dropped).
    """

    core: Core
    propose_batch: Callable[[tuple[ClientRequest, ...]], Ready] | None = None
    lazy: Callable[[Message], bool] | None = None
    supersedes: Callable[[Message, Message], bool] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PieceCarrier:
    """`message` carries the checkpoint at index `getattr(m, index_field)` as
    `getattr(m, data_field)` (bytes), and is a frozen dataclass (`dataclasses.replace`)."""

    message: type
    index_field: str
    data_field: str


class ProtocolError(Exception):
    """This configuration cannot run (missing keys, a Byzantine mode the protocol lacks...)."""


class CoreStateStore(Protocol):
    """Where `Ready.core_state` is persisted for a protocol that has one."""

    store: StateJournal

    def close(self) -> None: ...


class ProtocolNode(Protocol):
    """The runtime half of a protocol (`ProtocolSpec.node`): what `phalanx.runtime.node`
    needs to assemble a node. Loaded only by a node, the simulator or a test."""

    def build_core(self, config: NodeConfig, *, durable: DurableState, rng: random.Random,
                   byzantine: str | None, pipeline_depth: int,
                   replica: Replica | None = None) -> BuiltCore:
        """The core of node `config`, restored from `durable` (raises `ProtocolError`).

        `replica` is the node's replica, already restored from its newest checkpoint: a core
        that reads application state (the leaderless core, through an `AppView`) keeps it;
        the others ignore it. The runtime and the simulator pass it."""
        ...

    def checkpoint_policy(self, config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
        """When the replica checkpoints (a protocol may need fixed intervals)."""
        ...

    def open_core_state_store(self, config: NodeConfig,
                              sync: SyncPolicy) -> CoreStateStore | None:
        """The store of `Ready.core_state`, or None when the protocol keeps none."""
        ...


@runtime_checkable
class TransactionalNode(Protocol):
    """A `ProtocolNode` whose replicas run in transaction mode (`Replica(transactions=)`):
    its core applies non-conflicting transactions in different orders on different
    replicas, so the replica deduplicates by transaction id instead of by session. Its
    core writes only committed entries to the log, so a restarting node replays the whole
    WAL into the replica before the core is built (the core re-releases what its record
    holds; the replica drops those it applied). The runtime checks for it with
    ``isinstance``; others use the session rule."""

    def transaction_layer(self, config: NodeConfig) -> TransactionLayer:
        """How the node's replica reads a command as a transaction."""
        ...


class ByzantineSupport(Protocol):
    """Deliberately faulty replicas for tests and demos (`ProtocolSpec.byzantine`)."""

    modes: tuple[str, ...]

    def wrap_core(self, core: Core, mode: str, *, config: NodeConfig,
                  rng: random.Random) -> Core:
        """`core`, lying as `mode` says (or unchanged when the mode lies elsewhere)."""
        ...

    def wrap_machine(self, machine: StateMachine, mode: str,
                     rng: random.Random) -> StateMachine:
        """`machine`, answering clients wrongly when `mode` says so (else unchanged)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolSpec:
    """Everything the rest of phalanx decides per protocol (one registry entry).

    Attributes:
        name: the `--protocol` and config value.
        summary: one line for `--help` listings.
        fault_model: crash or Byzantine faults (cluster sizes, f, what the harness waits for).
        call_strategy: how clients call (`CallStrategy`).
        leader_role: the status role of the node that orders requests ("leader",
            "primary"); the harness and the demos wait for one.
        roles: every role `status()` may report.
        messages: the protocol's wire types, ``{type_id: class}`` in its reserved range of
            `phalanx.net.wire` (registered by the runtime; the conformance suite fuzzes them).
        signing_keys: `cluster init` creates a signing key per node (and every config carries
            every peer's public keys); the node refuses to start without its key.
        node: the runtime half (`ProtocolNode`), loaded when a node or the simulator runs.
        sim: the simulator setup, a function with the signature of
            `phalanx.jepsen.sim.protocols.protocol_setup` without the name.
        sim_knobs: per knob the values a swarm-testing seed draws from (simulator).
        sim_bugs: the names of the core's deliberate bugs (`phalanx sim --bug`), which the
            simulator's sweeps must catch.
        sim_fault_kinds: the opt-in fault kinds (`phalanx.jepsen.nemesis.OPT_IN_FAULT_KINDS`)
            its simulator setup and runtime interpret: "membership" needs `node` to have
            ``admin_input`` and `sim` to take the ``spares`` knob (spare nodes outside the
            bootstrap configuration); `phalanx jepsen run --nemesis membership` likewise.
        byzantine: Byzantine behaviours (`ByzantineSupport`), loaded only when asked for;
            None when the protocol cannot tolerate them.
        byzantine_modes: their names (for `--byzantine` choices without loading them).
        demo: `phalanx demo --protocol NAME`'s entry point (``main(args) -> int``), if any.
    """

    name: str
    summary: str
    fault_model: FaultModel
    call_strategy: CallStrategy
    leader_role: str
    roles: tuple[str, ...]
    messages: Lazy[Mapping[int, type]]
    node: Lazy[ProtocolNode]
    sim: Lazy[Callable[..., Any]]
    signing_keys: bool = False
    sim_knobs: tuple[tuple[str, tuple[int | bool, ...]], ...] = ()
    sim_bugs: Lazy[Collection[str]] | None = None
    sim_fault_kinds: tuple[str, ...] = ()
    byzantine: Lazy[ByzantineSupport] | None = None
    byzantine_modes: tuple[str, ...] = ()
    demo: Lazy[Callable[..., int]] | None = None
    proposer_rule: ProposerRule = ProposerRule.NONE
    """How an entry's proposer follows from its term (`proposer_of`)."""
    piece_carrier: Lazy[PieceCarrier] | None = None
    """The protocol message that carries checkpoint data to a peer whose core checks it
    against a certified digest (PBFT's `CheckpointData`): the runtime sends a piece manifest
    in its place and hands the core the bytes assembled from checked pieces fetched from
    every peer (`phalanx.runtime.piece_carrier`); the core's own check is unchanged."""
    deadline_clock: bool = False
    """The core compares its wall-clock reading (`Tick.now_ms`) with absolute deadlines (the
    leaderless core): after a gap in its ticks (a paused process, a stalled loop) the runtime
    steps a `Tick` with the current time before the inputs that queued meanwhile
    (`phalanx.runtime.fresh_clock`), and the simulator does on `resume`. Cores that count
    ticks leave it False: their inputs and traces are untouched."""
    piece_transfer: bool = False
    """The core relays checkpoint data to peers unread (Raft's InstallSnapshot): the runtime
    hands it a piece manifest instead, and a follower fetches only the pieces it lacks, from
    every peer (`phalanx.runtime.piece_transfer`). A core that reads or digests the data
    (PBFT's checkpoint votes) must leave it False."""

    def proposer_of(self, term: int, nodes: Sequence[str]) -> str:
        """The proposer of a committed entry of `term` in a cluster of `nodes`, identical on
        every replica; "" when the protocol cannot tell (`ProposerRule.NONE`)."""
        if self.proposer_rule is ProposerRule.TERM_ROUND_ROBIN and nodes:
            ordered = sorted(nodes)
            return ordered[term % len(ordered)]
        return ""

    def proposer_function(self, nodes: Sequence[str]) -> Callable[[int], str]:
        """`proposer_of` bound to `nodes` (what `phalanx.apps.replica.Replica` takes)."""
        members = tuple(nodes)
        return lambda term: self.proposer_of(term, members)

    @property
    def default_nodes(self) -> int:
        """The smallest cluster that tolerates one fault (3 crash, 4 Byzantine)."""
        return self.fault_model.nodes_for(1)

    def max_faults(self, n: int) -> int:
        return self.fault_model.max_faults(n)

    def size_problem(self, n: int) -> str | None:
        """Why `n` nodes cannot run this protocol as intended (Byzantine: n = 3f+1), or None."""
        if self.fault_model is FaultModel.BYZANTINE and (n < 4 or (n - 1) % 3):
            return f"a {self.name} cluster needs n = 3f+1 nodes (4, 7, ...), got {n}"
        return None

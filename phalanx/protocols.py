"""Which consensus core a node runs: the per-protocol half of assembling a node.

Owns: `build_core` (the core for a `NodeConfig` and its durable state: Raft, or PBFT with
its Ed25519 keys, optionally wrapped in a Byzantine mode), `register_codecs`,
`checkpoint_policy` (PBFT checkpoints every K sequence numbers, which the core's water marks
depend on), `open_core_state_store` (where PBFT's `Ready.core_state` lives),
`BYZANTINE_MODES` and `CorruptingMachine` (the ``corrupt_reply`` mode's state machine).

PBFT runtime semantics (what the driver does with a PBFT core, unchanged from Raft's
driver): every replica executes committed batches and answers its own waiters with status
OK and the result; the client accepts a result once f+1 replicas agree. There is no
REDIRECT (backups forward requests to the primary inside the core). Read-only requests with
linearizable consistency are ordered like writes (a batch member whose `read_only` makes
the replica answer from `query` at that point of the order): the simplest correct choice;
stale reads are answered locally like under Raft. `core_state` is persisted (synced)
before a Ready's messages leave (its early messages, the replica's own pre-prepares and
prepares, leave at once: the core's restart fence makes that safe, see
`phalanx.consensus.pbft.safety`); a restart passes `PbftRestoredState` built from it and the
newest checkpoint.

Byzantine modes (`phalanx node run CONFIG --byzantine MODE`, tests and the demo only):
the `phalanx.jepsen.byzantine.ByzantineCore` behaviours, unchanged. ``corrupt_reply``
leaves the core honest and wraps the state machine so the node answers clients wrong
results (its own state, and so its checkpoints, diverge: the f+1 rule and the honest 2f+1
must cope with both).

Must not import: `phalanx.runtime.node`, `phalanx.runtime.driver`, trio, sockets.
Determinism: every random choice comes from the injected `random.Random`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.apps.interface import StateMachine, StateSnapshot
from phalanx.apps.replica import CheckpointPolicy
from phalanx.consensus.core import Core, Ready, Snapshot
from phalanx.consensus.pbft import (
    PBFT_MESSAGES,
    PbftConfig,
    PbftCore,
    PbftDurableState,
    PbftRestoredState,
)
from phalanx.consensus.pbft.durable import PbftDeltaRules
from phalanx.consensus.raft import (
    RAFT_MESSAGES,
    ProposeBatch,
    RaftConfig,
    RaftCore,
    RaftRestoredState,
)
from phalanx.consensus.types import ClientRequest, HardState, NodeId
from phalanx.jepsen.byzantine import BEHAVIOURS, ByzantineCore, corrupt_result
from phalanx.net import client_protocol, wire
from phalanx.ops.node_config import NodeConfig
from phalanx.ops.signing_keys import PbftKeyError, load_crypto
from phalanx.runtime.persistence import DurableState, StateJournal
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import SyncPolicy

BYZANTINE_MODES: tuple[str, ...] = BEHAVIOURS
"""Names accepted by `--byzantine` (see `phalanx.jepsen.byzantine`)."""

PBFT_CHECKPOINT_INTERVAL = 64
"""K: sequence numbers between PBFT checkpoints (water marks span 2K). Bounded so the
message log stays small whatever `[checkpoint] every_entries` says."""

IDLE_CHECKPOINT_TICKS = 500
"""Raft: checkpoint after ~5 s of idle ticks (at the default 10 ms tick) if a quarter of a
trigger's worth was applied since the last one (`CheckpointPolicy.idle_calls`). PBFT never:
its checkpoints must fall on multiples of K."""

PBFT_BATCH_SIZE = 64
"""Requests per pre-prepare once that many are waiting at the primary (else the batching
rule below decides)."""

PBFT_MAX_INFLIGHT_BATCHES = 1
"""A partial batch is proposed at once only while none of the primary's batches is in
flight; otherwise requests accumulate until it executes, or `PBFT_BATCH_TICKS` pass.
Fewer, bigger batches: a batch's fixed cost (about 24 peer messages, 8 Ed25519
verifications, 4 signatures and one fsync per replica at n=4) dominates a request's.
Measured at 64 clients (4 replicas, load 7-9, same-window A/B): 1 in flight and 4 ticks
gave batches of 22-30 requests and 0.18-0.23 ms of CPU per request per replica, against
12-13 requests and 0.27-0.32 ms with 2 in flight and 1 tick (the tick cut a batch every
10 ms whatever the pipeline held); at 16 clients 448-506 against 263-340 writes/s. A
single client's next request waits at most until the primary executes the previous one
(it already has f+1 replies, usually the primary's among them). Once a batch executes, the
primary also waits for the callers it answered to come back, for at most two ticks
(`consensus.pbft.requests.RequestBook.served`): at 64 clients batches then hold 64
requests instead of 24-31."""

PBFT_BATCH_TICKS = 4
"""Ticks a pending request waits at most while a batch is in flight (40 ms at the default
10 ms tick; a slow batch does not hold the next one longer)."""


class ProtocolError(Exception):
    """This configuration cannot run (missing keys, a Byzantine mode on Raft, ...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltCore:
    """A node's core and how the driver feeds it.

    Attributes:
        core: the core (possibly a Byzantine wrapper).
        propose_batch: steps several client writes at once (Raft), or None (Submit each).
    """

    core: Core
    propose_batch: Callable[[tuple[ClientRequest, ...]], Ready] | None


def register_codecs(protocol: str) -> None:
    """Register the wire types of `protocol` (and the client protocol) with the codec."""
    wire.register_all(PBFT_MESSAGES if protocol == "pbft" else RAFT_MESSAGES)
    client_protocol.register()


def checkpoint_policy(config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
    """The replica's checkpoint policy: PBFT's must be every K executed sequence numbers."""
    if config.protocol == "pbft":
        return CheckpointPolicy(every_entries=pbft_checkpoint_interval(config), every_bytes=0,
                                compact_lag=0, aligned=True)
    return CheckpointPolicy(every_entries=config.checkpoint.every_entries,
                            every_bytes=config.checkpoint.every_bytes, compact_lag=compact_lag,
                            idle_calls=IDLE_CHECKPOINT_TICKS)


def pbft_checkpoint_interval(config: NodeConfig) -> int:
    return min(config.checkpoint.every_entries, PBFT_CHECKPOINT_INTERVAL)


class CoreStateStore:
    """PBFT's `core_state` journal (`DATA/pbft/journal`, one fsync per save; an older
    `DATA/pbft/hardstate` is read once as its start): a `StateJournal` plus `close`."""

    def __init__(self, config: NodeConfig, sync: SyncPolicy) -> None:
        self._directory = OsDirectory(str(config.data_dir / "pbft"))
        self.store = StateJournal(self._directory, codec=wire.default_registry(),
                                  rules=PbftDeltaRules(), sync=sync)

    def close(self) -> None:
        self._directory.close()


def open_core_state_store(config: NodeConfig, sync: SyncPolicy) -> CoreStateStore | None:
    """The store for `Ready.core_state` (PBFT), or None (Raft keeps none)."""
    return CoreStateStore(config, sync) if config.protocol == "pbft" else None


def pbft_config(config: NodeConfig) -> PbftConfig:
    """PBFT parameters from the node's config (timing scales with `election_ticks`)."""
    k = pbft_checkpoint_interval(config)
    view_change = max(20, 5 * config.timing.election_ticks)
    return PbftConfig(
        node_id=NodeId(config.id),
        replicas=tuple(NodeId(m) for m in config.members()),
        checkpoint_interval=k,
        log_window=2 * k,
        batch_size=PBFT_BATCH_SIZE,
        batch_ticks=PBFT_BATCH_TICKS,
        max_inflight_batches=PBFT_MAX_INFLIGHT_BATCHES,
        # Clients send to the primary alone and to every replica only on a retransmission
        # (or while they do not know the primary): a backup relays a request the primary has
        # not put in a pre-prepare after a quarter of the view-change timeout (a loaded
        # primary takes tens of ms per round; relaying at once would double its inbound
        # requests whenever clients retransmit to a primary that is merely slow).
        forward_ticks=max(3, view_change // 4),
        view_change_ticks=view_change,
        max_view_change_ticks=64 * view_change,
        fetch_ticks=max(10, 2 * config.timing.election_ticks),
        max_pending=8192,
    )


def build_core(
    config: NodeConfig,
    *,
    durable: DurableState,
    rng: random.Random,
    byzantine: str | None = None,
    raft_max_inflight: int = 2,
) -> BuiltCore:
    """The core of node `config`, restored from `durable`.

    Raises:
        ProtocolError: a Byzantine mode on a Raft node, an unknown mode, bad PBFT keys, or
            a durable core state of the wrong type (disk from another protocol).
    """
    if byzantine is not None and byzantine not in BYZANTINE_MODES:
        raise ProtocolError(f"unknown Byzantine mode {byzantine!r}; choose from "
                            f"{', '.join(BYZANTINE_MODES)}")
    if config.protocol == "raft":
        if byzantine is not None:
            raise ProtocolError(f"--byzantine {byzantine}: Byzantine modes need a PBFT "
                                "cluster; this node runs raft")
        return _raft(config, durable, rng, raft_max_inflight)
    if config.protocol == "pbft":
        return _pbft(config, durable, rng, byzantine)
    raise ProtocolError(f"unsupported protocol {config.protocol!r}")


def _raft(config: NodeConfig, durable: DurableState, rng: random.Random,
          max_inflight: int) -> BuiltCore:
    voters = tuple(NodeId(m) for m in config.members())
    snapshot = None
    if durable.snapshot is not None and durable.snapshot_data is not None:
        snapshot = Snapshot(meta=durable.snapshot, data=durable.snapshot_data)
    core = RaftCore(
        RaftConfig(node_id=NodeId(config.id), voters=voters,
                   election_ticks=config.timing.election_ticks,
                   heartbeat_ticks=config.timing.heartbeat_ticks,
                   max_inflight=max_inflight),
        rng=rng,
        restored=RaftRestoredState(hard_state=durable.hard_state or HardState(),
                                   snapshot=snapshot, entries=durable.entries,
                                   recovering=durable.recovering),
    )

    def propose_batch(requests: tuple[ClientRequest, ...]) -> Ready:
        return core.step(ProposeBatch(requests=requests))

    return BuiltCore(core=core, propose_batch=propose_batch)


def _pbft(config: NodeConfig, durable: DurableState, rng: random.Random,
          byzantine: str | None) -> BuiltCore:
    try:
        crypto = load_crypto(config)
    except PbftKeyError as e:
        raise ProtocolError(str(e)) from None
    state = durable.core_state
    if state is None:
        state = PbftDurableState()
    elif not isinstance(state, PbftDurableState):
        raise ProtocolError(f"{config.data_dir}: the stored core state is a "
                            f"{type(state).__name__}, not PBFT's")
    restored = PbftRestoredState(
        durable=state,
        executed=durable.snapshot.index if durable.snapshot is not None else 0,
        checkpoint_data=durable.snapshot_bytes(),
    )
    core: Core = PbftCore(pbft_config(config), crypto=crypto, restored=restored)
    if byzantine is not None:
        core = ByzantineCore(core, behaviours=(byzantine,), crypto=crypto,
                             rng=random.Random(rng.getrandbits(64)))
    return BuiltCore(core=core, propose_batch=None)


class CorruptingMachine:
    """The ``corrupt_reply`` mode: `inner`'s state, wrong results (`corrupt_result`)."""

    def __init__(self, inner: StateMachine, rng: random.Random) -> None:
        self.inner = inner
        self._rng = rng
        self.corrupted = 0

    def apply(self, command: bytes) -> bytes:
        self.corrupted += 1
        return corrupt_result(self.inner.apply(command), self._rng)

    def query(self, request: bytes) -> bytes:
        self.corrupted += 1
        return corrupt_result(self.inner.query(request), self._rng)

    def snapshot(self) -> StateSnapshot:
        return self.inner.snapshot()

    def restore(self, data: bytes) -> None:
        self.inner.restore(data)


def node_state_machine(machine: StateMachine, byzantine: str | None,
                       rng: random.Random) -> StateMachine:
    """`machine`, wrapped when the Byzantine mode lies to clients."""
    if byzantine == "corrupt_reply":
        return CorruptingMachine(machine, random.Random(rng.getrandbits(64)))
    return machine

"""PBFT's runtime half (`phalanx.protocols.builtin.PBFT.node`): how a real node builds and
feeds a PBFT core.

Owns: `PBFT_NODE` (a `phalanx.protocols.spec.ProtocolNode`), PBFT's parameters from a node
config (`pbft_config`), its checkpoint policy (every K executed sequence numbers, which the
core's water marks depend on) and its `core_state` journal (`DATA/pbft/journal`).

Runtime semantics (what the driver does with a PBFT core, unchanged from Raft's driver):
every replica executes committed batches and answers its own waiters with status OK and
the result; the client accepts a result once f+1 replicas agree. There is no REDIRECT
(backups forward requests to the primary inside the core). Read-only requests with
linearizable consistency are ordered like writes (a batch member whose `read_only` makes
the replica answer from `query` at that point of the order); stale reads are answered
locally. `core_state` is persisted (synced) before a Ready's messages leave (its early
messages, the replica's own pre-prepares and prepares, leave at once: the core's restart
fence makes that safe, see `phalanx.consensus.pbft.safety`); a restart passes
`PbftRestoredState` built from it and the newest checkpoint.

Byzantine modes are applied by the node through `ProtocolSpec.byzantine`
(`phalanx.jepsen.byzantine.PBFT_BYZANTINE`), imported only when one is asked for.

Must not import: `phalanx.runtime.node`, `phalanx.runtime.driver`, trio, sockets, jepsen.
"""

from __future__ import annotations

import dataclasses
import random

from phalanx.apps.checkpoint_digest import digest_function
from phalanx.apps.interface import wants_block_stamp
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core
from phalanx.consensus.pbft import (
    PbftConfig,
    PbftCore,
    PbftDurableState,
    PbftRestoredState,
)
from phalanx.consensus.pbft.durable import PbftDeltaRules
from phalanx.consensus.pbft.messages import CheckpointData
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.ops.node_config import NodeConfig
from phalanx.ops.signing_keys import SigningKeyError, load_crypto
from phalanx.protocols.spec import BuiltCore, PieceCarrier, ProtocolError
from phalanx.runtime.persistence import DurableState, StateJournal
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import SyncPolicy

PBFT_CHECKPOINT_INTERVAL = 64
"""K: sequence numbers between PBFT checkpoints (water marks span 2K). Bounded so the
message log stays small whatever `[checkpoint] every_entries` says. No idle checkpoints:
they must fall on multiples of K."""

PBFT_BATCH_SIZE = 64
"""Requests per pre-prepare once that many are waiting at the primary (else the batching
rule below decides)."""

PBFT_MAX_INFLIGHT_BATCHES = 1
"""A partial batch is proposed at once only while none of the primary's batches is in
flight; otherwise requests accumulate until it executes, or `PBFT_BATCH_TICKS` pass.
Fewer, bigger batches: a batch's fixed cost (about 24 peer messages, 8 Ed25519
verifications, 4 signatures and one fsync per replica at n=4) dominates a request's
(docs/BENCHMARKS.md, design measurements). Once a batch executes, the primary also waits for the
callers it answered to come back, for at most two ticks
(`consensus.pbft.requests.RequestBook.served`)."""

PBFT_BLOCK_STAMP_SKEW_MS = 2000
"""For an app that asks for block time (`wants_block_stamp`): a backup refuses a
pre-prepare whose timestamp is more than this far from its own clock (`stamp.py`)."""

PBFT_BATCH_TICKS = 4
"""Ticks a pending request waits at most while a batch is in flight (40 ms at the default
10 ms tick; a slow batch does not hold the next one longer)."""


class CoreStateJournal:
    """PBFT's `core_state` journal (`DATA/pbft/journal`, one fsync per save; an older
    `DATA/pbft/hardstate` is read once as its start): a `StateJournal` plus `close`."""

    def __init__(self, config: NodeConfig, sync: SyncPolicy) -> None:
        self._directory = OsDirectory(str(config.data_dir / "pbft"))
        self.store = StateJournal(self._directory, codec=wire.default_registry(),
                                  rules=PbftDeltaRules(), sync=sync)

    def close(self) -> None:
        self._directory.close()


def pbft_checkpoint_interval(config: NodeConfig) -> int:
    return min(config.checkpoint.every_entries, PBFT_CHECKPOINT_INTERVAL)


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


class PbftNode:
    """`ProtocolNode` for PBFT."""

    def checkpoint_policy(self, config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
        return CheckpointPolicy(every_entries=pbft_checkpoint_interval(config), every_bytes=0,
                                compact_lag=0, aligned=True)

    def open_core_state_store(self, config: NodeConfig, sync: SyncPolicy) -> CoreStateJournal:
        return CoreStateJournal(config, sync)

    def build_core(self, config: NodeConfig, *, durable: DurableState, rng: random.Random,
                   byzantine: str | None, pipeline_depth: int,
                   replica: Replica | None = None) -> BuiltCore:
        try:
            crypto = load_crypto(config)
        except SigningKeyError as e:
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
        cfg = pbft_config(config)
        if replica is not None and wants_block_stamp(replica.machine):
            cfg = dataclasses.replace(cfg, block_stamp_skew_ms=PBFT_BLOCK_STAMP_SKEW_MS)
        # An app with its own checkpoint digest (the chain's state root and blocks) gives
        # the votes' digest; others keep SHA-256 of the checkpoint bytes.
        digest = digest_function(replica.machine) if replica is not None else None
        core: Core = PbftCore(cfg, crypto=crypto, restored=restored, checkpoint_digest=digest)
        return BuiltCore(core=core)


PBFT_NODE = PbftNode()

PIECE_CARRIER = PieceCarrier(message=CheckpointData, index_field="seq", data_field="data")
"""State transfer's `CheckpointData` carries a piece manifest between nodes
(`phalanx.runtime.piece_carrier`); the core sees the assembled bytes and checks them against
the stable checkpoint's certificate as before."""

"""The leaderless core's runtime half (`phalanx.protocols.builtin.LEADERLESS.node`): how a real
node (and the simulator) builds and feeds a `LeaderlessCore` over the replica layer.

Owns:
- `ReplicaAppView`: the core's `AppView` over a `Replica` and its machine's
  `EndorsementHooks` (conflicts from `KeyAccess.conflicts_with` with the app's `commutes`,
  access sets cached per command in a bounded cache; policy votes; versions; applied index).
- `WireTxCodec`: transactions as `phalanx.net.wire` frames (the core's `TxCodec`), their
  decodes and ids remembered (bounded); a real node's replica layer and core share one
  (`shared_codec`), so admission and the core decode and identify a transaction once.
- `TxLayer`: the replica's `TransactionLayer` (transaction mode: a committed entry's command
  is the encoded signed transaction; dedup by `messages.transaction_id`).
- `LEADERLESS_NODE` (`ProtocolNode`): the core from a node config (its signing key, the
  client keyring `NodeConfig.client_keys`), the checkpoint policy, the core-state journal
  (`DATA/leaderless/journal`) and the replica's transaction layer.

Runtime semantics: every node applies what its core releases and answers its waiters (and
subscribed clients) with OK, or ABORTED for a transaction the cluster dropped; the client
accepts f+1 matching answers (`CallStrategy.ENDORSEMENT`). There is no REDIRECT.

Horizons: the replica keeps a transaction's record until its deadline is `REPLICA_HORIZON_MS`
older than the newest deadline it applied (`phalanx.apps.transactions`), so no transaction
the core still releases can arrive after its record went: that needs the core's GC horizon
plus the furthest a deadline may lie ahead of the clock (`MAX_DEADLINE_LEAD_MS`, which a
correct node must refuse to exceed when it endorses).

Must not import: `phalanx.runtime.node`, `phalanx.runtime.driver`, trio, sockets, jepsen.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from phalanx.apps.interface import BaseVersions, EndorsementHooks, KeyAccess
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Ready
from phalanx.consensus.leaderless.batching import SubmitBatch
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.durable import LeaderlessDeltaRules, guard_notes
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    LeaderlessDurableState,
    Transaction,
    TxId,
    transaction_id,
)
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net import wire
from phalanx.net.codec import DecodeError
from phalanx.ops.node_config import ConfigError, NodeConfig
from phalanx.ops.signing_keys import SigningKeyError, client_verifier, load_crypto
from phalanx.protocols.leaderless_checkpoints import EnvelopeFormat
from phalanx.protocols.spec import BuiltCore, ProtocolError
from phalanx.runtime.persistence import DurableState, StateJournal
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import SyncPolicy

ACCESS_CACHE = 4096
"""Commands whose access sets `ReplicaAppView` keeps (oldest out first)."""

GC_HORIZON_MS = 60_000
"""The core's garbage-collection horizon (`LeaderlessConfig.gc_horizon_ms`)."""

MAX_DEADLINE_LEAD_MS = 600_000
"""How far ahead of a node's clock a transaction's deadline may lie for the node to endorse
it (10 min; the client sets deadlines seconds ahead)."""

IDLE_CHECKPOINT_CALLS = 200
"""The replica checkpoints after this many idle ticks (~2 s) when it applied anything since
its last checkpoint: state transfer's quiet-point checkpoints."""

CUT_CHECKPOINT_EVERY = 256
"""The replica also checkpoints at content-defined cuts, about one applied transaction in
this many (`CheckpointPolicy.cut_every`): replicas that pass through one applied set
checkpoint it alike, so state transfer finds f+1 matching checkpoints under constant load
(docs/LEADERLESS.md "State transfer"). Below `catch_up.MAX_SUFFIX` (512), so the newest
cut is usually close enough to be vouched for."""

REPLICA_HORIZON_MS = GC_HORIZON_MS + MAX_DEADLINE_LEAD_MS

NAMED_FETCH_DELAY_TICKS = 2
"""`LeaderlessConfig.named_fetch_delay_ticks` of a real node: its clients send every
transaction to every node, so an unknown one that peers' endorsements name is usually
about to arrive (the driver steps a pass's client writes at the pass's end)."""
"""The replica's transaction-table horizon (module docstring)."""

UNWRAP_MEMO = 1024
"""Transactions whose `TxLayer.unwrap` is remembered (oldest out first)."""

NO_BASE = b"\xffno base version"
"""`ReplicaAppView.base_versions` of an app without base versions: no requirement names it
(a version is b"" or a digest), so a base requirement there never holds."""

PolicyVote = Callable[[bytes], bool]
"""An application policy's local vote on a command (True: willing to endorse)."""


class ReplicaAppView:
    """`AppView` over `replica` and `hooks` (by default the replica's machine).

    Args:
        replica: the replica the core's releases are applied to (`applied()` is its
            applied index: the leaderless core's local indexes are the replica's).
        hooks: the application's `EndorsementHooks`.
        policies: votes for named policies; policy "" is `hooks.check`, and a policy
            neither names is refused (never endorsed).
    """

    __slots__ = ("_access", "_base", "_commutes", "_hooks", "_needs", "_policies", "_replica")

    def __init__(self, replica: Replica, hooks: EndorsementHooks | None = None, *,
                 policies: Mapping[str, PolicyVote] | None = None) -> None:
        if hooks is None:
            machine = replica.machine
            if not isinstance(machine, EndorsementHooks):
                raise ProtocolError(f"the application {type(machine).__name__} has no "
                                    "EndorsementHooks: the leaderless protocol needs them")
            hooks = machine
        self._replica = replica
        self._hooks = hooks
        self._commutes = hooks.commutes
        self._policies = dict(policies or {})
        self._access: dict[bytes, KeyAccess] = {}
        self._needs: dict[bytes, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        """(needs_requirements, needs_base) per command, cached like `_access`."""
        self._base: BaseVersions | None = hooks if isinstance(hooks, BaseVersions) else None
        """The hooks as `BaseVersions` (an isinstance on a runtime Protocol costs ~50 us: once)."""

    def access(self, command: bytes) -> KeyAccess:
        """`hooks.access(command)`, cached (a pure function of the command)."""
        cache = self._access
        found = cache.get(command)
        if found is None:
            found = self._hooks.access(command)
            if len(cache) >= ACCESS_CACHE:
                del cache[next(iter(cache))]
            cache[command] = found
        return found

    def conflicts(self, a: bytes, b: bytes) -> bool:
        return self.access(a).conflicts_with(self.access(b), self._commutes)

    def keys(self, command: bytes) -> tuple[str, ...] | None:
        """The keys of `command`'s access set; None with a range read (`read_prefixes`:
        `KeyAccess.conflicts_with` matches those by prefix)."""
        access = self.access(command)
        if access.read_prefixes:
            return None
        return tuple(sorted({*access.reads, *access.writes}))

    def writes(self, command: bytes) -> tuple[str, ...]:
        return self.access(command).writes

    def _needs_of(self, command: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(`needs_requirements`, `needs_base`) of `command`, cached (pure functions of the
        command, asked of every transaction on every node: each decodes it)."""
        cache = self._needs
        found = cache.get(command)
        if found is None:
            base = self._base
            found = (self._hooks.needs_requirements(command),
                     base.needs_base(command) if base is not None else ())
            if len(cache) >= ACCESS_CACHE:
                del cache[next(iter(cache))]
            cache[command] = found
        return found

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        return self._needs_of(command)[0]

    def accepts(self, command: bytes, policy: str) -> bool:
        if policy == "":
            return self._hooks.check(command).accept
        vote = self._policies.get(policy)
        return vote is not None and vote(command)

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        return self._hooks.versions(keys)

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """The app's base versions (`BaseVersions`, optional); an app without them has
        no base version that a requirement could name (`NO_BASE`: never holds)."""
        base = self._base
        if base is None:
            return tuple(NO_BASE for _ in keys)
        return base.base_versions(keys)

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        return self._needs_of(command)[1]

    def fits_run(self, command: bytes, keys: Sequence[str]) -> bool:
        base = self._base
        return base is None or base.fits_run(command, keys)

    def applied(self) -> int:
        return self._replica.applied_index

    def applied_within(self, max_deadline_ms: int) -> list[bytes]:
        table = self._replica.transactions
        if table is None:
            return []
        cutoff = max_deadline_ms - table.horizon_ms
        return sorted(t for t, r in table.records.items() if r.deadline_ms >= cutoff)


class WireTxCodec:
    """`Transaction`s as `phalanx.net.wire` frames (the core's `TxCodec`, and `TxIds`);
    registers the leaderless wire types on first use.

    Remembers its decodes and ids (bounded memos, oldest out first; pure functions of their
    inputs): a node's replica (`TxLayer.unwrap`, at admission) and its core (`_on_submit`)
    each decode a client's transaction and compute its id, from the same bytes, so a real
    node gives both one instance (`shared_codec`)."""

    __slots__ = ("_decoded", "_ids")

    def __init__(self) -> None:
        wire.register_all(LEADERLESS_MESSAGES)
        self._decoded: dict[bytes, Transaction] = {}
        """`decode` of the last `TX_MEMO` frames that decoded to a transaction."""
        self._ids: dict[Transaction, TxId] = {}
        """`transaction_id` of the last `TX_MEMO` transactions."""

    def encode(self, tx: Transaction) -> bytes:
        return wire.encode(tx)

    def decode(self, data: bytes) -> Transaction | None:
        memo = self._decoded
        found = memo.get(data)
        if found is not None:
            return found
        try:
            tx = wire.decode(data, expected=Transaction)
        except DecodeError:
            return None
        if type(tx) is not Transaction:
            return None
        if len(data) > TX_MEMO_MAX_BYTES:
            return tx  # (its bytes as a key: the memo's size stays bounded in bytes too)
        if len(memo) >= TX_MEMO:
            del memo[next(iter(memo))]
        memo[data] = tx
        return tx

    def transaction_id(self, tx: Transaction) -> TxId:
        """`messages.transaction_id(tx, self.encode)`, remembered."""
        memo = self._ids
        found = memo.get(tx)
        if found is None:
            found = transaction_id(tx, wire.encode)
            if len(tx.command) > TX_MEMO_MAX_BYTES:
                return found
            if len(memo) >= TX_MEMO:
                del memo[next(iter(memo))]
            memo[tx] = found
        return found

    def encode_item(self, item: object) -> bytes:
        """The ordered resolution's items and snapshots (`ordered_veto.OrderingCodec`)."""
        return wire.encode(item)

    def decode_item(self, data: bytes) -> object | None:
        try:
            return wire.decode(data)
        except DecodeError:
            return None


TX_MEMO = 4096
"""Transactions whose decode and id a `WireTxCodec` remembers, each (oldest out first)."""

TX_MEMO_MAX_BYTES = 16 * 1024
"""Only frames up to this size enter `WireTxCodec`'s decode memo (a transaction's command may
be ~2 MiB: 4,096 of those would hold gigabytes); larger ones are decoded each time."""

_SHARED: list[WireTxCodec] = []


def shared_codec() -> WireTxCodec:
    """The process's `WireTxCodec` of a real node: its replica's `TxLayer` and its core
    share it (one node per process), so each transaction is decoded and identified once."""
    if not _SHARED:
        _SHARED.append(WireTxCodec())
    return _SHARED[0]


class TxLayer:
    """The replica's `TransactionLayer`: a command is a `WireTxCodec` transaction."""

    __slots__ = ("_codec", "_memo", "horizon_ms")

    def __init__(self, codec: WireTxCodec | None = None, *,
                 horizon_ms: int = REPLICA_HORIZON_MS) -> None:
        self._codec = codec if codec is not None else WireTxCodec()
        self.horizon_ms = horizon_ms
        self._memo: dict[bytes, tuple[bytes, int, bytes, tuple[str, ...]]] = {}
        """`unwrap` of the last `UNWRAP_MEMO` commands: the replica unwraps a transaction
        when its client call is admitted and again when it applies it (a decode, an encode
        and a SHA-256 each time)."""

    def unwrap(self, command: bytes) -> tuple[bytes, int, bytes, tuple[str, ...]] | None:
        memo = self._memo
        found = memo.get(command)
        if found is not None:
            return found
        codec = self._codec
        tx = codec.decode(command)
        if tx is None:
            return None
        pinned = tuple(sorted({r.key for r in tx.requirements if not r.base}))
        found = codec.transaction_id(tx), tx.deadline_ms, tx.command, pinned
        if len(command) > TX_MEMO_MAX_BYTES:
            return found
        if len(memo) >= UNWRAP_MEMO:
            del memo[next(iter(memo))]
        memo[command] = found
        return found


class LeaderlessJournal:
    """The core's `core_state` journal (`DATA/leaderless/journal`): a `StateJournal` that
    appends deltas (`LeaderlessDeltaRules`), plus `close`."""

    def __init__(self, config: NodeConfig, sync: SyncPolicy) -> None:
        wire.register_all(LEADERLESS_MESSAGES)
        self._directory = OsDirectory(str(config.data_dir / "leaderless"))
        self.store = StateJournal(self._directory, codec=wire.default_registry(),
                                  rules=LeaderlessDeltaRules(), sync=sync)

    def close(self) -> None:
        self._directory.close()


OPTIONS = {"stuck_resolution": str, "close_ticks": int, "max_pending_per_client": int}
"""The node config's ``[protocol]`` options (`LeaderlessConfig` fields; docs/LEADERLESS.md
"Ordered resolution", "Per-client bound"), as text in the config."""


def options_problem(options: Mapping[str, str]) -> str | None:
    """Why `options` (a ``[protocol]`` table) is not valid for this core, or None."""
    try:
        _options(options)
        LeaderlessConfig(node_id=NodeId("n1"), nodes=(NodeId("n1"),), **_options(options))
    except (TypeError, ValueError) as e:
        return f"[protocol] {e}"
    return None


def _options(options: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in sorted(options.items()):
        kind = OPTIONS.get(name)
        if kind is None:
            raise ValueError(f"{name}: not an option of the leaderless core "
                             f"(options: {', '.join(sorted(OPTIONS))})")
        try:
            out[name] = kind(text)
        except ValueError:
            raise ValueError(f"{name}: expected {kind.__name__}, got {text!r}") from None
    return out


def leaderless_config(config: NodeConfig) -> LeaderlessConfig:
    """The core's parameters from a node config (n, f from the membership; `[protocol]`
    options). Raises `ConfigError` naming the file on a bad option."""
    try:
        return LeaderlessConfig(node_id=NodeId(config.id),
                                nodes=tuple(sorted(NodeId(m) for m in config.members())),
                                gc_horizon_ms=GC_HORIZON_MS,
                                named_fetch_delay_ticks=NAMED_FETCH_DELAY_TICKS,
                                **_options(config.protocol_options))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{config.source}: [protocol] {e}") from None


class LeaderlessNode:
    """`ProtocolNode` for the leaderless core."""

    def options_problem(self, options: Mapping[str, str]) -> str | None:
        """`cluster init --option`: why these ``[protocol]`` options are wrong, or None."""
        return options_problem(options)

    def checkpoint_policy(self, config: NodeConfig, *, compact_lag: int) -> CheckpointPolicy:
        # What state transfer serves: idle checkpoints at quiet points (f+1 replicas hold
        # checkpoints of one applied set when each checkpoints after the same burst) and
        # content-defined cuts under load (replicas passing through one set checkpoint it).
        return CheckpointPolicy(every_entries=config.checkpoint.every_entries,
                                every_bytes=config.checkpoint.every_bytes,
                                compact_lag=compact_lag, idle_calls=IDLE_CHECKPOINT_CALLS,
                                idle_any=True, cut_every=CUT_CHECKPOINT_EVERY)

    def open_core_state_store(self, config: NodeConfig, sync: SyncPolicy) -> LeaderlessJournal:
        return LeaderlessJournal(config, sync)

    def transaction_layer(self, config: NodeConfig) -> TxLayer:
        return TxLayer(shared_codec())  # the core's codec too (`build_core`)

    def build_core(self, config: NodeConfig, *, durable: DurableState, rng: random.Random,
                   byzantine: str | None, pipeline_depth: int,
                   replica: Replica | None = None) -> BuiltCore:
        if replica is None:
            raise ProtocolError("the leaderless core reads the application through the "
                                "replica: build_core needs replica=")
        # A Byzantine mode (`byzantine`) wraps this honest core afterwards
        # (`phalanx.jepsen.leaderless_byzantine`, through `ProtocolSpec.byzantine`).
        try:
            crypto = load_crypto(config)
        except SigningKeyError as e:
            raise ProtocolError(str(e)) from None
        state = durable.core_state
        if state is not None and not isinstance(state, LeaderlessDurableState):
            raise ProtocolError(f"{config.data_dir}: the stored core state is a "
                                f"{type(state).__name__}, not the leaderless core's")
        guard_notes(threading.Lock())  # the journal diffs on the persistence worker thread
        honest = LeaderlessCore(
            leaderless_config(config), crypto=crypto,
            client_keys=client_verifier(config.client_keys),
            app=ReplicaAppView(replica), codec=shared_codec(), restored=state,
            recovering=durable.recovering, restored_entries=durable.entries,
            checkpoint_format=EnvelopeFormat(), growth_notes=True)  # for the journal's diff
        if byzantine is not None:  # the wrapper must see every input: one Submit each
            return BuiltCore(core=honest)

        def propose_batch(requests: tuple[ClientRequest, ...]) -> Ready:
            # A pass's client writes in one step: their endorsements under one signature,
            # one batch per peer, one record append (docs/LEADERLESS.md "Batch endorsements").
            return honest.step(SubmitBatch(requests=requests))

        return BuiltCore(core=honest, propose_batch=propose_batch)


LEADERLESS_NODE = LeaderlessNode()

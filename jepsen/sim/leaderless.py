"""The leaderless core in the deterministic simulator: cores with `FastCrypto`, signing
clients (`leaderless_workload`), the replica in transaction mode over a recording KV store,
Byzantine endorsers (`phalanx.jepsen.leaderless_byzantine`) and the quiescence checker
(`leaderless_checker`).

Owns: `sim_setup(...)` (the registry's `ProtocolSpec.sim` of ``leaderless``), `WORKLOAD_KNOBS`
(the workload's swarm knobs), `RecordingKv` (the KV store that logs every apply with the
versions it saw) and the glue between the run and the workload (`_Run`).

How a run goes: `run` boots n nodes, starts `_Run` (the clients sign transactions and send
them to every node, or `submit_to` of them), injects the seed's faults, heals, stops the
clients halfway through the liveness window and, at the end, hands the checker every
honest replica's apply log and final state. The checker's verdicts (`leaderless_checker`)
replace linearizability; the run's own checks (runaway, monotone commit) still apply.

Rules: deterministic (all draws from seeded `random.Random`s, virtual time only); the
Byzantine replicas' executions are not judged.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Compare, Delete, Put, Txn
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core, CoreStatus, Input, Ready
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.batching import SubmitBatch
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    LeaderlessDurableState,
    Requirement,
    Transaction,
    transaction_id,
)
from phalanx.consensus.leaderless.status import LeaderlessStatus, StuckReport
from phalanx.consensus.types import ClientRequest, Configuration, Entry, HardState, NodeId
from phalanx.jepsen.leaderless_byzantine import LeaderlessByzantineCore, choose_liars
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.jepsen.sim.leaderless_checker import (
    QUIESCENCE_GRACE_MS,
    ApplyLog,
    Versions,
    check,
    quiescence,
)
from phalanx.jepsen.sim.leaderless_scope import (
    disagreements,
    excuse,
    silent_voters,
    unexcused,
)
from phalanx.jepsen.sim.leaderless_workload import OK, LeaderlessWorkload, WorkloadConfig
from phalanx.jepsen.sim.node import SIM_EPOCH_MS
from phalanx.jepsen.sim.protocols import Knobs, ProtocolSetup, WorkloadEnv, durable_ready
from phalanx.net import wire
from phalanx.protocols.leaderless_checkpoints import EnvelopeFormat
from phalanx.protocols.leaderless_node import ReplicaAppView, TxLayer, WireTxCodec
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage

CLIENT_SECRET = b"phalanx-sim-clients"
"""The simulated clients' keyring secret (`FastCrypto`): apart from the nodes', so no
node's key signs as a client."""

WORKLOAD_KNOBS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("conflict_pct", (0, 10, 30, 60)),
    ("short_pct", (0, 10, 30)),
    ("deadline_max_ms", (400, 1_500)),
    ("short_max_ms", (20, 80)),
    ("hot_jitter_ms", (0, 30)),
    ("mixed_pct", (0, 20, 40)),
)
"""Workload knobs a swarm seed may draw (with the core's config fields, for the registry's
`sim_knobs`); `sim_setup` accepts any `WorkloadConfig` field by name. `short_max_ms` and
`hot_jitter_ms` (drawn last, so earlier draws of a seed are unchanged) make transactions
expire while their endorsements split, the conditional endorsements' ground. Not drawn yet:
``submit_to`` = f+1 (a node that never hears of a committed transaction has no way to catch
up in the core yet: see docs/LEADERLESS.md "Simulation")."""

SIM_KNOBS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("delta_old_ms", (200, 1_000)),
    ("checkpoint_ticks", (5, 30)),
    ("rebroadcast_ticks", (5, 20)),
    *WORKLOAD_KNOBS,
)
"""The registry entry's `sim_knobs` for ``leaderless``: core timing and the workload mix.
(`vote_batch_ticks` is not drawn: the sweeps run the default, 1; `--set vote_batch_ticks=0`
runs the unbatched vote broadcast.)"""

IDLE_CHECKPOINT_TICKS = 20
CUT_EVERY = 0
"""The replicas' content-defined checkpoints (`CheckpointPolicy.cut_every`, the knob
`cut_every`): off by default here (a cut every 8 transactions cost 40% more CPU in the
sweeps: 5.6 s vs 4.0 s for 12 default seeds); the constant-load tests set 4."""
"""A replica checkpoints after this many ticks with nothing applied (if it applied anything
since its last one): the quiet-point checkpoints state transfer serves (docs/LEADERLESS.md
"State transfer")."""

_CORE_KNOBS = ("delta_old_ms", "checkpoint_ticks", "checkpoint_batch", "gc_horizon_ms",
               "rebroadcast_ticks", "max_pending", "stuck_resolution", "close_ticks",
               "max_deadline_lead_ms", "vote_batch_ticks")


class RecordingKv(KvStateMachine):
    """The KV store, logging each applied command with the versions of the keys it touches
    just before (into the run's `ApplyLog`, under this replica incarnation)."""

    def __init__(self, log: ApplyLog, node: str, incarnation: int) -> None:
        super().__init__()
        self._log = log
        self._node = node
        self._incarnation = incarnation

    def apply(self, command: bytes) -> bytes:
        self._record(command)
        return super().apply(command)

    def apply_tx(self, tx_id: bytes, command: bytes, pinned: Sequence[str] = ()) -> bytes:
        self._record(command)
        return super().apply_tx(tx_id, command, pinned)

    def restore(self, data: bytes) -> None:
        super().restore(data)
        self._log.installed(self._node, self._incarnation)

    def _record(self, command: bytes) -> None:
        access = self.access(command)
        keys = sorted(set(access.reads) | set(access.writes))
        before: Versions = tuple(zip(keys, self.versions(keys), self.base_versions(keys),
                                     strict=True))
        self._log.record(self._node, self._incarnation, command, before)


CHAIN_DEADLINE_MS = SIM_EPOCH_MS + 300_000
"""The deadline of `ChainedRequests`' transactions: five virtual minutes past the
simulator's epoch (a harness retries them until they commit)."""


class ChainedRequests:
    """The leaderless setup's `ProtocolSetup.client_request`: a bare put or delete as a signed
    transaction, for harnesses that issue commands and expect ONE committed sequence (the
    conformance suite). The transactions form a chain: each is a `Txn` comparing every key
    written by the commands wrapped before it, and its own key, with the value those
    commands leave (applied in wrapping order to a model KV store), then running the command;
    it requires each of those keys' versions. A writing txn writes the keys it compares (the
    leaderless core endorses no writer requiring a key it does not write), so any two
    conflict, they commit in wrapping order at every replica (same local indexes
    everywhere), and all commit once each is retried until it does. Call it once per
    request, in issue order."""

    def __init__(self, encode_tx: Callable[[Transaction], bytes]) -> None:
        self._encode = encode_tx
        self._model = KvStateMachine()
        self._written: set[str] = set()
        self._keys: dict[str, FastCrypto] = {}

    def __call__(self, client_id: str, request_no: int, command: bytes) -> ClientRequest:
        model = self._model
        write = kv_wire.decode_command(command)
        if not isinstance(write, (Put, Delete)):
            raise ValueError(f"ChainedRequests wraps puts and deletes, not {write!r}")
        keys = sorted(self._written | {write.key})
        chained = kv_wire.encode_command(Txn(
            compares=tuple(Compare(key=k, expected=model.get(k)) for k in keys),
            success=(write,)))
        body = Transaction(
            client=client_id, client_id=client_id, request_no=request_no,
            deadline_ms=CHAIN_DEADLINE_MS, command=chained,
            requirements=tuple(Requirement(key=k, version=v)
                               for k, v in zip(keys, model.versions(keys), strict=True)))
        key = self._keys.get(client_id)
        if key is None:
            key = self._keys[client_id] = FastCrypto(NodeId(client_id),
                                                     cluster_secret=CLIENT_SECRET)
        tx = dataclasses.replace(body, signature=key.sign(body))
        # As the replica applies it in transaction mode (KV chain versions: the id counts).
        model.apply_tx(transaction_id(tx, self._encode), chained)
        self._written.add(write.key)
        return ClientRequest(client_id=client_id, request_no=request_no,
                             command=self._encode(tx))


_HARD = HardState()
"""The hard state a Ready with a core record carries (so the node persists it; the core
never reads it back: restoring a commit index is optional)."""


class _DurableCell:
    """Keeps the core's `Ready.core_state` durable for the simulated node (as PBFT's
    `DurableStateCore`): written synchronously into `cells[node]` (survives crashes), the
    Ready keeps a hard state so the driver still persists and feeds `Persisted` back."""

    def __init__(self, inner: Core, node: str, cells: dict[str, LeaderlessDurableState]
                 ) -> None:
        self.inner = inner
        self._node = node
        self._cells = cells

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        ready = self.inner.step(inp)
        state = ready.core_state
        if not isinstance(state, LeaderlessDurableState):
            return ready
        self._cells[self._node] = state
        hard = ready.hard_state or _HARD
        return durable_ready(ready, hard)


class _Checker(InvariantChecker):
    """The run's invariant checker: the leaderless core keeps no replicated log and local
    indexes differ between replicas, so only the run's generic checks remain (monotone
    commit); the real verdicts are `leaderless_checker`'s, at the end."""

    def observe_apply(self, node: str, entry: Entry, at_ns: int) -> None:
        """Local indexes: nothing to compare across replicas."""

    def check_log_matching(self, logs: object, at_ns: int) -> None:
        """Not a leaderless property."""

    def check_committed_durable(
        self, logs: object, at_ns: int, *, durable_window: int = 256,
        recovering: frozenset[str] = frozenset(),
    ) -> None:
        """Not a leaderless property (decisions live in certificates)."""


class _Run:
    """One run's workload and checks (`ProtocolSetup.workload`)."""

    def __init__(self, env: WorkloadEnv, *, config: WorkloadConfig, faults: int,
                 honest: tuple[str, ...], log: ApplyLog, machines: dict[str, KvStateMachine],
                 codec: WireTxCodec, contract: str = "", delta_old_ms: int = -1,
                 liars: Mapping[str, tuple[str, ...]] | None = None,
                 unanimous_drop: bool = True, past_contract: bool = False,
                 cells: Mapping[str, LeaderlessDurableState] | None = None) -> None:
        self._env = env
        self._cells = cells if cells is not None else {}
        self._unanimous_drop = unanimous_drop
        self._past_contract = past_contract
        self._delta_old_ms = delta_old_ms
        self._liars = dict(liars or {})
        self._contract = contract
        self._config = config
        self._faults = faults
        self._honest = honest
        self._log = log
        self._machines = machines
        self._codec = codec
        keys = {f"c{i}": FastCrypto(NodeId(f"c{i}"), cluster_secret=CLIENT_SECRET)
                for i in range(config.clients)}

        def sign(tx: Transaction) -> Transaction:
            return dataclasses.replace(tx, signature=keys[tx.client].sign(tx))

        self.workload = LeaderlessWorkload(
            config, loop=env.loop, rng=env.rng, nodes=tuple(env.nodes), faults=faults,
            transport=self, sign=sign, encode_tx=codec.encode,
            now_ms=lambda: SIM_EPOCH_MS + env.loop.now // 1_000_000, trace=env.trace)

    # -- the workload's transport -----------------------------------------------------------

    def submit(self, node: str, request: ClientRequest) -> None:
        self._env.submit(node, request)

    def versions(self, node: str, keys: Sequence[str], *, base: bool = False
                 ) -> tuple[bytes, ...] | None:
        machine = self._machines.get(node)
        if machine is None or not self._env.nodes[node].up:
            return None
        return machine.base_versions(keys) if base else machine.versions(keys)

    # -- SimWorkload ----------------------------------------------------------------------

    @property
    def ok(self) -> int:
        return self.workload.ok

    @property
    def infos(self) -> int:
        return self.workload.infos

    def start(self) -> None:
        self.workload.start()

    def stop(self, final_ns: int) -> None:
        self.workload.stop(final_ns)

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        self.workload.answer(node, client_id, request_no, result)

    def abort(self, node: str, client_id: str, request_no: int) -> None:
        self.workload.abort(node, client_id, request_no)

    def commit_latencies_ns(self) -> tuple[int, ...]:
        return tuple(r.completed_ns - r.invoked_ns for r in self.workload.records
                     if r.outcome == OK and r.completed_ns is not None)

    def commit_times_ns(self) -> tuple[tuple[int, int], ...]:
        return tuple((r.invoked_ns, r.completed_ns) for r in self.workload.records
                     if r.outcome == OK and r.completed_ns is not None)

    def check(self) -> list[str]:
        keys = self._config.keys
        finals = {n: {k: self._machines[n].get(k) for k in keys}
                  for n in self._honest if n in self._machines and self._env.nodes[n].up}
        probe = KvStateMachine()

        def conflicts(a: bytes, b: bytes) -> bool:
            return probe.access(a).conflicts_with(probe.access(b), probe.commutes)

        gated: list[str] = []
        reports: dict[str, StuckReport] = {}
        now_ms = SIM_EPOCH_MS + self._env.loop.now // 1_000_000
        settle = now_ms - self._delta_old_ms - QUIESCENCE_GRACE_MS
        for name, node in self._env.nodes.items():
            status = node.core.status() if node.core is not None else None
            self._env.trace(f"LEADERLESS {name} status: {status}")
            held = getattr(status, "gated", 0)
            if name in self._honest and held:
                gated.append(f"gate: {name} holds {held} committed transaction(s) whose "
                             "requirements never matched (committed, never applied)")
            core = _inner(node.core)
            if (self._delta_old_ms >= 0 and name in self._honest and node.up
                    and isinstance(status, LeaderlessStatus) and not status.recovering
                    and isinstance(core, LeaderlessCore)):
                reports[name] = core.stuck(settle)
        excused: dict[bytes, str] = {}
        if self._delta_old_ms >= 0:  # the knob `quiescence` (on by default); its scope:
            gated += self._quiescence(reports, excused, now_ms)
        w = self.workload
        self._env.trace(f"LEADERLESS clients: {len(w.records)} transactions, {w.ok} ok, "
                        f"{w.failed} fail, {w.infos} info")
        if self._contract:  # last: the failure report's trace tail shows it
            self._env.trace(f"LEADERLESS outside the contract: {self._contract}")
        names = {transaction_id(r.tx, self._codec.encode): r.describe() for r in w.records}
        decided = {n: {d.tx_id: d.committed for d in self._cells[n].decided}
                   for n in self._honest if n in self._cells}
        split = disagreements(decided, excused, lambda t: names.get(t, t[:3].hex()))
        return gated + [f"decisions: {p}" for p in split[:8]] + check(
            records=w.records, log=self._log, finals=finals, honest=self._honest,
            faults=self._faults, conflicts=conflicts)

    def _quiescence(self, reports: Mapping[str, StuckReport], excused: dict[bytes, str],
                    now_ms: int) -> list[str]:
        """Judge `quiescence` within its scope (`leaderless_scope`): with the knob
        `quiescence` = 2 on every transaction of the honest nodes up and unfenced, else
        leaving out the `excuse`d ones (filled into `excused`, each named in the trace with
        its reason). The pbft mode reports no checkpoints: there an honest node down or
        fenced still leaves the whole run unjudged, as before."""
        silent = silent_voters(
            honest=self._honest, reporting=reports, liars=self._liars,
            liars_up={n: self._env.nodes[n].up for n in self._liars},
            unanimous_drop=self._unanimous_drop)
        if not self._past_contract:
            if not self._unanimous_drop and any(n in silent for n in self._honest):
                down = ", ".join(n for n in self._honest if n in silent)
                self._env.trace(f"LEADERLESS quiescence not judged: {down} down or fenced at "
                                "the end, in the pbft mode (no checkpoint report)")
                return []
            excused.update(excuse(reports, silent))
        left = unexcused(reports, excused)
        for tx_id, why in excused.items():
            self._env.trace(f"LEADERLESS quiescence excuses {tx_id[:3].hex()} {why}")
        self._env.trace(f"LEADERLESS quiescence judged at {len(reports)} node(s): "
                        f"{sum(c for c, _ in left.values())} of "
                        f"{sum(len(r.txs) for r in reports.values())} old pending "
                        f"transaction(s) held not excused; {len(excused)} excused")
        return quiescence(left, delta_old_ms=self._delta_old_ms, now_ms=now_ms)


def _inner(core: Core | None) -> Core | None:
    """The leaderless core under the simulator's wrappers."""
    while isinstance(core, _DurableCell | LeaderlessByzantineCore):
        core = core.inner
    return core


def sim_setup(*, nodes: int, bugs: frozenset[str], checkpoint_every: int, knobs: Knobs,
              seed: int, byzantine: int, twins: int,
              behaviours: tuple[str, ...] = (),
              machine: object | None = None) -> ProtocolSetup:
    """The simulator setup of a leaderless cluster `n1..nN` (`protocol_setup`'s contract):
    `knobs` set `LeaderlessConfig` fields, `WorkloadConfig` fields, `checkpoint_every`,
    `cut_every` (the replicas' content-defined checkpoints, `CUT_EVERY`; 0: off),
    `quiescence` (1, the default: the checker judges `quiescence`, `leaderless_checker`,
    on every old pending transaction but those `leaderless_scope.excuse` excuses, each
    named in the trace; 2: on every one, nothing excused; 0: not, for runs that meet a
    documented limit under which transactions stay pending for good) and
    `idle_checkpoint_ticks` (`IDLE_CHECKPOINT_TICKS`; 0: no quiet-point checkpoints, as
    under a load that never pauses);
    `byzantine` replicas lie with seeded (or the given) behaviours. Twins are not supported
    (ValueError), nor another app than its recording KV store (`machine`: ValueError)."""
    from phalanx.consensus.leaderless.config import LeaderlessConfig

    if machine is not None:
        raise ValueError("the leaderless simulator runs its own KV workload only (its replicas "
                         "apply transactions in different orders): simulate your app on "
                         "raft or pbft")
    if twins:
        raise ValueError("the leaderless simulator has no twins (use --byzantine)")
    # Sorted, as configurations must be (from n = 10 on, "n10" sorts before "n2").
    names = tuple(sorted(f"n{i}" for i in range(1, nodes + 1)))
    faults = (nodes - 1) // 3
    core_knobs = {k: v for k, v in knobs if k in _CORE_KNOBS}
    work_fields = {f.name for f in dataclasses.fields(WorkloadConfig)}
    work_knobs = {k: v for k, v in knobs if k in work_fields}
    unknown = [k for k, _ in knobs
               if k not in core_knobs and k not in work_knobs
               and k not in ("checkpoint_every", "cut_every", "idle_checkpoint_ticks",
                             "quiescence")]
    if unknown:
        raise TypeError(f"unknown leaderless sim knob(s) {unknown}")
    checkpoint_every = int(dict(knobs).get("checkpoint_every", checkpoint_every))
    cut_every = int(dict(knobs).get("cut_every", CUT_EVERY))
    idle_ticks = int(dict(knobs).get("idle_checkpoint_ticks", IDLE_CHECKPOINT_TICKS))
    settle = int(dict(knobs).get("quiescence", 1))  # the checker's `quiescence`, on by default
    if settle not in (0, 1, 2):
        raise ValueError(f"the leaderless sim knob quiescence is 0, 1 or 2, not {settle}")
    wire.register_all(LEADERLESS_MESSAGES)
    plan = choose_liars(seed, names, count=byzantine, behaviours=behaviours)
    liars = dict(plan)
    honest = tuple(n for n in names if n not in liars)
    cells: dict[str, LeaderlessDurableState] = {}
    log = ApplyLog()
    machines: dict[str, KvStateMachine] = {}
    replicas: dict[str, Replica] = {}
    incarnations: dict[str, int] = {}
    base = LeaderlessConfig(node_id=NodeId(names[0]), nodes=tuple(NodeId(n) for n in names),
                            **core_knobs)  # type: ignore[arg-type]
    codec = WireTxCodec()
    layer = TxLayer(codec)
    # The replica's checkpoints carry the membership (as the runtime's): without it their
    # metadata is empty and a restart from one cannot load it.
    members = Configuration(voters=tuple(NodeId(n) for n in names))

    def tx_id(tx: Transaction) -> bytes:
        return transaction_id(tx, codec.encode)
    client_keys = FastCrypto(NodeId("keyring"), cluster_secret=CLIENT_SECRET)
    config = WorkloadConfig(**work_knobs)  # type: ignore[arg-type]  # int fields; bad --set values raise

    def make_replica(node: str, storage: Storage, durable: DurableState) -> Replica:
        incarnations[node] = incarnation = incarnations.get(node, 0) + 1
        machine = RecordingKv(log, node, incarnation)
        replica = Replica(
            machine, checkpoints=storage.checkpoints, wal=storage.wal,
            decode_entry=wire.decode_entry,
            policy=CheckpointPolicy(every_entries=checkpoint_every, every_bytes=0,
                                    compact_lag=0, idle_calls=idle_ticks,
                                    idle_any=True, cut_every=cut_every),
            config=members, transactions=layer)
        replica.restore_latest()
        machines[node], replicas[node] = machine, replica
        return replica

    def make_core(node: str, durable: DurableState, rng: random.Random) -> Core:
        crypto = FastCrypto(NodeId(node))
        if (durable.recovering and durable.hard_state is None and durable.snapshot is None
                and not durable.entries):
            cells.pop(node, None)  # lose-disk: the record went with the (empty) disk
        # The record lives beside the disk: amnesia only when it is gone too.
        recovering = durable.recovering and node not in cells
        inner = LeaderlessCore(
            dataclasses.replace(base, node_id=NodeId(node)), crypto=crypto,
            client_keys=client_keys, app=ReplicaAppView(replicas[node]),
            codec=codec, restored=cells.get(node), bugs=bugs, recovering=recovering,
            restored_entries=durable.entries, checkpoint_format=EnvelopeFormat())
        core: Core = _DurableCell(inner, node, cells)
        if node in liars:
            rng_b = random.Random(f"leaderless-byzantine-node:{seed}:{node}:{rng.getrandbits(32)}")
            core = LeaderlessByzantineCore(core, behaviours=liars[node], crypto=crypto,
                                           rng=rng_b, tx_id=tx_id, nodes=names)
        return core

    def observe(core: Core) -> tuple[str, int, int]:
        while isinstance(core, _DurableCell | LeaderlessByzantineCore):
            core = core.inner
        # The last released local index, read without building a status (hot path).
        gate = getattr(core, "_gate", None)
        return "endorser", 0, gate.last_index if gate is not None else core.status().commit_index

    def workload(env: WorkloadEnv) -> _Run:
        return _Run(env, config=dataclasses.replace(config, clients=env.clients),
                    faults=faults, honest=honest, log=log, machines=machines, codec=codec,
                    contract=horizon_contract(base.delta_old_ms, base.gc_horizon_ms),
                    delta_old_ms=base.delta_old_ms if settle else -1, liars=liars,
                    unanimous_drop=base.stuck_resolution == "veto", past_contract=settle == 2,
                    cells=cells)

    def submit_batch(requests: tuple[ClientRequest, ...]) -> Input:
        # The leaderless core's step takes it (as the runtime's `propose_batch`); `Input`
        # does not name it, as it is this core's own.
        return cast(Input, SubmitBatch(requests=requests))

    described = "; ".join(f"{n}:{'+'.join(b)}" for n, b in plan) or "none"
    return ProtocolSetup(
        names=names, codec=wire.default_registry(), make_core=make_core,
        make_replica=make_replica, observe=observe, leader_role="leader", checker=_Checker(),
        byzantine=tuple(liars), workload=workload, recovers_lost_disk=True,
        client_request=ChainedRequests(codec.encode),
        # Not with liars: a Byzantine wrapper must see each Submit (as in the runtime).
        submit_batch=None if liars else submit_batch,
        description=f"byzantine: {described}; workload: {_describe(config)}")


def horizon_contract(delta_old_ms: int, gc_horizon_ms: int) -> str:
    """Why these settings break the GC-horizon contract (docs/LEADERLESS.md "Limits", 6),
    or "". A stuck transaction is checkpointed only `delta_old_ms` after its deadline; a
    node that never held it may vote drop on it only while its deadline is within that
    node's horizon ("Forgotten commits"), so with `delta_old_ms` >= `gc_horizon_ms` every
    such node abstains, the DROP never comes, and the holders pull the transaction every
    period for good (the 1 s-horizon "runaway" seeds 44 and 55, "Runaway seeds")."""
    if delta_old_ms < gc_horizon_ms:
        return ""
    return (f"delta_old_ms={delta_old_ms} is not below gc_horizon_ms={gc_horizon_ms}: a node "
            "that never held a stuck transaction abstains on its checkpoint (liveness only)")


def _describe(config: WorkloadConfig) -> str:
    base = WorkloadConfig()
    return ", ".join(f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config)
                     if getattr(config, f.name) != getattr(base, f.name)) or "defaults"


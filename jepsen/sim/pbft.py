"""PBFT in the deterministic simulator: cores with `FastCrypto`, Byzantine replicas, the BFT
client side (a request to the primary alone once f+1 replicas name it, retransmissions to
every replica, f+1 matching replies, as `phalanx.client.bft_calls`) and the BFT invariants.

Owns: `pbft_setup(...)` (called by `phalanx.jepsen.sim.protocols.protocol_setup`),
`choose_byzantine` (which replicas lie, and how, for a seed), `BftReplies` (the client-side
reply filter), `BftChecker` (agreement over honest replicas and validity) and
`DurableStateCore` (keeps `Ready.core_state` durable for the simulated node).

Invariants checked (on top of linearizability and liveness, which `run` checks):
- **Agreement**: no two honest replicas execute different request batches at one sequence
  number. Only the batch is compared: a batch committed in view v at one replica and
  re-proposed in view v+1 (NewView) at another is the same decision.
- **Validity**: every request an honest replica executes was issued by a client.
Byzantine replicas are excluded: `run` gives them a throwaway checker.

Rules: deterministic (Byzantine choices come from `random.Random` seeded with the run seed;
no clocks, no set-order dependence); imports the PBFT core and `phalanx.jepsen.byzantine`,
never the event loop or the network.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from phalanx.apps.checkpoint_digest import digest_function
from phalanx.apps.interface import BatchHooks, CheckpointDigest, StateMachine
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core, CoreStatus, Input, Ready
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.pbft import (
    PBFT_MESSAGES,
    PbftBugs,
    PbftConfig,
    PbftCore,
    PbftDurableState,
    PbftRestoredState,
    ReplyCollector,
)
from phalanx.consensus.pbft.messages import Prepare, PrePrepare, VoteKind
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    HardState,
    Message,
    NodeId,
)
from phalanx.jepsen.attacks import ATTACKS, AttackCore, Collusion
from phalanx.jepsen.byzantine import (
    BEHAVIOURS,
    ByzantineCore,
    TwinsChannel,
    TwinsCore,
    corrupt_result,
)
from phalanx.jepsen.sim.crypto_memo import CryptoMemo
from phalanx.jepsen.sim.invariants import InvariantChecker, LogMirror
from phalanx.jepsen.sim.protocols import Knobs, ProtocolSetup, durable_ready
from phalanx.net import wire
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage

SIM_BLOCK_STAMP_SKEW_MS = 2000
"""The simulated nodes' block-stamp bound (`PbftConfig.block_stamp_skew_ms`), when on."""

# Behaviours a sweep draws from (every one of `BEHAVIOURS`).
SWEEP_BEHAVIOURS = BEHAVIOURS


@dataclass(frozen=True, slots=True, kw_only=True)
class ByzantinePlan:
    """Which replicas are Byzantine in one run, and how.

    Attributes:
        behaviours: node -> behaviour names (a `ByzantineCore` wrapper).
        twins: twinned nodes (a `TwinsCore` each); they are Byzantine too.
        side_a: the honest replicas the A twins talk to (the B twins talk to the others).
    """

    behaviours: tuple[tuple[str, tuple[str, ...]], ...] = ()
    twins: tuple[str, ...] = ()
    side_a: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({n for n, _ in self.behaviours} | set(self.twins)))

    def describe(self) -> str:
        parts = [f"{n}:{'+'.join(b)}" for n, b in self.behaviours]
        if self.twins:
            parts.append(f"twins {','.join(self.twins)} (side A: {','.join(self.side_a)})")
        return "; ".join(parts) or "none"


def choose_byzantine(
    seed: int,
    names: tuple[str, ...],
    *,
    count: int,
    twins: int = 0,
    behaviours: tuple[str, ...] = (),
    targeted_attacks: bool = True,
) -> ByzantinePlan:
    """The seeded plan: `count` replicas with behaviours (the given ones, or one or two drawn
    from `SWEEP_BEHAVIOURS`), plus `twins` twinned replicas. Without given behaviours and
    twins, half the seeds instead give every liar one targeted attack from
    `phalanx.jepsen.attacks.ATTACKS` (``collude`` only with >= 2 liars, who are then n1..nK,
    the primaries of views 0..K-1: PBFT's worst case, K-1 view changes in a row before an
    honest primary leads); `targeted_attacks=False` never draws one (liars at seeded places,
    with behaviours: what the scale bench measures). Twins come first in the order,
    so `twins=2` at n=4 twins two nodes including the view-0 primary half of the time."""
    if count < 0 or twins < 0 or count + twins > len(names):
        raise ValueError(f"cannot make {count} + {twins} of {len(names)} replicas Byzantine")
    unknown = [b for b in behaviours if b not in BEHAVIOURS + ATTACKS]
    if unknown:
        raise ValueError(
            f"unknown Byzantine behaviour(s) {unknown}; known: {BEHAVIOURS + ATTACKS}"
        )
    attacks = [b for b in behaviours if b in ATTACKS]
    if attacks and (len(attacks) > 1 or len(behaviours) > 1):
        raise ValueError(f"an attack ({attacks[0]}) is a replica's only behaviour: {behaviours}")
    rng = random.Random(f"pbft-byzantine:{seed}")
    picked = rng.sample(sorted(names), count + twins)
    twinned = tuple(sorted(picked[:twins]))
    liars = sorted(picked[twins:])
    attack = attacks[0] if attacks else None
    if not behaviours and count and not twins and targeted_attacks:
        # Half the seeds run one targeted attack (`phalanx.jepsen.attacks`) on every liar.
        draw = random.Random(f"pbft-attack:{seed}")
        if draw.random() < 0.5:
            usable = [a for a in ATTACKS if a != "collude" or count >= 2]
            attack = draw.choice(usable)
    if attack == "collude":
        liars = list(names[:count])  # the primaries of views 0 .. count-1
    plan: list[tuple[str, tuple[str, ...]]] = []
    for node in liars:
        if attack is not None:
            plan.append((node, (attack,)))
            continue
        chosen = behaviours or tuple(sorted(rng.sample(SWEEP_BEHAVIOURS, rng.randint(1, 2))))
        plan.append((node, chosen))
    honest = [n for n in sorted(names) if n not in picked]
    rng.shuffle(honest)
    side_a = tuple(sorted(honest[: (len(honest) + 1) // 2])) if twinned else ()
    return ByzantinePlan(behaviours=tuple(plan), twins=twinned, side_a=side_a)


class BftChecker(InvariantChecker):
    """`InvariantChecker` with PBFT's agreement (batches per seq) and validity."""

    def __init__(self, issued: set[tuple[str, int, bytes]]) -> None:
        super().__init__(leader_role="primary")
        self._issued = issued
        self._batches: dict[int, tuple[ClientRequest, ...]] = {}

    def observe_apply(self, node: str, entry: Entry, at_ns: int) -> None:
        for r in entry.requests:
            if (r.client_id, r.request_no, r.command) not in self._issued:
                self._violate(
                    "validity",
                    at_ns,
                    f"{node} executed {r.client_id}#{r.request_no} at seq {entry.index}, "
                    "which no client issued",
                )
        known = self._batches.get(entry.index)
        if known is None:
            self._batches[entry.index] = entry.requests
            self.applied[entry.index] = entry
            self.applied_by[entry.index] = node
        elif known != entry.requests:
            self._violate(
                "agreement",
                at_ns,
                f"seq {entry.index}: {self.applied_by[entry.index]} executed "
                f"{_batch(known)}, {node} executed {_batch(entry.requests)}",
            )


    def check_committed_durable(
        self, logs: Mapping[str, LogMirror], at_ns: int, *, durable_window: int = 256,
        recovering: frozenset[str] = frozenset(),
    ) -> None:
        """Not a PBFT property: decisions live in certificates and checkpoints, not a log."""

    def check_log_matching(self, logs: Mapping[str, LogMirror], at_ns: int) -> None:
        """Not a PBFT property: PBFT keeps no replicated log (agreement replaces it)."""


def _batch(batch: tuple[ClientRequest, ...]) -> str:
    if not batch:
        return "[null]"
    return "[" + ",".join(f"{r.client_id}#{r.request_no}" for r in batch) + "]"


class BftReplies:
    """The BFT client side, as `phalanx.client.bft_calls` does it: a request goes to the primary
    alone when more than f replicas name the same one, else to every replica, and every
    retransmission goes to every replica (`targets`); every replica answers what it executes
    (the real replicas answer subscribed connections); a result is accepted once f+1
    replicas sent the same one (`ReplyCollector`). Byzantine replicas with ``corrupt_reply``
    answer wrong results; the f+1 rule must filter them out."""

    broadcast = True

    def __init__(
        self, replicas: tuple[str, ...], corrupting: tuple[str, ...], seed: int
    ) -> None:
        self._replicas = tuple(NodeId(r) for r in replicas)
        self._corrupting = frozenset(corrupting)
        self._rng = random.Random(f"pbft-replies:{seed}")
        self._collectors: dict[tuple[str, int], ReplyCollector] = {}
        self._done: set[tuple[str, int]] = set()
        self._sent: set[tuple[str, int]] = set()
        self.issued: set[tuple[str, int, bytes]] = set()
        self.corrupted = 0

    def record(self, request: ClientRequest) -> None:
        """A client issued `request` (validity accepts only these)."""
        self.issued.add((request.client_id, request.request_no, request.command))

    def targets(self, request: ClientRequest, claims: Sequence[str | None]) -> tuple[str, ...]:
        """Where `request` goes: its first send to the replica that more than f of `claims`
        (each replica's answer to "who is primary?", in replica order) name, if any; else,
        and on every retransmission, to every replica."""
        key = (request.client_id, request.request_no)
        everyone = tuple(str(r) for r in self._replicas)
        if key in self._sent:
            return everyone
        self._sent.add(key)
        faults = (len(self._replicas) - 1) // 3
        for candidate in everyone:
            if sum(claim == candidate for claim in claims) > faults:
                return (candidate,)
        return everyone

    def reply(self, node: str, client_id: str, request_no: int, result: bytes) -> bytes | None:
        """Feed `node`'s reply; return the accepted result exactly once, else None."""
        key = (client_id, request_no)
        if key in self._done:
            return None
        if node in self._corrupting:
            result = corrupt_result(result, self._rng)
            self.corrupted += 1
        collector = self._collectors.get(key)
        if collector is None:
            collector = self._collectors[key] = ReplyCollector(self._replicas)
        decided = collector.add(NodeId(node), result)
        if decided is None:
            return None
        self._done.add(key)
        del self._collectors[key]
        return decided


class DurableStateCore:
    """Keeps a PBFT core's `Ready.core_state` durable for the simulated node.

    The record is written (synchronously, like the memory disk's fsync) into `cells[node]`,
    which survives crashes, and the Ready keeps a `hard_state` so that the driver still
    persists it and feeds `Persisted` back. Used because `SimNode` does not yet hand
    `ReadyPersister` a core-state store.

    Early votes (`Ready.early_messages`) leave before any record of them is durable; a
    crash before the next record is written loses them. Two windows are made reachable by
    the simulator's crash-after-ready fault (which strikes only after a Ready that
    persists): a Ready that sends early votes and persists nothing is given a hard state
    (view, executed; the PBFT core never reads it back), so a crash may follow it at once;
    a Ready that sends early votes *and* writes a record (for another reason) also leaves
    a *lossy* record in `lossy[node]`: the new record without those votes (what the disk
    holds if the process dies after sending them, before the write). The next step of this
    core clears it (the node did not crash right there); a restart that finds it starts
    from it. Either way a restarted replica may have forgotten votes it sent: the fence
    (`phalanx.consensus.pbft.safety`) must keep it from contradicting them.
    """

    def __init__(
        self,
        inner: PbftCore,
        cells: dict[str, PbftDurableState],
        lossy: dict[str, PbftDurableState] | None = None,
    ) -> None:
        self.inner = inner
        self._cells = cells
        self._lossy = lossy

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        lossy = self._lossy
        if lossy is not None:
            lossy.pop(self.node_id, None)
        ready = self.inner.step(inp)
        state = ready.core_state
        if not isinstance(state, PbftDurableState):
            if lossy is not None and ready.early_messages and not ready.has_persistence:
                hard = HardState(view=self.inner.view, commit=self.inner.executed)
                return dataclasses.replace(ready, hard_state=hard)
            return ready
        if lossy is not None and ready.early_messages:
            forgotten = _without_early_votes(state, ready)
            if forgotten is not state:
                lossy[self.node_id] = forgotten
        self._cells[self.node_id] = state
        hard = ready.hard_state or HardState(view=state.view, commit=self.inner.executed)
        return durable_ready(ready, hard)


def _without_early_votes(state: PbftDurableState, ready: Ready) -> PbftDurableState:
    """`state` without the signature records of the votes `ready` sends early (`state`
    itself when there are none)."""
    early: set[tuple[VoteKind, int, int]] = set()
    for send in ready.early_messages:
        msg = send.message
        if isinstance(msg, PrePrepare):
            early.add((VoteKind.PRE_PREPARE, msg.view, msg.seq))
        elif isinstance(msg, Prepare):
            early.add((VoteKind.PREPARE, msg.view, msg.seq))
    votes = tuple(v for v in state.safety.votes if (v.kind, v.view, v.seq) not in early)
    if len(votes) == len(state.safety.votes):
        return state
    return dataclasses.replace(state, safety=dataclasses.replace(state.safety, votes=votes))


def vote_watch(honest: frozenset[str]) -> Callable[[str, str, Message], str | None]:
    """A white-box check of every pre-prepare and prepare an honest replica sends: one
    digest per (kind, view, seq) per replica over the whole run, across its restarts (the
    `SafetyRules` promise; the ``no_view_fence`` bug breaks it after a crash that lost the
    record of an early vote)."""
    sent: dict[tuple[str, VoteKind, int, int], bytes] = {}

    def watch(src: str, dst: str, message: Message) -> str | None:
        if src not in honest:
            return None
        if isinstance(message, PrePrepare):
            kind = VoteKind.PRE_PREPARE
        elif isinstance(message, Prepare):
            kind = VoteKind.PREPARE
        else:
            return None
        key = (src, kind, message.view, message.seq)
        known = sent.setdefault(key, message.digest)
        if known == message.digest:
            return None
        return (
            f"{src} equivocated: two {kind.name}s for view {message.view} seq {message.seq} "
            f"({known.hex()[:8]} then {message.digest.hex()[:8]})"
        )

    return watch


def _unwrap(core: Core) -> PbftCore:
    while not isinstance(core, PbftCore):
        if isinstance(core, ByzantineCore | DurableStateCore | AttackCore):
            core = core.inner
        elif isinstance(core, TwinsCore):
            core = core.a
        else:
            raise TypeError(f"not a PBFT core: {type(core).__name__}")
    return core


def _decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)


PLAN_DEFAULTS: Mapping[str, int] = {"targeted_attacks": 1}
"""The simulator's knobs of the Byzantine plan (`choose_byzantine`), not of `PbftConfig`:
``targeted_attacks=0`` keeps the seeds' liars from drawing a targeted attack (``collude``
puts them at the primaries of views 0..f-1, the worst case of a leader-based protocol)."""

SIM_DEFAULTS: Mapping[str, int] = {
    "checkpoint_interval": 8,
    "log_window": 16,
    "batch_size": 4,
    "view_change_ticks": 20,
    "max_view_change_ticks": 80,
    "fetch_ticks": 10,
}
"""The simulator's `PbftConfig` fields (small, so that seeds cross checkpoints and water
marks quickly); `--set NAME=VALUE` replaces any of them (the scale bench batches more)."""


def pbft_setup(
    *,
    nodes: int,
    bugs: frozenset[str],
    seed: int,
    byzantine: int = 0,
    twins: int = 0,
    behaviours: tuple[str, ...] = (),
    overrides: Mapping[str, int] | None = None,
    machine: Callable[[], StateMachine] | None = None,
    targeted_attacks: bool = True,
) -> ProtocolSetup:
    """The simulator setup of a PBFT cluster `n1..nN`: `byzantine` replicas with seeded (or
    the given) behaviours and `twins` twinned replicas, chosen by `choose_byzantine` (with
    `targeted_attacks`); `overrides` replace `PbftConfig` fields of `SIM_DEFAULTS` (`--set
    batch_size=32`; the replicas' checkpoint policy follows `checkpoint_interval`);
    `machine` builds each replica's state machine (None: the KV store)."""
    knobs = {**SIM_DEFAULTS, **(overrides or {})}
    build: Callable[[], StateMachine] = KvStateMachine if machine is None else machine
    probe = build()
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    plan = choose_byzantine(seed, names, count=byzantine, twins=twins, behaviours=behaviours,
                            targeted_attacks=targeted_attacks)
    pbft_bugs = PbftBugs.from_names(bugs)
    wire.register_all(PBFT_MESSAGES)
    replicas = tuple(NodeId(n) for n in names)
    bootstrap = Configuration(voters=tuple(sorted(replicas)))
    cells: dict[str, PbftDurableState] = {}
    lossy: dict[str, PbftDurableState] = {}
    liars = dict(plan.behaviours)
    twinned = frozenset(NodeId(n) for n in plan.twins)
    side_a = frozenset(NodeId(n) for n in plan.side_a)
    channel = TwinsChannel()
    # Every replica's FastCrypto shares one memo of encodings and tags (the same values, less
    # CPU: a broadcast decodes to one object that n-1 replicas verify; `crypto_memo`).
    memo = CryptoMemo()
    corrupting = tuple(n for n, b in plan.behaviours if "corrupt_reply" in b)
    replies = BftReplies(names, corrupting, seed)
    checker = BftChecker(replies.issued)

    # Block stamps for an app that asks for block time (`wants_block_stamp`; the KV store
    # does not, a test's subclass with `BatchHooks` does).
    stamps = SIM_BLOCK_STAMP_SKEW_MS if isinstance(probe, BatchHooks) else 0
    # Likewise the app's own checkpoint digest (`CheckpointDigest`), if it has one.
    state_digest = digest_function(probe) if isinstance(probe, CheckpointDigest) else None

    def config(node: str) -> PbftConfig:
        return PbftConfig(
            block_stamp_skew_ms=stamps,
            node_id=NodeId(node),
            replicas=replicas,
            **knobs,  # type: ignore[arg-type]
        )

    config(names[0])  # a bad combination of knobs is a ValueError now, not in every core

    colluders = frozenset(NodeId(n) for n, b in plan.behaviours if b == ("collude",))
    collusion = None
    if colluders:
        rng = random.Random(f"pbft-collusion:{seed}")
        collusion = Collusion(config(names[0]), colluders, rng)

    def make_replica(node: str, storage: Storage, durable: DurableState) -> Replica:
        replica = Replica(
            build(),
            checkpoints=storage.checkpoints,
            wal=storage.wal,
            decode_entry=_decode_entry,
            policy=CheckpointPolicy(every_entries=knobs["checkpoint_interval"], every_bytes=0,
                                    compact_lag=0, aligned=True),
            config=bootstrap,
        )
        replica.restore_latest(replay_upto=0)
        return replica

    def restored(node: str, durable: DurableState) -> PbftRestoredState:
        forgotten = lossy.pop(node, None)  # it crashed right after sending early votes
        if forgotten is not None:
            cells[node] = forgotten
        return PbftRestoredState(
            durable=cells.get(node, PbftDurableState()),
            executed=durable.snapshot.index if durable.snapshot is not None else 0,
            checkpoint_data=durable.snapshot_bytes(),
        )

    def make_core(node: str, durable: DurableState, rng: random.Random) -> Core:
        crypto = FastCrypto(NodeId(node), memo=memo)
        honest: Core = DurableStateCore(
            PbftCore(
                config(node), crypto=crypto, restored=restored(node, durable), bugs=pbft_bugs,
                checkpoint_digest=state_digest,
            ),
            cells,
            lossy,
        )
        byz_rng = random.Random(f"pbft-byzantine-node:{seed}:{node}:{rng.getrandbits(32)}")
        if NodeId(node) in twinned:
            return TwinsCore(
                honest,
                lambda: PbftCore(config(node), crypto=crypto,
                                 restored=restored(node, durable), bugs=pbft_bugs,
                                 checkpoint_digest=state_digest),
                side_a=side_a,
                twinned=twinned,
                channel=channel,
                rng=byz_rng,
            )
        if node in liars and liars[node][0] in ATTACKS:
            return AttackCore(
                honest, attack=liars[node][0], config=config(node), crypto=crypto,
                rng=byz_rng, collusion=collusion,
            )
        if node in liars:
            return ByzantineCore(honest, behaviours=liars[node], crypto=crypto, rng=byz_rng)
        return honest

    def observe(core: Core) -> tuple[str, int, int]:
        pbft = _unwrap(core)
        # Never "primary": PBFT has no log for the leader-completeness check to compare.
        return "replica", pbft.view, pbft.executed

    return ProtocolSetup(
        names=names,
        codec=wire.default_registry(),
        make_core=make_core,
        make_replica=make_replica,
        observe=observe,
        leader_role="primary",
        checker=checker,
        replies=replies,
        byzantine=plan.nodes,
        description=f"byzantine: {plan.describe()}",
        watch_send=vote_watch(frozenset(n for n in names if n not in plan.nodes)),
        watch_types=frozenset({PrePrepare, Prepare}),
    )


def sim_setup(*, nodes: int, bugs: frozenset[str], checkpoint_every: int, knobs: Knobs,
              seed: int, byzantine: int, twins: int,
              machine: Callable[[], StateMachine] | None = None) -> ProtocolSetup:
    """`phalanx.protocols.builtin.PBFT.sim`: `pbft_setup`. PBFT draws no swarm knobs; `knobs`
    (`--set`) fix `SIM_DEFAULTS` fields or `PLAN_DEFAULTS` ones (0 or 1), another name is a
    TypeError naming them. It checkpoints every `checkpoint_interval` sequence numbers of
    its own config, not `checkpoint_every`."""
    known = (*SIM_DEFAULTS, *PLAN_DEFAULTS)
    unknown = sorted(k for k, _ in knobs if k not in known)
    if unknown:
        raise TypeError(f"unknown pbft sim knob(s) {unknown} (known: {', '.join(known)})")
    bad = sorted(k for k, v in knobs if k in SIM_DEFAULTS and (type(v) is not int or v < 1))
    if bad:
        raise ValueError(f"pbft sim knob(s) {bad} must be positive integers")
    flags = sorted(k for k, v in knobs if k in PLAN_DEFAULTS and v not in (0, 1))
    if flags:
        raise ValueError(f"pbft sim knob(s) {flags} must be 0 or 1")
    plan = {**PLAN_DEFAULTS, **{k: int(v) for k, v in knobs if k in PLAN_DEFAULTS}}
    return pbft_setup(nodes=nodes, bugs=bugs, seed=seed, byzantine=byzantine, twins=twins,
                      overrides={k: int(v) for k, v in knobs if k in SIM_DEFAULTS},
                      machine=machine, targeted_attacks=bool(plan["targeted_attacks"]))

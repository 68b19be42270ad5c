"""What the simulator needs to know about each protocol: how to build a core from durable
state, the replica layer over the KV app, the codec, and how to observe a core cheaply.

Owns: `ProtocolSetup` and `protocol_setup(name, ...)`; `PROTOCOLS` lists the names the CLI
offers (PBFT's setup lives in `phalanx.jepsen.sim.pbft`; the leaderless core joins here).

Rules: the only module of the simulator that imports concrete cores. Observation reads
attributes instead of `status()` on the hot path (status builds a dataclass per call), and
must not change the core.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core, Snapshot
from phalanx.consensus.raft.bugs import RaftBugs
from phalanx.consensus.raft.config import RaftConfig, RaftRestoredState
from phalanx.consensus.raft.core import RaftCore
from phalanx.consensus.raft.messages import RAFT_MESSAGES, RequestVote, RequestVoteResponse
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    HardState,
    Message,
    NodeId,
)
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.net import wire
from phalanx.net.codec import Registry
from phalanx.persistence import DurableState
from phalanx.storage.files import Storage

PROTOCOLS: tuple[str, ...] = ("raft", "pbft")

Observation = tuple[str, int, int]
"""(role, term, commit index) of a core."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolSetup:
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


def _decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)


Knobs = tuple[tuple[str, int | bool], ...]
"""Protocol tuning chosen per seed (swarm testing), as sorted `(name, value)` pairs: the
protocol's own config fields (e.g. Raft's `pre_vote`) plus `checkpoint_every`."""


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
) -> ProtocolSetup:
    """The setup of protocol `name` for a cluster of `nodes` replicas `n1..nN`.

    `knobs` override configuration fields of the protocol (unknown names raise TypeError:
    our own misuse) and `checkpoint_every`. `byzantine` replicas (PBFT only) lie with seeded
    behaviours and `twins` replicas are twinned (`phalanx.jepsen.sim.pbft`)."""
    if name == "pbft":
        from phalanx.jepsen.sim import pbft  # it imports this module: resolved at call time

        return pbft.pbft_setup(nodes=nodes, bugs=bugs, seed=seed, byzantine=byzantine, twins=twins)
    if byzantine or twins:
        raise ValueError(f"protocol {name!r} does not tolerate Byzantine replicas")
    options: dict[str, Any] = dict(knobs)
    checkpoint_every = int(options.pop("checkpoint_every", checkpoint_every))
    if name != "raft":
        raise ValueError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    wire.register_all(RAFT_MESSAGES)
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    voters = tuple(NodeId(n) for n in names)
    RaftConfig(node_id=voters[0], voters=voters, **options)  # bad knobs raise now
    raft_bugs = RaftBugs.from_names(bugs)  # the `--bug` names, checked now too
    bootstrap = Configuration(voters=voters)

    def make_replica(node: str, storage: Storage, durable: DurableState) -> Replica:
        replica = Replica(
            KvStateMachine(),
            checkpoints=storage.checkpoints,
            wal=storage.wal,
            decode_entry=_decode_entry,
            policy=CheckpointPolicy(every_entries=checkpoint_every, every_bytes=0, compact_lag=20),
            config=bootstrap,
        )
        # Only the checkpoint: the core re-emits committed entries after it on restart.
        replica.restore_latest(replay_upto=0)
        return replica

    def make_core(node: str, durable: DurableState, rng: random.Random) -> Core:
        snapshot = None
        if durable.snapshot is not None and durable.snapshot_data is not None:
            snapshot = Snapshot(meta=durable.snapshot, data=durable.snapshot_data)
        restored = RaftRestoredState(
            hard_state=durable.hard_state or HardState(),
            snapshot=snapshot,
            entries=durable.entries,
            recovering=durable.recovering,
        )
        config = RaftConfig(node_id=NodeId(node), voters=voters, **options)
        return RaftCore(config, rng=rng, restored=restored, bugs=raft_bugs)

    def observe(core: Core) -> Observation:
        assert isinstance(core, RaftCore)  # built by make_core above
        st = core.st  # (the shared state itself: no property calls on this hot path)
        return st.role._value_, st.term, core.ls.commit  # `_value_`: no Python descriptor

    return ProtocolSetup(
        names=names,
        codec=wire.default_registry(),
        watch_send=raft_vote_watch(),
        watch_types=frozenset({RequestVote, RequestVoteResponse}),
        make_core=make_core,
        make_replica=make_replica,
        observe=observe,
        leader_role="leader",
        recovers_lost_disk=True,
    )


def raft_vote_watch() -> Callable[[str, str, Message], str | None]:
    """Raft's vote safety, seen on the wire: a voter grants at most one candidate a (real,
    not pre-) vote per term (§3.4, Figure 3.1 `votedFor`), across crashes too: the vote must
    be durable before the grant is sent. Election safety rests on it, and it is visible even
    when the second grant arrives too late to elect a second leader. A candidate's own vote
    is seen as its (non-pre-vote) RequestVote of that term."""
    votes: dict[tuple[str, int], str] = {}

    def watch(src: str, dst: str, message: Message) -> str | None:
        if isinstance(message, RequestVote):
            if message.pre_vote:
                return None
            term, to = message.term, src  # a candidate votes for itself
        elif isinstance(message, RequestVoteResponse):
            if message.pre_vote or not message.vote_granted:
                return None
            term, to = message.term, dst
        else:
            return None
        first = votes.setdefault((src, term), to)
        if first == to:
            return None
        return f"{src} granted its term-{term} vote to {first} and then to {to}"

    return watch

"""Raft in the simulator (`phalanx.protocols.builtin.RAFT.sim`): cores built from durable
state, the replica layer over the KV app, cheap observation, and Raft's white-box vote check.

Owns: `raft_setup` and `raft_vote_watch`. Rules as `phalanx.jepsen.sim.protocols`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from phalanx.apps.interface import BatchHooks, StateMachine
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Core, Snapshot
from phalanx.consensus.raft.bugs import RaftBugs
from phalanx.consensus.raft.config import RaftConfig, RaftRestoredState
from phalanx.consensus.raft.core import RaftCore
from phalanx.consensus.raft.messages import RAFT_MESSAGES, RequestVote, RequestVoteResponse
from phalanx.consensus.types import Configuration, Entry, HardState, Message, NodeId
from phalanx.jepsen.sim.protocols import Knobs, Observation, ProtocolSetup
from phalanx.net import wire
from phalanx.runtime.persistence import DurableState
from phalanx.storage.files import Storage


def _decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)




def raft_setup(
    *,
    nodes: int,
    bugs: frozenset[str],
    checkpoint_every: int = 200,
    knobs: Knobs = (),
    seed: int = 0,
    byzantine: int = 0,
    twins: int = 0,
    machine: Callable[[], StateMachine] | None = None,
) -> ProtocolSetup:
    """A Raft cluster of `nodes` voters `n1..nN` (see `protocol_setup`). `knobs` override
    `RaftConfig` fields (unknown names raise TypeError: our own misuse) and
    `checkpoint_every`; the knob ``spares`` (the `membership` fault) adds that many nodes
    after them, outside the bootstrap configuration until a membership change adds them.
    Raft has no Byzantine replicas (`byzantine`, `twins` must be 0). `machine` builds each
    replica's state machine (None: the KV store)."""
    build: Callable[[], StateMachine] = KvStateMachine if machine is None else machine
    stamps = isinstance(build(), BatchHooks)  # an app that asks for block time
    if byzantine or twins:
        raise ValueError("raft does not tolerate Byzantine replicas")
    options: dict[str, Any] = dict(knobs)
    checkpoint_every = int(options.pop("checkpoint_every", checkpoint_every))
    spares = int(options.pop("spares", 0))
    wire.register_all(RAFT_MESSAGES)
    names = tuple(f"n{i}" for i in range(1, nodes + spares + 1))
    # Sorted, as configurations must be (from n = 10 on, "n10" sorts before "n2").
    voters = tuple(sorted(NodeId(n) for n in names[:nodes]))
    RaftConfig(node_id=voters[0], voters=voters, **options)  # bad knobs raise now
    raft_bugs = RaftBugs.from_names(bugs)  # the `--bug` names, checked now too
    bootstrap = Configuration(voters=voters)

    def make_replica(node: str, storage: Storage, durable: DurableState) -> Replica:
        replica = Replica(
            build(),
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
        # A spare is a learner of its own bootstrap configuration (as a `joined` node of a
        # real cluster): it never campaigns before the leader's log says what it is.
        config = RaftConfig(node_id=NodeId(node), voters=voters, **options,
                            learners=() if node in voters else (NodeId(node),))
        if stamps:
            config = dataclasses.replace(config, block_stamps=True)
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

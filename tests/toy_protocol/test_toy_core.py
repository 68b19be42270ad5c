"""The toy core on its own (a tiny lossless in-memory driver) and in the simulator: commits on
a majority, followers catch up after losses (from the log or a snapshot), restarts, hostile
input dropped and counted, determinism; seeded simulator runs through the registry."""

from __future__ import annotations

from collections import deque

import pytest

import toy_protocol
from phalanx.consensus.core import (
    CheckpointTaken,
    Input,
    Persisted,
    Ready,
    Receive,
    Submit,
    Tick,
)
from phalanx.consensus.types import (
    ClientRequest,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    Message,
    NodeId,
)
from phalanx.jepsen.sim.run import RunConfig, run
from phalanx.net import wire
from toy_protocol.core import LOG_TAIL, ToyCore
from toy_protocol.messages import TOY_MESSAGES, ToyAck, ToyAppend, ToySnapshot

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
MEMBERS = (N1, N2, N3)


def req(n: int, *, read_only: bool = False) -> ClientRequest:
    return ClientRequest(client_id="c", request_no=n, command=b"x%d" % n, read_only=read_only)


class Net:
    """Three cores; every Ready persisted at once (its entries kept as a node's durable log),
    messages queued and delivered in order unless the destination is `down`."""

    def __init__(self) -> None:
        self.cores = {n: ToyCore(node_id=n, members=MEMBERS) for n in MEMBERS}
        self.queue: deque[tuple[NodeId, NodeId, Message]] = deque()
        self.down: set[NodeId] = set()
        self.log: dict[NodeId, list[Entry]] = {n: [] for n in MEMBERS}
        self.applied: dict[NodeId, list[Entry]] = {n: [] for n in MEMBERS}
        self.hard: dict[NodeId, HardState | None] = dict.fromkeys(MEMBERS)
        self.readys: list[Ready] = []

    def step(self, node: NodeId, inp: Input) -> Ready:
        """Step `inp` (and the `Persisted` it causes); the first Ready."""
        first = len(self.readys)
        pending = deque([inp])
        while pending:
            ready = self.cores[node].step(pending.popleft())
            self.readys.append(ready)
            if ready.snapshot is not None:
                self.log[node] = []
                self.applied[node] = []  # the snapshot stands in for them
            self.log[node].extend(ready.entries)
            if ready.hard_state is not None:
                self.hard[node] = ready.hard_state
            for send in ready.messages:
                self.queue.append((node, send.to, send.message))
            self.applied[node].extend(ready.committed)
            if ready.has_persistence:
                pending.append(Persisted(number=ready.number))
        return self.readys[first]

    def deliver(self, *, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.queue:
                return
            src, dst, message = self.queue.popleft()
            if dst not in self.down:
                self.step(dst, Receive(src=src, message=message))

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            for n in MEMBERS:
                if n not in self.down:
                    self.step(n, Tick())
            self.deliver()


def test_leader_commits_on_a_majority_and_followers_apply_in_order() -> None:
    net = Net()
    net.tick()  # probes: the leader learns where its followers are
    net.down.add(N3)
    for i in range(5):
        net.step(N1, Submit(request=req(i)))
    net.deliver()
    net.tick(2)  # followers learn the commit index from heartbeats
    assert net.cores[N1].status().commit_index == 5
    assert [e.index for e in net.applied[N1]] == [1, 2, 3, 4, 5]
    assert net.applied[N2] == net.applied[N1]
    assert net.applied[N3] == []
    net.down.discard(N3)
    net.tick(4)  # n3's appends were lost: resent after heartbeats without progress
    assert net.applied[N3] == net.applied[N1]


def test_commits_pause_without_a_majority_and_resume() -> None:
    net = Net()
    net.tick()
    net.down |= {N2, N3}
    net.step(N1, Submit(request=req(1)))
    net.tick(5)
    assert net.cores[N1].status().commit_index == 0
    net.down.clear()
    net.tick(5)
    assert [c.status().commit_index for c in net.cores.values()] == [1, 1, 1]


def test_followers_reject_clients_with_the_leader_as_hint_and_reads_wait_for_the_log() -> None:
    net = Net()
    (rejection,) = net.step(N2, Submit(request=req(1))).rejected
    assert rejection.leader_hint == N1
    net.step(N1, Submit(request=req(2)))
    (read,) = net.step(N1, Submit(request=req(3, read_only=True))).reads
    assert read.index == 1  # the leader's last index when the read arrived


def test_a_lagging_follower_catches_up_from_a_snapshot_and_restarts_resume() -> None:
    net = Net()
    net.tick()
    net.down.add(N3)
    total = LOG_TAIL + 30
    for i in range(total):
        net.step(N1, Submit(request=req(i)))
        net.deliver()
    net.tick(2)
    for n in (N1, N2):  # the replica layer checkpointed what they applied
        net.step(n, CheckpointTaken(index=total, data=b"state"))
    net.down.discard(N3)
    net.tick(4)
    sent = [r for r in net.readys if r.snapshot is not None]
    assert len(sent) == 1
    assert sent[0].snapshot is not None
    assert sent[0].snapshot.meta.index == total
    assert sent[0].snapshot.data == b"state"
    assert net.cores[N3].status().commit_index == total
    # The leader restarts from its durable state (no checkpoint): it finds its followers
    # again and commits new writes.
    net.cores[N1] = ToyCore(node_id=N1, members=MEMBERS, hard_state=net.hard[N1],
                            entries=net.log[N1])
    net.applied[N1] = []
    net.tick()
    assert [e.index for e in net.applied[N1]] == list(range(1, total + 1))  # re-emitted
    net.step(N1, Submit(request=req(total)))
    net.tick(3)
    assert [c.status().commit_index for c in net.cores.values()] == [total + 1] * 3


def test_hostile_input_is_dropped_and_counted() -> None:
    net = Net()
    net.tick()  # past the first hard state
    leader, follower = net.cores[N1], net.cores[N2]
    entry = Entry(index=5, term=1, kind=EntryKind.COMMAND, requests=(req(1),))
    bad: list[tuple[ToyCore, NodeId, Message]] = [
        (follower, N3, ToyAppend(prev=0, entries=(), commit=9)),  # not from the leader
        (follower, NodeId("x"), ToyAck(match=0)),  # unknown sender
        (follower, N1, ToyAppend(prev=0, entries=(entry,), commit=0)),  # not contiguous
        (follower, N1, ToyAppend(prev=-1, entries=(), commit=0)),
        (follower, N1, ToySnapshot(index=-3, data=b"", commit=0, digest=b"")),
        (follower, N1, ToySnapshot(index=9, data=b"zz", commit=0, digest=b"\0" * 32)),
        (follower, N1, ToyAck(match=0)),  # a follower gets no acks
        (leader, N2, ToyAck(match=7)),  # beyond the leader's log
        (leader, N2, ToyAppend(prev=0, entries=(), commit=0)),  # the leader takes none
        (leader, N1, ToyAck(match=0)),  # from itself
        (leader, N2, Message()),
    ]
    for core, src, message in bad:
        ready = core.step(Receive(src=src, message=message))
        assert not ready.has_persistence
        assert not ready.messages
        assert not ready.committed
    assert sum(follower.status().dropped.values()) == 7
    assert follower.status().dropped["snapshot-digest"] == 1  # corrupted: never installed
    assert sum(leader.status().dropped.values()) == 4
    assert leader.status().dropped["ack-beyond-log"] == 1
    with pytest.raises(LocalProtocolError):
        leader.step(Persisted(number=99))  # our own misuse raises


def test_the_same_inputs_give_the_same_outputs() -> None:
    def trace() -> list[bytes]:
        net = Net()
        net.tick()
        net.down.add(N2)
        for i in range(10):
            net.step(N1, Submit(request=req(i)))
        net.tick(3)
        net.down.clear()
        net.tick(4)
        return [repr(r).encode() for r in net.readys]

    assert trace() == trace()


def test_wire_types_round_trip_through_the_codec() -> None:
    wire.register_all(TOY_MESSAGES)
    entry = Entry(index=1, term=1, kind=EntryKind.COMMAND, requests=(req(1),))
    for message in (ToyAppend(prev=0, entries=(entry,), commit=1), ToyAck(match=3, gap=True),
                    ToySnapshot(index=4, data=b"\x00s", commit=4, digest=b"d" * 32)):
        assert wire.decode(wire.encode(message)) == message
    assert all(tid in wire.RANGES["plugins"] for tid in TOY_MESSAGES)


SIM_FAULTS = ("kill", "pause", "partition-one", "partition-halves", "isolate-leader", "loss",
              "duplicate", "delay", "lose-unfsynced", "crash-after-ready", "straggle")
"""Every simulator fault a fixed-leader crash-tolerant log should survive (`lose-disk` is
a plain kill for a protocol without amnesia recovery: `ProtocolSetup.recovers_lost_disk`)."""


@pytest.mark.parametrize("seed", range(4))
def test_simulator_runs_the_toy_protocol(seed: int) -> None:
    assert toy_protocol.TOY.name == "toy"
    result = run(RunConfig(seed=seed, protocol="toy", faults=SIM_FAULTS,
                           nodes=3 if seed % 2 == 0 else 5))
    assert result.ok, result.report()
    assert result.linearizable is True
    assert result.ops_ok > 0
    assert result.faults_used


def test_the_simulator_catches_a_toy_that_commits_without_a_majority(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the simulator's checks do look at the toy (a leader that commits what
    only it holds is caught)."""

    def commit_alone(self: ToyCore) -> None:
        if self.is_leader:
            self._commit = max(self._commit, min(self._durable, self.last_index))

    monkeypatch.setattr(ToyCore, "_advance_commit", commit_alone)
    result = run(RunConfig(seed=0, protocol="toy", faults=("partition-one", "kill"),
                           swarm=False))
    assert not result.ok
    assert any(v.startswith("committed-durable") for v in result.violations), result.violations

"""InstallSnapshot catch-up that finishes: a windowed, resumable, acknowledged transfer.

The attack these reproduce (real clusters, before the fix): a restarted follower that needed
a 132 MB checkpoint stayed behind for minutes while the leader sent it 46 GB. Every heartbeat
answer made the leader re-send the outstanding chunk; the follower answered the duplicate
too, and each answer made the leader send the next chunk again, so every heartbeat started
one more full copy of the rest of the snapshot. A chunk at offset 0 made the follower drop
what it had, and a newer checkpoint at the leader restarted the transfer from zero.

Each test drives a three-node harness cluster (`raft_harness.Cluster`) where n3 crashed,
the leader compacted past it, and n3 came back empty, and counts the snapshot bytes n1 sends
n3 (`Counting`).
"""

from __future__ import annotations

import random

from raft_harness import Cluster, Node

from phalanx.consensus.core import CheckpointTaken, Persisted, Ready, Receive, Snapshot
from phalanx.consensus.raft import RaftConfig, RaftCore
from phalanx.consensus.raft.core import Campaign
from phalanx.consensus.raft.messages import (
    AppendEntriesResponse,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    RequestVoteResponse,
)
from phalanx.consensus.types import Configuration, Message, NodeId, SnapshotMeta

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
VOTERS = (N1, N2, N3)
CHUNK = 64
WINDOW = 4 * CHUNK


class Counting(Cluster):
    """The harness cluster, recording every InstallSnapshot n1 sends n3."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.chunks: list[InstallSnapshot] = []

    def _handle_ready(self, nid: NodeId, node: Node, rd: Ready) -> None:
        for s in (*rd.early_messages, *rd.messages):
            if nid == N1 and s.to == N3 and isinstance(s.message, InstallSnapshot):
                self.chunks.append(s.message)
        super()._handle_ready(nid, node, rd)

    def sent_bytes(self) -> int:
        return sum(len(m.data) for m in self.chunks)

    def in_flight_to_n3(self) -> int:
        return sum(len(m.data) for s, d, m in self.queue
                   if d == N3 and isinstance(m, InstallSnapshot))


def lagging_follower(n_cmds: int = 40, **kw: object) -> tuple[Counting, int, int]:
    """n1 leads, n3 missed `n_cmds` commands of ~100 bytes, n1 compacted past them and n3
    restarted empty. Returns the cluster, the checkpoint's index and its size in bytes."""
    c = Counting(election_ticks=10, heartbeat_ticks=1, snapshot_chunk_size=CHUNK,
                 snapshot_window_bytes=WINDOW, log_tail_after_compaction=0, **kw)
    c.verbose = False
    c.add_nodes(3)
    c.tick_election(N1)
    c.stabilize()
    c.crash(N3)
    for i in range(n_cmds):
        c.propose(N1, f"{i:04d}" + "x" * 96)
    c.stabilize()
    c.checkpoint(N1)
    snap = c.nodes[N1].core.snapshot
    assert snap is not None
    c.nodes[N3].disk.__init__()  # type: ignore[misc]  # n3 comes back with nothing
    c.restart(N3)
    return c, snap.meta.index, len(snap.data)


def core(nid: NodeId = N1, **kw: object) -> RaftCore:
    cfg = RaftConfig(node_id=nid, voters=VOTERS, **kw)  # type: ignore[arg-type]
    return RaftCore(cfg, rng=random.Random(7), restored=None)


def recv(c: RaftCore, src: NodeId, m: Message) -> Ready:
    rd = c.step(Receive(src=src, message=m))
    if rd.number:
        c.step(Persisted(number=rd.number))
    return rd


def sent(rd: Ready, kind: type) -> list[tuple[NodeId, Message]]:
    return [(s.to, s.message) for s in (*rd.early_messages, *rd.messages)
            if isinstance(s.message, kind)]


def make_leader(c: RaftCore) -> None:
    c.step(Campaign())
    for v in (N2, N3):
        if c.role.value != "leader":
            recv(c, v, RequestVoteResponse(term=c.term, vote_granted=True))
    assert c.role.value == "leader"


def caught_up(c: Cluster, index: int) -> bool:
    return c.nodes[N3].applied_index >= index


def deliver(c: Cluster, per_tick: int | None) -> None:
    """One delivery round; the n1<->n3 link carries at most `per_tick` messages each way,
    in order (None: no limit)."""
    if per_tick is None:
        c.deliver()
        return
    c.deliver(lambda s, d, m: N3 not in (s, d))
    c.deliver(lambda s, d, m: (s, d) == (N1, N3), limit=per_tick)
    c.deliver(lambda s, d, m: (s, d) == (N3, N1), limit=per_tick)


def run(c: Counting, index: int, *, per_tick: int | None, rounds: int = 3000,
        each_round: object = None) -> int:
    """Tick the leader once per round (a heartbeat each tick) and deliver a round of
    messages (`deliver`). Returns the rounds taken."""
    for r in range(rounds):
        if caught_up(c, index):
            return r
        c.tick(N1)
        deliver(c, per_tick)
        if callable(each_round):
            each_round()
    raise AssertionError(f"n3 did not catch up in {rounds} rounds; n1 sent "
                         f"{c.sent_bytes()} snapshot bytes")


def test_heartbeats_do_not_multiply_the_transfer_on_a_slow_link() -> None:
    # A link that carries 3 messages per heartbeat: many heartbeats pass while a window is in
    # flight. Each must not start another copy of the snapshot.
    c, index, size = lagging_follower()
    run(c, index, per_tick=3)
    assert c.nodes[N3].app == c.nodes[N1].app
    assert c.sent_bytes() <= 2 * size, (c.sent_bytes(), size)
    assert [m.offset for m in c.chunks].count(0) == 1  # never restarted from zero


def test_window_bounds_bytes_in_flight_and_is_used() -> None:
    c, index, size = lagging_follower()
    assert size > 4 * WINDOW
    peak = [0]

    def check() -> None:
        flying = c.in_flight_to_n3()
        assert flying <= WINDOW, flying
        peak[0] = max(peak[0], flying)

    run(c, index, per_tick=2, each_round=check)
    assert peak[0] > CHUNK  # pipelined, not stop-and-wait
    assert c.sent_bytes() <= size + WINDOW


def test_a_lost_chunk_is_resent_from_the_acknowledged_offset_not_from_zero() -> None:
    c, index, size = lagging_follower()
    lost: list[int] = []

    def lose_third_chunk() -> None:
        if lost:
            return
        third = [m for _, d, m in c.queue
                 if d == N3 and isinstance(m, InstallSnapshot) and m.offset == 2 * CHUNK]
        if third:
            lost.append(c.drop(lambda s, d, m: m is third[0]))

    run(c, index, per_tick=None, each_round=lose_third_chunk)
    assert lost == [1]
    assert c.nodes[N3].app == c.nodes[N1].app
    offsets = [m.offset for m in c.chunks]
    assert offsets.count(0) == 1
    assert offsets.count(2 * CHUNK) == 2  # the lost one, sent again
    assert c.sent_bytes() <= size + WINDOW


def test_no_retransmission_before_the_timeout() -> None:
    c, index, size = lagging_follower()
    # Let the transfer start, then lose everything in flight to n3 once.
    while not any(m.offset > 0 for m in c.chunks):
        c.tick(N1)
        c.deliver()
    c.drop(lambda s, d, m: d == N3 and isinstance(m, InstallSnapshot))
    sent_before = len(c.chunks)
    acked = c.nodes[N1].core.prs[N3].snapshot_offset
    limit = c.nodes[N1].core.prs[N3].stall_limit
    quiet = 0
    while len(c.chunks) == sent_before:
        c.tick(N1)
        c.deliver()  # heartbeats and their answers still flow
        quiet += 1
        assert quiet <= 2 * limit + 2, "the window was never resent"
    assert quiet >= limit - 1  # not on the first heartbeat answers (one was on its way)
    assert c.chunks[sent_before].offset == acked  # from the acknowledged offset
    run(c, index, per_tick=None)
    assert c.sent_bytes() <= size + 2 * WINDOW


def test_a_newer_checkpoint_mid_transfer_does_not_restart_it() -> None:
    c, index, size = lagging_follower()
    while sum(len(m.data) for m in c.chunks) < size // 2:
        c.tick(N1)
        deliver(c, 2)
    # Meanwhile n1 and n2 commit more and n1 takes a newer checkpoint.
    for i in range(10):
        c.propose(N1, f"late{i}")
    for _ in range(50):
        c.deliver(lambda s, d, m: N3 not in (s, d))
    c.checkpoint(N1)
    newer = c.nodes[N1].core.snapshot
    assert newer is not None
    assert newer.meta.index > index
    run(c, newer.meta.index, per_tick=2)
    assert {m.last_included_index for m in c.chunks} == {index}  # kept sending the first
    assert [m.offset for m in c.chunks].count(0) == 1
    assert c.sent_bytes() <= size + WINDOW
    assert c.nodes[N3].app == c.nodes[N1].app  # caught up through entries after it


def test_follower_keeps_its_prefix_when_the_same_snapshot_starts_again() -> None:
    # A leader that lost track (or a retransmission of chunk 0) must not make the follower
    # discard the valid prefix it holds: it answers with where it is.
    c = core(N2)
    cfg = Configuration(voters=VOTERS)

    def chunk(off: int, data: bytes, done: bool = False) -> InstallSnapshot:
        return InstallSnapshot(term=1, leader_id=N1, last_included_index=10,
                               last_included_term=1, config=cfg, offset=off, data=data,
                               done=done)

    def answer(rd: Ready) -> int:
        msg: Message = sent(rd, InstallSnapshotResponse)[0][1]
        assert isinstance(msg, InstallSnapshotResponse)
        return msg.next_offset

    assert answer(recv(c, N1, chunk(0, b"abc"))) == 3
    assert answer(recv(c, N1, chunk(3, b"def"))) == 6
    assert answer(recv(c, N1, chunk(0, b"abc"))) == 6  # the prefix is kept
    assert answer(recv(c, N1, chunk(3, b"def"))) == 6
    rd = recv(c, N1, chunk(6, b"gh", done=True))
    assert rd.snapshot == Snapshot(meta=SnapshotMeta(index=10, term=1, config=cfg),
                                   data=b"abcdefgh")


def test_leader_resumes_from_the_offset_the_follower_reports() -> None:
    c = core(pre_vote=False, snapshot_chunk_size=4, log_tail_after_compaction=0)
    make_leader(c)
    recv(c, N3, AppendEntriesResponse(term=1, success=True, match_index=1))
    c.step(CheckpointTaken(index=1, data=b"0123456789abcdef"))
    rd = recv(c, N2, HeartbeatResponse(term=1))
    assert [(m.offset, m.data) for _, m in sent(rd, InstallSnapshot)] == [(0, b"0123")]  # type: ignore[attr-defined]
    # n2 already held 12 bytes of this snapshot: the leader continues from there.
    rd = recv(c, N2, InstallSnapshotResponse(term=1, last_included_index=1, next_offset=12,
                                             done=False))
    assert [(m.offset, m.data, m.done) for _, m in sent(rd, InstallSnapshot)] == [  # type: ignore[attr-defined]
        (12, b"cdef", True)]


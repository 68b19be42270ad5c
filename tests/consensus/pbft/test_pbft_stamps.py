"""Block stamps in PBFT (`consensus/pbft/stamp.py`): the primary's clock and id agreed with
each batch, the same in every replica's committed Entry, kept across a view change, and a
Byzantine primary that lies about time refused (dropped and counted, never raised).
Control: with the backups' stamp check switched off, the lying primary's far-future time
commits, so the refusals below are what keeps it out."""

from __future__ import annotations

import pytest
from pbft_harness import Cluster, req

from phalanx.consensus.core import Tick
from phalanx.consensus.crypto import digest_of
from phalanx.consensus.pbft import vote_flow
from phalanx.consensus.pbft.messages import Commit, PrePrepare
from phalanx.consensus.pbft.stamp import batch_digest
from phalanx.consensus.types import ClientRequest, Entry, Message, NodeId

T = 1_700_000_000_000
SKEW = 2000


def clocks(c: Cluster, now: dict[NodeId, int]) -> None:
    for node, ms in now.items():
        c.step(node, Tick(now_ms=ms))


def commands(c: Cluster, node: NodeId) -> list[Entry]:
    return [e for e in c.entries[node] if e.requests]


def lie(c: Cluster, seq: int, batch: tuple[ClientRequest, ...], ts: int,
        proposer: str = "n0", *, digest: bytes | None = None) -> None:
    """Byzantine n0 (the view-0 primary) sends a signed stamped pre-prepare to every backup."""
    pp = PrePrepare(view=0, seq=seq, batch=batch, replica=NodeId("n0"), timestamp=ts,
                    proposer=proposer,
                    digest=digest or batch_digest(c.crypto[NodeId("n0")], batch, ts, proposer))
    signed = c.byz_sign(NodeId("n0"), pp)
    for backup in c.honest():
        c.inject(NodeId("n0"), backup, signed)
    c.deliver()


def byzantine_primary() -> Cluster:
    c = Cluster(4, byzantine=(0,), block_stamp_skew_ms=SKEW)
    clocks(c, {NodeId("n1"): T, NodeId("n2"): T + 300, NodeId("n3"): T - 300})
    return c


def test_every_replica_commits_the_primary_stamp_and_time_never_goes_back() -> None:
    c = Cluster(4, block_stamp_skew_ms=SKEW)
    clocks(c, {NodeId("n0"): T, NodeId("n1"): T + 500, NodeId("n2"): T - 500,
               NodeId("n3"): T})
    c.submit(NodeId("n0"), req("a", 1))
    c.deliver()
    clocks(c, {NodeId("n0"): T - 400})  # the primary's clock steps back (NTP)
    c.submit(NodeId("n0"), req("a", 2))
    c.deliver()
    for node in c.honest():
        got = [(e.timestamp, e.proposer) for e in commands(c, node)]
        assert got == [(T, "n0"), (T, "n0")], (node, got)  # the second kept the floor
    assert all(not c.dropped(n) for n in c.honest())


@pytest.mark.parametrize(("ts", "proposer", "reason"), [
    (T + 10_000, "n0", "stamp_off_clock"),   # far ahead of every backup's clock
    (T - 10_000, "n0", "stamp_off_clock"),   # far behind
    (0, "n0", "bad_stamp"),
    (T, "n2", "bad_stamp"),                  # claims another replica proposed it
])
def test_a_lying_primary_is_refused_by_every_backup(ts: int, proposer: str,
                                                    reason: str) -> None:
    c = byzantine_primary()
    lie(c, 1, (req("a", 1),), ts, proposer)
    for node in c.honest():
        assert c.dropped(node) == {reason: 1}, node
        assert not c.entries[node]
    assert not any(m for _, _, m in c.byz_inbox if not isinstance(m, PrePrepare))


def test_a_lying_primary_cannot_move_time_backwards() -> None:
    c = byzantine_primary()
    lie(c, 1, (req("a", 1),), T + 200)
    assert all([e.timestamp for e in commands(c, n)] == [T + 200] for n in c.honest())
    lie(c, 2, (req("a", 2),), T + 100)  # within every clock's bound, below the last block
    # Out of order: seq 4 arrives first, then seq 3 with a later time than seq 4.
    lie(c, 4, (req("a", 4),), T + 300)
    lie(c, 3, (req("a", 3),), T + 400)
    for node in c.honest():
        assert c.dropped(node) == {"stamp_backwards": 2}, node
        assert [e.timestamp for e in commands(c, node)] == [T + 200]


def test_the_digest_covers_the_stamp() -> None:
    c = byzantine_primary()
    batch = (req("a", 1),)
    # A digest of the batch alone (or of another time) does not match the stamped batch.
    lie(c, 1, batch, T, digest=digest_of(c.crypto[NodeId("n0")], batch))
    lie(c, 2, batch, T, digest=batch_digest(c.crypto[NodeId("n0")], batch, T + 1, "n0"))
    for node in c.honest():
        assert c.dropped(node) == {"bad_digest": 2}


def test_without_stamps_a_stamped_pre_prepare_is_refused_and_digests_are_unchanged() -> None:
    c = Cluster(4, byzantine=(0,))
    crypto = c.crypto[NodeId("n0")]
    batch = (req("a", 1),)
    assert batch_digest(crypto, batch) == digest_of(crypto, batch)
    lie(c, 1, batch, T)
    for node in c.honest():
        assert c.dropped(node) == {"unexpected_stamp": 1}


def test_control_without_the_backups_check_the_lie_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vote_flow, "check_stamp", lambda *a, **k: None)
    c = byzantine_primary()
    lie(c, 1, (req("a", 1),), T + 3_600_000)
    assert all([e.timestamp for e in commands(c, n)] == [T + 3_600_000] for n in c.honest())


def test_a_view_change_keeps_the_stamp_and_the_original_proposer() -> None:
    c = Cluster(4, block_stamp_skew_ms=SKEW)
    clocks(c, {n: T + 10 * i for i, n in enumerate(c.ids)})

    def no_commits(src: NodeId, dst: NodeId, msg: Message) -> bool:
        return not isinstance(msg, Commit)

    c.filter = no_commits  # the batch prepares everywhere but commits nowhere in view 0
    c.submit(NodeId("n0"), req("a", 1))
    c.deliver()
    assert not any(c.entries[n] for n in c.honest())
    c.filter = None
    c.crash(NodeId("n0"))
    for _ in range(60):
        c.tick()
        c.deliver()
    survivors = [n for n in c.honest() if n not in c.down]
    for node in survivors:
        [entry] = commands(c, node)
        assert entry.term >= 1  # executed in a later view, re-proposed by its primary
        assert (entry.timestamp, entry.proposer) == (T, "n0")

"""Votes just above a backup's high water mark are kept until its window moves
(`log.AheadVotes`): a backup that learns of a stable checkpoint after the primary (its
checkpoint votes are still on the way) must not lose the pre-prepares the primary already
sent above its old window. Before, they were dropped for good ("out_of_window") and the
slot stalled until a view change; over the simulated WAN with f replicas crashed (every
correct replica needed for a quorum) that stalled the whole cluster (docs/SCALE.md)."""

from __future__ import annotations

from pbft_harness import Cluster, req

from phalanx.consensus.pbft.messages import Checkpoint, Prepare
from phalanx.consensus.types import Message, NodeId


def _lagging_checkpoints(c: Cluster, lag: NodeId) -> list[tuple[NodeId, NodeId, Message]]:
    """Hold back every checkpoint vote to `lag` (returned list: what was held)."""
    held: list[tuple[NodeId, NodeId, Message]] = []

    def hold(src: NodeId, dst: NodeId, msg: Message) -> bool:
        if dst == lag and isinstance(msg, Checkpoint):
            held.append((src, dst, msg))
            return False
        return True

    c.filter = hold
    return held


def test_pre_prepare_above_the_window_is_kept_until_the_window_moves() -> None:
    c = Cluster(4, batch_size=1, checkpoint_interval=2, log_window=4)
    lag = c.ids[3]
    held = _lagging_checkpoints(c, lag)
    for no in range(1, 5):  # seqs 1..4: the others' stable checkpoint moves to 4
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    assert c.cores[lag].status().high_water == 4
    assert c.cores[c.ids[0]].status().low_water == 4
    c.submit(c.ids[0], req("a", 5))  # seq 5: above the lagging backup's window
    c.deliver()
    assert len(c.app[c.ids[0]]) == 5
    assert len(c.app[lag]) == 4
    c.filter = None
    for src, dst, msg in held:  # the checkpoint votes arrive at last
        c.inject(src, dst, msg)
    c.deliver()
    assert c.cores[lag].status().low_water == 4
    assert len(c.app[lag]) == 5, "seq 5's votes were dropped, not kept"
    assert "out_of_window" not in c.dropped(lag)
    c.assert_agreement()


def test_votes_kept_ahead_are_bounded_per_sender() -> None:
    c = Cluster(4, byzantine=(3,), batch_size=1, checkpoint_interval=2, log_window=4)
    byz, target = c.ids[3], c.ids[1]
    for seq in range(5, 9):  # (high, high + L]: kept, up to 3L per sender
        for digest in (b"a", b"b", b"c", b"d"):
            c.inject(
                byz, target, c.byz_sign(byz, Prepare(view=0, seq=seq, digest=digest, replica=byz))
            )
    c.inject(byz, target, c.byz_sign(byz, Prepare(view=0, seq=9, digest=b"a", replica=byz)))
    c.deliver()
    dropped = c.dropped(target)
    assert dropped.get("ahead_overflow") == 16 - 12
    assert dropped.get("out_of_window") == 1  # beyond one window ahead: dropped at once
    c.submit(c.ids[0], req("a", 1))  # the honest cluster still works
    c.deliver()
    assert all(len(c.app[i]) == 1 for i in c.honest())

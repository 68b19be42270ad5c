"""Bringing lagging replicas back: a replica stuck in an older view (it was cut off during the
view change, or restarted) is sent the NewView by the primary it speaks to and rejoins;
the next-view buffer is bounded per sender, so one Byzantine flood cannot crowd out the
honest replicas' messages; a lost checkpoint vote is sent again."""

from __future__ import annotations

from pbft_harness import Cluster, req

from phalanx.consensus.core import Receive
from phalanx.consensus.pbft import PbftConfig, PbftCore
from phalanx.consensus.pbft.messages import Checkpoint, NewView, Prepare
from phalanx.consensus.types import Message, NodeId


def test_a_replica_left_in_an_older_view_gets_the_new_view_and_rejoins() -> None:
    c = Cluster(4, batch_size=1, view_change_ticks=4)
    old = c.ids[0]  # the primary of view 0, cut off while the others change view
    c.filter = lambda src, dst, msg: old not in (src, dst)
    for i in c.ids[1:]:
        c.submit(i, req("a", 0))
    for _ in range(30):
        c.tick(1, nodes=list(c.ids[1:]))
        c.deliver()
    assert {c.cores[i].view for i in c.ids[1:]} == {1}
    assert c.cores[old].view == 0
    c.filter = None
    c.submit(old, req("b", 0))  # it still leads view 0 in its own eyes: a stale pre-prepare
    c.deliver()
    # It holds the NewView but none of the ViewChanges it names (cut off): it fetches them
    # after `view_change_fetch_ticks` and then enters view 1.
    assert c.cores[old].view == 0
    for _ in range(2):
        c.tick(1, nodes=[old])
        c.deliver()
    assert c.cores[old].view == 1
    assert c.cores[old].status().view_active
    for i in c.ids[1:]:
        assert c.cores[i].status().dropped.get("wrong_view", 0) >= 1
    sent = [m for src, _, m in c.net if isinstance(m, NewView)]
    assert sent == []  # delivered; resends are rate-limited per peer
    c.submit_all(req("b", 1))
    c.deliver()
    for _ in range(12):  # the gap (seq 1, missed while cut off) is fetched from f+1 peers
        c.tick(1)
        c.deliver()
    for i in c.ids:
        done = {(r.client_id, r.request_no) for e in c.entries[i] for r in e.requests}
        assert ("b", 1) in done, i
    c.assert_agreement()


def test_a_restarted_replica_learns_the_current_view_from_its_first_fetch() -> None:
    # A replica restarted into an older view that sends nothing else (no client traffic)
    # still rejoins: its first FetchCommitted carries its view, and the primary of the
    # current view answers with its NewView.
    c = Cluster(4, batch_size=1, view_change_ticks=4)
    old = c.ids[0]
    c.crash(old)  # the primary of view 0 dies: the other three move to view 1
    for i in c.ids[1:]:
        c.submit(i, req("a", 0))
    for _ in range(30):
        c.tick(1, nodes=list(c.ids[1:]))
        c.deliver()
    assert {c.cores[i].view for i in c.ids[1:]} == {1}
    c.restart(old)
    assert c.cores[old].view == 0
    for _ in range(3):  # the NewView, then (after view_change_fetch_ticks) the ViewChanges
        c.tick(1, nodes=[old])
        c.deliver()
    assert c.cores[old].view == 1
    assert c.cores[old].status().view_active


def test_the_next_view_buffer_is_bounded_per_sender() -> None:
    ids = tuple(NodeId(f"n{i}") for i in range(4))
    cfg = PbftConfig(node_id=ids[1], replicas=ids, log_window=8, checkpoint_interval=4)
    from phalanx.consensus.crypto import FastCrypto

    core = PbftCore(cfg, crypto=FastCrypto(ids[1]))
    share = 3 * cfg.log_window
    for k in range(share + 5):  # a flood of future-view votes from n2
        core.step(Receive(src=ids[2], message=Prepare(view=7, seq=1 + k % 8, digest=bytes([k]),
                                                      replica=ids[2])))
    assert core.status().dropped == {"future_view_overflow": 5}
    # n3's message for the next view still finds room.
    core.step(Receive(src=ids[3], message=Prepare(view=1, seq=1, digest=b"d", replica=ids[3])))
    assert core.status().dropped == {"future_view_overflow": 5}


def test_a_fetch_from_an_older_view_is_answered_with_the_new_view() -> None:
    # A restarted replica transferring to a checkpoint its peers no longer hold only sends
    # FetchCheckpoint: the primary of the current view answers with its NewView (whose
    # certificate names a newer checkpoint), at most once per fetch_ticks per peer.
    from phalanx.consensus.pbft.messages import FetchCheckpoint

    c = Cluster(4, batch_size=1, view_change_ticks=4)
    old = c.ids[0]
    c.crash(old)
    for i in c.ids[1:]:
        c.submit(i, req("a", 0))
    for _ in range(30):
        c.tick(1, nodes=list(c.ids[1:]))
        c.deliver()
    primary = c.ids[1]
    assert c.cores[primary].view == 1
    ask = FetchCheckpoint(seq=64, replica=old, view=0)
    ready = c.cores[primary].step(Receive(src=old, message=ask))
    assert [type(s.message) for s in ready.messages if s.to == old] == [NewView]
    again = c.cores[primary].step(Receive(src=old, message=ask))
    assert not [s for s in again.messages if isinstance(s.message, NewView)]
    current = c.cores[c.ids[2]].step(
        Receive(src=old, message=FetchCheckpoint(seq=64, replica=old, view=1)))
    assert not [s for s in current.messages if isinstance(s.message, NewView)]


def test_lost_checkpoint_votes_are_sent_again_so_the_water_marks_still_move() -> None:
    # With one replica silent (f = 1 at n = 4), a stable checkpoint needs all three honest
    # votes. Every vote for seq 4 is lost (a partition): before the periodic re-broadcast,
    # no replica ever had the certificate and the cluster stopped at the high water mark.
    c = Cluster(4, byzantine=(3,), batch_size=1, checkpoint_interval=4, log_window=8,
                checkpoint_resend_ticks=5)
    lost: list[Checkpoint] = []

    def lose_votes(src: NodeId, dst: NodeId, msg: Message) -> bool:
        if isinstance(msg, Checkpoint):
            lost.append(msg)
            return False
        return True

    c.filter = lose_votes
    for n in range(4):
        c.submit_all(req("a", n))
        c.deliver()
    assert lost
    assert {c.cores[i].status().low_water for i in c.honest()} == {0}
    c.filter = None
    c.tick(5)
    c.deliver()
    assert {c.cores[i].status().low_water for i in c.honest()} == {4}
    c.assert_agreement()


def test_a_restarted_replica_votes_again_for_its_unstable_checkpoint() -> None:
    # The same lost votes, but n0 is also restarted before the heal: its vote died with the
    # process, so it signs it again from the checkpoint it restarts from.
    c = Cluster(4, byzantine=(3,), batch_size=1, checkpoint_interval=4, log_window=8,
                checkpoint_resend_ticks=5)
    c.filter = lambda src, dst, msg: not isinstance(msg, Checkpoint)
    for n in range(4):
        c.submit_all(req("a", n))
        c.deliver()
    assert {c.cores[i].status().low_water for i in c.honest()} == {0}
    c.crash(c.ids[0])
    c.restart(c.ids[0])
    c.filter = None
    c.tick(5)
    c.deliver()
    assert {c.cores[i].status().low_water for i in c.honest()} == {4}
    c.assert_agreement()

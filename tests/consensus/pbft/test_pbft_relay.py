"""Backups relay a client request to the primary only after `forward_ticks` ticks, and only
when no pre-prepare carries it yet. Clients send a request to the primary alone and to every
replica on a retransmission (`phalanx.client.async_client`): a request a backup got directly is one
the
primary was slow with, lost, or ignored, and the backup's view-change timer runs for it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pbft_harness import Cluster, req

from phalanx.consensus.pbft.messages import ForwardRequest
from phalanx.consensus.types import Message, NodeId


def _forwards(c: Cluster) -> list[tuple[str, str]]:
    return [(src, dst) for src, dst, m in c.net if isinstance(m, ForwardRequest)]


def test_a_request_only_a_backup_got_is_relayed_after_forward_ticks() -> None:
    c = Cluster(4, batch_size=1, forward_ticks=3)
    backup = c.ids[1]
    c.submit(backup, req("a", 1))
    assert _forwards(c) == []  # not at once
    c.tick(2)
    assert _forwards(c) == []
    c.tick(1)
    assert _forwards(c) == [(backup, c.ids[0])]
    c.deliver()
    for i in c.honest():
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1"]
    c.tick(10)
    assert _forwards(c) == []  # relayed once


def test_a_request_the_primary_ordered_is_never_relayed() -> None:
    c = Cluster(4, batch_size=1, forward_ticks=3)
    c.submit_all(req("a", 1))
    c.deliver()
    c.tick(5)
    assert _forwards(c) == []
    for i in c.honest():
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1"]


def test_a_request_in_a_pre_prepare_not_yet_executed_is_not_relayed() -> None:
    c = Cluster(4, batch_size=1, forward_ticks=2)
    c.submit_all(req("a", 1))
    # Deliver only the pre-prepares: the backups hold the request in an ordered slot.
    c.net = [m for m in c.net if type(m[2]).__name__ == "PrePrepare"]
    c.deliver()
    c.net = []  # drop their prepares: nothing executes
    c.tick(4)
    assert _forwards(c) == []


def test_forward_ticks_zero_relays_at_once() -> None:
    c = Cluster(4, batch_size=1, forward_ticks=0)
    c.submit(c.ids[2], req("a", 1))
    assert _forwards(c) == [(c.ids[2], c.ids[0])]


@settings(max_examples=30, deadline=None)
@given(delay=st.integers(min_value=0, max_value=6),
       got=st.sets(st.integers(min_value=0, max_value=3), min_size=1))
def test_every_request_executes_once_whoever_received_it(delay: int, got: set[int]) -> None:
    c = Cluster(4, batch_size=1, forward_ticks=delay)
    for i in sorted(got):
        c.submit(c.ids[i], req("a", 1))
    for _ in range(delay + 2):
        c.deliver()
        c.tick(1)
    c.deliver()
    for i in c.honest():
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1"]
    c.assert_agreement()


def test_a_primary_that_ignores_a_request_is_replaced_after_the_retransmission() -> None:
    # A (Byzantine) primary that ignores one client request, even when relayed, but
    # otherwise follows the protocol. Sent to the primary alone, the request is never
    # ordered and no backup notices; the client's retransmission to every replica starts
    # the backups' view-change timers, and the next primary orders it.
    c = Cluster(4, batch_size=1, forward_ticks=2, view_change_ticks=6)
    primary, target = c.ids[0], req("a", 1)

    def censor(src: NodeId, dst: NodeId, msg: Message) -> bool:
        return not (dst == primary and isinstance(msg, ForwardRequest))

    c.filter = censor
    # First attempt: to the primary alone, which ignores it (never steps it).
    c.tick(40)
    c.deliver()
    assert all(c.cores[i].view == 0 for i in c.ids)
    assert all(c.entries[i] == [] for i in c.ids)
    # Retransmission: to every replica (the primary still ignores its copy).
    for backup in c.ids[1:]:
        c.submit(backup, target)
    for _ in range(40):
        c.tick(1)
        c.deliver()
    assert _forwards(c) == []  # every relay to the primary was delivered (and ignored)
    assert all(c.cores[i].view >= 1 for i in c.ids[1:])
    for i in c.ids[1:]:
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1"]
    c.assert_agreement()

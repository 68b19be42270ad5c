"""The pull of overdue pending transactions (`refetch.OverdueFetch`): one peer per ask,
rotating, at an exponential backoff, capped per period, reset by news; and in a cluster with
a backlog that cannot be decided, each node's pull per period is bounded (it was every
overdue transaction of every peer, every period: docs/LEADERLESS.md)."""

from __future__ import annotations

import itertools
from collections import Counter

from leaderless_harness import submit_split_pairs
from test_leaderless_ordered_veto import N1, N2, N3, N4, OrderedCluster, state

from phalanx.consensus.core import Input, Ready, Send
from phalanx.consensus.leaderless.messages import FetchTransactions, TxId
from phalanx.consensus.leaderless.refetch import (
    FIRST_ASK_PEERS,
    LIVE_PERIODS,
    MAX_BACKOFF_PERIODS,
    MAX_OVERDUE_IDS,
    OverdueFetch,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

EVERY = 20
PEERS = (N2, N3, N4)


def _ids(k: int) -> list[TxId]:
    return [TxId(bytes([i % 256, i // 256]) * 16) for i in range(k)]


def _asks(sends: list[Send]) -> list[tuple[NodeId, TxId]]:
    out = []
    for send in sends:
        assert isinstance(send.message, FetchTransactions)
        out += [(send.to, t) for t in send.message.tx_ids]
    return out


def _always(_tx_id: TxId) -> bool:
    return True


def test_first_every_peer_then_one_peer_per_ask_rotating_at_a_doubling_backoff() -> None:
    f = OverdueFetch(peers=PEERS, every=EVERY, max_entries=100)
    (t,) = _ids(1)
    f.add(t, 0)
    asked: dict[int, list[NodeId]] = {}
    for period in range(40):
        got = _asks(f.due(period * EVERY, _always))
        if got:
            asked[period] = [p for p, _ in got]
    assert list(asked) == [0, 1, 3, 7, 15, 23, 31, 39]  # waits 1, 2, 4, then 8 periods
    assert MAX_BACKOFF_PERIODS == 8
    assert sorted(asked.pop(0)) == sorted(PEERS)  # the first ask: FIRST_ASK_PEERS (all 3)
    assert FIRST_ASK_PEERS == 3
    assert all(len(p) == 1 for p in asked.values())  # then one peer per ask ...
    peers = [p[0] for p in asked.values()]
    assert all(a != b for a, b in itertools.pairwise(peers))  # ... rotating
    assert set(peers[:3]) == set(PEERS)


def test_the_asks_of_a_period_are_capped_and_every_id_comes_in_turn() -> None:
    f = OverdueFetch(peers=PEERS, every=EVERY, max_entries=10_000)
    ids = _ids(1000)
    for t in ids:
        f.add(t, 0)
    seen: Counter[TxId] = Counter()
    for period in range(4):
        sends = f.due(period * EVERY, _always)
        assert all(isinstance(s.message, FetchTransactions) and len(s.message.tx_ids) <= 64
                   for s in sends)
        got = _asks(sends)
        assert len({t for _, t in got}) == MAX_OVERDUE_IDS
        assert len(got) <= MAX_OVERDUE_IDS * FIRST_ASK_PEERS
        seen.update(t for _, t in got)
    assert set(seen) == set(ids)  # the never-asked ones go first


def test_news_and_a_healed_peer_reset_the_backoff() -> None:
    f = OverdueFetch(peers=PEERS, every=EVERY, max_entries=100)
    a, b = _ids(2)
    f.add(a, 0)
    f.add(b, 0)
    for period in range(8):  # a and b now wait 8 periods
        f.due(period * EVERY, _always)
    now = 8 * EVERY
    assert _asks(f.due(now, _always)) == []
    f.add(a, now)  # named again (a digest: committed at a peer)
    again = _asks(f.due(now + EVERY, _always))
    assert [t for _, t in again] == [a] * 3  # news: a first ask again
    (single,) = _asks(f.due(now + 2 * EVERY, _always))
    assert single[1] == a
    f.add(a, now + 2 * EVERY)  # named again: a first ask again ...
    assert len(_asks(f.due(now + 2 * EVERY, _always))) == 3
    (after,) = _asks(f.due(now + 3 * EVERY, _always))
    assert after[0] != single[0]  # ... and the rotation goes on (not back to the same peer)
    f.heard(N3, now)
    f.heard(N3, now + EVERY)  # within LIVE_PERIODS: no news
    assert b not in [t for _, t in _asks(f.due(now + 4 * EVERY, _always))]
    f.heard(N3, now + (3 + LIVE_PERIODS) * EVERY)  # back after a silence: ask everything
    assert sorted(t for _, t in _asks(f.due(now + (3 + LIVE_PERIODS) * EVERY, _always))) == [
        a, b]


def test_peers_heard_recently_are_asked_first_and_decided_ids_leave() -> None:
    f = OverdueFetch(peers=PEERS, every=EVERY, max_entries=100)
    ids = _ids(30)
    for t in ids:
        f.add(t, 0)
    f.heard(N3, 0)  # n2 and n4 silent (down or cut off)
    assert {p for p, _ in _asks(f.due(0, _always))} == {N3}
    f.heard(N2, EVERY)
    assert {p for p, _ in _asks(f.due(EVERY, lambda t: t != ids[0]))} == {N2, N3}
    assert len(f) == 29


class Counting(OrderedCluster):
    """Counts the ids each node asks about, per period."""

    asked: Counter[tuple[NodeId, TxId]]

    def step(self, node: NodeId, inp: Input) -> Ready:
        ready = super().step(node, inp)
        for send in ready.messages:
            if isinstance(send.message, FetchTransactions):
                for t in send.message.tx_ids:
                    self.asked[node, t] += 1
        return ready


def test_a_backlog_that_cannot_be_decided_costs_a_bounded_pull_and_clears_when_it_can() -> None:
    """n4 down; 30 conflicting pairs split so neither of a pair reaches Q = 3, and no veto
    can drop them without n4: 60 transactions stay pending past their deadlines at n1..n3.
    Over 10 periods each node asks about each of them at most 4 times, one peer each time
    (before: 3 peers x 10 periods = 30 asks each). Once n4 is back, all are dropped."""
    c = Counting(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                 stuck_resolution="veto")
    c.asked = Counter()
    c.down.add(N4)
    c.tick()
    pairs = submit_split_pairs(c, 30)
    for t1, t2 in pairs:
        c.submit(t1, to=(N3,))
        c.submit(t2, to=(N1, N2))
    c.deliver()
    txs = [t for pair in pairs for t in pair]
    c.tick(rounds=40)
    c.asked = Counter()
    every = c.nodes[N1].core._config.rebroadcast_ticks
    c.tick(rounds=10 * every)
    live = (N1, N2, N3)
    assert all(state(c, n, t) is TxState.PENDING for n in live for t in txs)
    assert len(c.asked) == 3 * len(txs)  # every node still asks about every one ...
    assert max(c.asked.values()) <= 4  # ... at most 4 times in 10 periods
    c.down.discard(N4)
    c.restart(N4)
    c.tick(rounds=120)
    assert all(state(c, n, t) is TxState.DROPPED for n in (*live, N4) for t in txs)

"""The periodic `CommittedDigest` round-robin is staggered by each node's position: in every
period the digests of n nodes reach n different peers, so a node that restarted with nothing
hears of the committed transactions within a period or two, whatever its place in the order.

Regression: every node used to start the round-robin at the same index, so at n = 20 all
digests of a period went to about the same peer and the 6 nodes last in the order, crashed
from the start and restarted, heard none in 8 s (`bench/scale.py --sizes 20 --only crashed
--protocols leaderless` failed its convergence check)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from phalanx.consensus.leaderless.recovery import Recovery


def _targets(n: int, period: int, every: int = 20) -> list[str]:
    nodes = tuple(f"n{i}" for i in range(1, n + 1))
    out = []
    for position, me in enumerate(nodes):
        peers = tuple(x for x in nodes if x != me)
        recovery = Recovery(peers=peers, every=every, max_entries=64, offset=position)
        (send,) = recovery.digest(period * every, [b"t" * 32])
        assert send.to != me
        out.append(send.to)
    return out


@given(st.integers(min_value=2, max_value=40), st.integers(min_value=0, max_value=200))
def test_each_period_spreads_the_digests_over_the_peers(n: int, period: int) -> None:
    received = Counter(_targets(n, period))
    # Every node but at most one hears from some peer in every period (a permutation up to
    # the one peer each node skips: itself).
    assert len(received) >= n - 1
    assert max(received.values()) <= 2


def test_a_node_late_in_the_order_hears_a_digest_in_the_first_periods() -> None:
    heard = {to for period in range(2) for to in _targets(20, period)}
    assert heard == {f"n{i}" for i in range(1, 21)}

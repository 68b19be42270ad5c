"""`LeaderlessConfig.named_fetch_delay_ticks`: an unknown transaction named by endorsements
is fetched only once the delay passed and it did not arrive meanwhile; without a delay at
once, as before."""

from __future__ import annotations

from phalanx.consensus.core import Send
from phalanx.consensus.leaderless.messages import FetchTransactions, TxId
from phalanx.consensus.leaderless.recovery import Recovery
from phalanx.consensus.types import NodeId

PEERS = (NodeId("n2"), NodeId("n3"), NodeId("n4"))
MEMBERS = (NodeId("n1"), *PEERS)
T1, T2 = TxId(b"\x01" * 32), TxId(b"\x02" * 32)


def _asks(sends: list[Send]) -> dict[str, tuple[TxId, ...]]:
    out: dict[str, tuple[TxId, ...]] = {}
    for s in sends:
        assert isinstance(s.message, FetchTransactions)
        out[s.to] = out.get(s.to, ()) + s.message.tx_ids
    return out


def test_no_delay_fetches_at_once_once_per_endorser() -> None:
    r = Recovery(peers=PEERS, members=MEMBERS, every=20, max_entries=100)
    assert _asks(r.fetch_named(PEERS[0], T1, 5)) == {"n2": (T1,)}
    assert r.fetch_named(PEERS[0], T1, 5) == []
    assert _asks(r.fetch_named(PEERS[1], T1, 5)) == {"n3": (T1,)}
    assert r.named_due(100) == []


def test_delay_waits_then_asks_every_endorser_in_one_fetch_each() -> None:
    r = Recovery(peers=PEERS, members=MEMBERS, every=20, max_entries=100, named_delay=2)
    assert r.fetch_named(PEERS[0], T1, 5) == []
    assert r.fetch_named(PEERS[1], T1, 5) == []
    assert r.fetch_named(PEERS[0], T2, 6) == []
    assert r.named_due(6) == []
    assert _asks(r.named_due(7)) == {"n2": (T1,), "n3": (T1,)}
    assert _asks(r.named_due(8)) == {"n2": (T2,)}
    # Asked already: a new endorser is asked at once, an asked one never again.
    assert _asks(r.fetch_named(PEERS[2], T1, 9)) == {"n4": (T1,)}
    assert r.fetch_named(PEERS[0], T1, 9) == []


def test_arrival_during_the_delay_cancels_the_fetch() -> None:
    r = Recovery(peers=PEERS, members=MEMBERS, every=20, max_entries=100, named_delay=2)
    assert r.fetch_named(PEERS[0], T1, 5) == []
    r.learned(T1)
    assert r.named_due(50) == []


def test_waiting_names_are_bounded() -> None:
    r = Recovery(peers=PEERS, members=MEMBERS, every=20, max_entries=3, named_delay=1)
    for i in range(10):
        r.fetch_named(PEERS[0], TxId(bytes([i]) * 32), 1)
    assert len(_asks(r.named_due(5))["n2"]) == 3

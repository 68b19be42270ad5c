"""CheckpointMachine: unanimity drop, verified veto keep (both only from reliably delivered
votes), forgeries, equivocation, restart, pulls after loss, gc, determinism, and agreement
against an equivocating voter (the old agreement gap, closed)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.endorsement_batch import endorsement_problem, sign_one
from phalanx.consensus.leaderless.messages import (
    FetchVote,
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
    VoteBody,
    VoteDigestBatch,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
    transaction_id,
)
from phalanx.consensus.leaderless.veto import CheckpointMachine, VetoEffects, checkpoint_id
from phalanx.consensus.types import LocalProtocolError, Message, NodeId

PERIOD = 3
BATCH = 4
ENCODE = FastCrypto("n0").encode


def nodes_of(n: int) -> tuple[NodeId, ...]:
    return tuple(f"n{i}" for i in range(n))


def tx(i: int) -> Transaction:
    return Transaction(client="c", client_id="c", request_no=i, deadline_ms=1_000,
                       requirements=(), command=b"x%d" % i)


def tid(i: int) -> TxId:
    return transaction_id(tx(i), ENCODE)


def proof(i: int, n: int = 4, endorsers: int | None = None) -> TransactionProof:
    """A genuine applicability proof: Q endorsements of tx(i), each signed by its endorser."""
    q = endorsers if endorsers is not None else quorum(n)
    ends = []
    for node in nodes_of(n)[:q]:
        ends.append(sign_one(FastCrypto(node), node, tid(i)))
    return TransactionProof(tx=tx(i), endorsements=tuple(ends))


def quorum(n: int) -> int:
    f = (n - 1) // 3
    return math.ceil((n + f + 1) / 2)


def verifier(n: int) -> Callable[[TransactionProof], bool]:
    crypto = FastCrypto("n0")
    members = nodes_of(n)

    def verify(p: TransactionProof) -> bool:
        t = transaction_id(p.tx, ENCODE)
        good = {e.endorser for e in p.endorsements
                if e.tx_id == t and endorsement_problem(e, members, crypto) is None}
        return len(good) >= quorum(n)
    return verify


def signed(voter: NodeId, ids: tuple[TxId, ...], *, drop: bool,
           proofs: tuple[TransactionProof, ...] = (), signer: NodeId | None = None,
           checkpoint: bytes | None = None) -> VetoChoice:
    cid = checkpoint if checkpoint is not None else checkpoint_id(FastCrypto("n0"), ids)
    v = VetoChoice(checkpoint=cid, tx_ids=ids, voter=voter, drop=drop, proofs=proofs)
    return dataclasses.replace(v, signature=FastCrypto(signer or voter).sign(v))


class Cluster:
    """n machines wired by a FIFO network the test controls (loss by predicate)."""

    def __init__(self, n: int = 4, *, batch: int = BATCH, max_open: int = 1024) -> None:
        self.n = n
        self.nodes = nodes_of(n)
        self.verify = verifier(n)
        self.machines = {
            node: CheckpointMachine(node_id=node, nodes=self.nodes, crypto=FastCrypto(node),
                                    checkpoint_ticks=PERIOD, batch=batch, max_open=max_open,
                                    verify_proof=self.verify)
            for node in self.nodes}
        self.proofs: dict[NodeId, dict[TxId, TransactionProof]] = {x: {} for x in self.nodes}
        self.wire: list[tuple[NodeId, Send]] = []
        self.log: list[tuple[NodeId, NodeId, Message]] = []
        self.dropped: dict[NodeId, list[TxId]] = {x: [] for x in self.nodes}
        self.kept: dict[NodeId, list[TransactionProof]] = {x: [] for x in self.nodes}
        self.persisted: dict[NodeId, list[VetoChoice]] = {x: [] for x in self.nodes}
        self.lose: Callable[[NodeId, NodeId, Message], bool] = lambda s, t, m: False

    def proof_of(self, node: NodeId) -> Callable[[TxId], TransactionProof | None]:
        return self.proofs[node].get

    def collect(self, node: NodeId) -> VetoEffects:
        eff = self.machines[node].drain()
        self.persisted[node].extend(eff.votes)
        self.dropped[node].extend(eff.dropped)
        self.kept[node].extend(eff.kept)
        for send in eff.sends:
            self.log.append((node, send.to, send.message))
            self.wire.append((node, send))
        return eff

    def tick(self, times: int = PERIOD) -> None:
        for _ in range(times):
            for node in self.nodes:
                self.machines[node].tick(self.proof_of(node))
                self.collect(node)

    def deliver_one(self, src: NodeId, send: Send) -> None:
        node, msg = send.to, send.message
        if self.lose(src, node, msg):
            return
        m = self.machines[node]
        if isinstance(msg, StartCheckpoint):
            m.on_start(src, msg, self.proof_of(node))
        elif isinstance(msg, VetoChoice):
            m.on_choice(src, msg, self.proof_of(node))
        elif isinstance(msg, VoteEcho):
            m.on_echo(src, msg, self.proof_of(node))
        elif isinstance(msg, VoteReady):
            m.on_ready(src, msg)
        elif isinstance(msg, VoteEchoDigest | VoteDigestBatch | FetchVote | VoteBody):
            m.on_relay(src, msg, self.proof_of(node))
        self.collect(node)

    def run(self) -> None:
        while self.wire:
            src, send = self.wire.pop(0)
            self.deliver_one(src, send)

    def decided(self, node: NodeId) -> str | None:
        if self.dropped[node]:
            return "drop"
        if self.kept[node]:
            return "keep"
        return None


def start(c: Cluster, ids: list[int], at: NodeId = "n0") -> tuple[TxId, ...]:
    for i in ids:
        c.machines[at].queue(tid(i))
    c.tick()
    return tuple(sorted(tid(i) for i in ids))


# Unanimity ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 7])
def test_drop_is_decided_on_all_n_votes(n: int) -> None:
    c = Cluster(n)
    ids = start(c, [1, 2])
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)
        assert not c.machines[node].blocked(ids[0])
        # Decided: the vote stays in the durable record until gc (a lagging peer may
        # still ask; test_veto_lagging.py), then goes.
        assert c.machines[node].votes() == tuple(c.persisted[node])
        assert c.persisted[node]
        assert c.persisted[node][0].drop
        c.machines[node].gc(lambda t: False)
        assert c.machines[node].votes() == ()
        assert c.machines[node].relays() == ()


def test_n_minus_1_votes_do_not_decide_and_one_silent_node_blocks() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: "n3" in (s, t)  # n3 crashed
    ids = start(c, [1])
    c.run()
    for _ in range(5):  # resends do not help while it stays silent (the liveness cost)
        c.tick()
        c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])
        assert [v.tx_ids for v in c.machines[node].votes()] == [ids]
    # It comes back: resent votes (and its own, on the StartCheckpoint it missed) decide.
    c.lose = lambda s, t, m: False
    c.tick()
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)
        assert not c.machines[node].blocked(ids[0])


def about(m: Message, voter: str) -> bool:
    """Whether `m` is a broadcast message of `voter`'s vote."""
    if isinstance(m, VetoChoice):
        return m.voter == voter
    if isinstance(m, VoteEcho | VoteBody):
        return m.vote.voter == voter
    if isinstance(m, VoteDigestBatch):
        return voter in m.echo_voters or voter in m.ready_voters
    return isinstance(m, VoteReady | VoteEchoDigest | FetchVote) and m.voter == voter


def test_pull_after_loss() -> None:
    c = Cluster(4)
    # Everything about n2's vote that is sent to n1 is lost.
    c.lose = lambda s, t, m: t == "n1" and about(m, "n2")
    ids = start(c, [7])
    c.run()
    assert c.decided("n1") is None
    assert c.decided("n0") == "drop"
    c.lose = lambda s, t, m: False
    c.tick()  # n1 pulls (StartCheckpoint again); its peers answer
    c.run()
    assert c.dropped["n1"] == list(ids)


def test_lost_start_checkpoint_a_vote_makes_the_node_vote() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: isinstance(m, StartCheckpoint)
    ids = start(c, [3])
    c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)


def test_a_vote_sent_to_one_node_only_blocks_like_silence() -> None:
    """n3 sends its drop vote to n0 only (and ignores pulls): it is never delivered, so
    nobody decides (no relayed certificate can decide for it any more)."""
    c = Cluster(4)
    c.lose = lambda s, t, m: (s == "n3" and isinstance(m, VetoChoice) and t != "n0") \
        or (s == "n3" and isinstance(m, VoteEcho | VoteReady))
    ids = start(c, [4])
    c.run()
    for _ in range(3):
        c.tick()
        c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])


def test_valid_veto_decides_keep_everywhere_and_no_vote_is_relayed() -> None:
    c = Cluster(4)
    p = proof(5)
    c.proofs["n2"][tid(5)] = p
    ids = start(c, [5, 6])
    c.run()
    for node in c.nodes:
        assert c.decided(node) == "keep"
        assert c.kept[node] == [p]
        assert not c.machines[node].blocked(ids[0])
    assert all(m.voter == s for s, _, m in c.log if isinstance(m, VetoChoice))


def test_a_node_holding_a_proof_never_lets_drop_be_decided() -> None:
    c = Cluster(7)
    c.proofs["n6"][tid(1)] = proof(1, 7)
    c.lose = lambda s, t, m: s == "n6"  # its veto (and all it says) is lost
    ids = start(c, [1])
    c.run()
    for _ in range(3):
        c.tick()
        c.run()
    for node in c.nodes[:6]:
        assert c.decided(node) is None
        assert c.machines[node].blocked(ids[0])


def forged_cases() -> dict[str, tuple[NodeId, VetoChoice, str]]:
    ids = (tid(1),)
    bad_proof = proof(1, endorsers=2)  # Q-1 endorsements
    other = proof(9)  # a genuine proof, of a transaction not in the checkpoint
    good = proof(1)
    return {
        "bad proof": ("n1", signed("n1", ids, drop=False, proofs=(bad_proof,)), "forged_veto"),
        "no proof": ("n1", signed("n1", ids, drop=False), "forged_veto"),
        "foreign proof": ("n1", signed("n1", ids, drop=False, proofs=(other,)), "forged_veto"),
        "bad signature": ("n1", dataclasses.replace(
            signed("n1", ids, drop=False, proofs=(good,)), signature=b"x" * 32), "bad_signature"),
        "wrong signer": ("n2", signed("n2", ids, drop=False, proofs=(good,), signer="n1"),
                         "bad_signature"),
        "relayed": ("n1", signed("n2", ids, drop=False, proofs=(good,)), "relayed_vote"),
        "voter not member": ("x9", signed("x9", ids, drop=False, proofs=(good,)),
                             "not_a_member"),
        "bad checkpoint id": ("n1", signed("n1", ids, drop=False, proofs=(good,),
                                           checkpoint=b"\x00" * 32), "bad_checkpoint_id"),
        "drop with proofs": ("n1", signed("n1", ids, drop=True, proofs=(good,)),
                             "bad_drop_vote"),
    }


@pytest.mark.parametrize("case", sorted(forged_cases()))
def test_forged_vote_is_counted_and_changes_nothing(case: str) -> None:
    src, forged, reason = forged_cases()[case]
    c = Cluster(4)
    ids = start(c, [1])
    c.wire.clear()  # nobody else hears of it yet
    m = c.machines["n0"]
    m.on_choice(src, forged, c.proof_of("n0"))
    m.on_echo(src, VoteEcho(vote=forged), c.proof_of("n0"))
    eff = c.collect("n0")
    assert eff == VetoEffects()  # neither echoed nor voted on
    assert m.dropped_counts() == {reason: 2 if reason != "relayed_vote" else 1}
    assert m.blocked(ids[0])
    # The genuine votes still decide (the others learn of the checkpoint from n0's pull,
    # and pull n0's vote a period later).
    for _ in range(2):
        c.tick()
        c.run()
    for node in c.nodes:
        assert c.dropped[node] == list(ids)


def test_duplicates_are_not_verified_again() -> None:
    calls: list[TransactionProof] = []
    verify = verifier(4)

    def counting(p: TransactionProof) -> bool:
        calls.append(p)
        return verify(p)
    m = CheckpointMachine(node_id="n0", nodes=nodes_of(4), crypto=FastCrypto("n0"),
                          checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=counting)
    ids = (tid(1),)
    m.on_start("n1", StartCheckpoint(tx_ids=ids), lambda _t: None)
    veto = signed("n3", ids, drop=False, proofs=(proof(1),))
    digest = digest_of(FastCrypto("n0"), veto)
    for _ in range(2):
        m.on_choice("n3", veto, lambda _t: None)
        for src in ("n1", "n2", "n3"):
            m.on_echo(src, VoteEcho(vote=veto), lambda _t: None)
            m.on_ready(src, VoteReady(checkpoint=veto.checkpoint, voter="n3", digest=digest))
    assert m.drain().kept == (proof(1),)
    assert len(calls) == 2  # on receipt, and once more for the decision


def test_equivocation_is_counted_first_choice_echoed() -> None:
    c = Cluster(4)
    ids = start(c, [1])
    c.wire.clear()
    m = c.machines["n0"]
    v1 = signed("n1", ids, drop=False, proofs=(proof(1),))
    v2 = signed("n1", ids, drop=False, proofs=(proof(1, endorsers=4),))
    for v in (v1, v2, signed("n1", ids, drop=True), v1):  # a plain duplicate is no lie
        m.on_choice("n1", v, c.proof_of("n0"))
    eff = c.collect("n0")
    echo = VoteEchoDigest(checkpoint=v1.checkpoint, voter=v1.voter,
                          digest=digest_of(FastCrypto("n0"), v1))
    assert [s.message for s in eff.sends] == [echo] * 3
    assert eff.kept == eff.dropped == ()
    assert m.dropped_counts() == {"equivocation": 2}


def exact_scenario(order: str, *, echo: bool) -> Cluster:
    """The bug found on a real cluster: n3 (Byzantine) holds a valid proof of T; n0, n1, n2
    vote drop; n3 sends its signed DROP to n1 and n2 and its signed VETO to n0 (and, when
    `echo`, echoes each of them as it sent it)."""
    c = Cluster(4)
    ids = (tid(1),)
    for node in ("n0", "n1", "n2"):
        c.machines[node].on_start("n2", StartCheckpoint(tx_ids=ids), c.proof_of(node))
        c.collect(node)
    drop3 = signed("n3", ids, drop=True)
    veto3 = signed("n3", ids, drop=False, proofs=(proof(1),))
    c.wire += [("n3", Send(to="n0", message=veto3)), ("n3", Send(to="n1", message=drop3)),
               ("n3", Send(to="n2", message=drop3))]
    if echo:
        c.wire += [("n3", Send(to=send.to, message=VoteEcho(vote=send.message)))
                   for _, send in c.wire[-3:] if isinstance(send.message, VetoChoice)]
    c.lose = lambda s, t, m: t == "n3"  # n3 ignores everything
    if order == "veto first":
        c.wire.sort(key=lambda item: not is_veto(item[1].message))
    elif order == "drops first":
        c.wire.sort(key=lambda item: is_veto(item[1].message))
    c.run()
    for _ in range(2):
        c.tick()
        c.run()
    return c


def is_veto(m: Message) -> bool:
    return isinstance(m, VetoChoice | VoteEcho) and not (
        m.drop if isinstance(m, VetoChoice) else m.vote.drop)


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("order", ["veto first", "drops first", "fifo"])
def test_equivocating_voter_cannot_split_honest_nodes(order: str, echo: bool) -> None:
    c = exact_scenario(order, echo=echo)
    decisions = {c.decided(node) for node in ("n0", "n1", "n2")}
    if echo:
        # n3's DROP reached two correct nodes: with n3's own echo that is a quorum of
        # echoes, so its delivered vote is the drop, everywhere; its veto never is.
        assert decisions == {"drop"}
    else:
        # Two echoes of each: n3's vote is never delivered (like a silent voter), so no
        # correct node decides; T stays blocked everywhere.
        assert decisions == {None}
        assert all(c.machines[x].blocked(tid(1)) for x in ("n0", "n1", "n2"))
    assert all(c.machines[x].dropped_counts().get("veto_after_drop") is None
               for x in c.nodes)


def test_a_node_that_sees_a_veto_before_voting_vetoes_too() -> None:
    c = Cluster(4)
    ids = (tid(1),)
    veto3 = signed("n3", ids, drop=False, proofs=(proof(1),))
    c.machines["n1"].on_choice("n3", veto3, c.proof_of("n1"))
    eff = c.collect("n1")
    assert [(v.voter, v.drop, v.proofs) for v in eff.votes] == [("n1", False, (proof(1),))]
    assert eff.kept == ()  # not delivered yet
    c.lose = lambda s, t, m: t == "n3"
    c.run()
    c.tick()
    c.run()
    for node in ("n0", "n1", "n2"):
        assert c.decided(node) == "keep"


# Restart -------------------------------------------------------------------------------


def restarted(c: Cluster, node: NodeId, *, record: bool = True) -> CheckpointMachine:
    old = c.machines[node]
    m = CheckpointMachine(node_id=node, nodes=c.nodes, crypto=FastCrypto(node),
                          checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=c.verify,
                          restored_votes=old.votes() if record else (),
                          restored_relays=old.relays() if record else ())
    c.machines[node] = m
    return m


def test_restart_with_restored_votes_never_votes_the_other_way() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: t == "n3"  # keeps the checkpoint undecided
    ids = start(c, [1])
    c.run()
    before = c.machines["n1"].votes()
    assert len(before) == 1
    assert before[0].drop
    assert c.machines["n1"].relays()
    c.wire.clear()
    m = restarted(c, "n1")
    assert m.relays() == c.machines["n1"].relays()
    c.proofs["n1"][tid(1)] = proof(1)  # it now sees tx 1 applicable
    assert m.blocked(ids[0])
    assert m.votes() == before
    m.on_start("n0", StartCheckpoint(tx_ids=ids), c.proof_of("n1"))
    m.on_choice("n2", signed("n2", ids, drop=True), c.proof_of("n1"))
    c.tick()
    eff_votes = [msg for s, _, msg in c.log if s == "n1" and isinstance(msg, VetoChoice)]
    assert eff_votes
    assert all(v == before[0] for v in eff_votes)
    assert not c.persisted["n1"][1:]  # no new vote was signed


def test_restart_without_record_adopts_its_echoed_old_vote() -> None:
    c = Cluster(4)
    c.lose = lambda s, t, m: t == "n3"
    ids = start(c, [1])
    c.run()
    old = c.machines["n1"].votes()[0]
    m = restarted(c, "n1", record=False)
    c.proofs["n1"][tid(1)] = proof(1)
    m.on_echo("n0", VoteEcho(vote=old), c.proof_of("n1"))  # its old vote, echoed back
    m.on_start("n0", StartCheckpoint(tx_ids=ids), c.proof_of("n1"))
    eff = m.drain()
    assert eff.votes == ()
    assert eff.sync  # the adopted vote must be persisted before anything is sent
    assert m.votes() == (old,)
    assert m.blocked(ids[0])


def test_restored_vote_must_be_own_undecided_vote() -> None:
    ids = (tid(1),)
    for bad in (signed("n2", ids, drop=True), signed("n1", ids, drop=False),
                signed("n1", ids, drop=True, proofs=(proof(1),))):
        with pytest.raises(LocalProtocolError):
            CheckpointMachine(node_id="n1", nodes=nodes_of(4), crypto=FastCrypto("n1"),
                              checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=verifier(4),
                              restored_votes=(bad,))


# Inputs, queue, gc, bounds ---------------------------------------------------------------


@pytest.mark.parametrize("ids", [
    "none", "unsorted", "duplicate", "oversized", "empty id", "long id",
])
def test_bad_id_lists_are_counted(ids: object) -> None:
    a, b = sorted((tid(1), tid(2)))
    lists: dict[object, tuple[bytes, ...]] = {
        "none": (), "unsorted": (b, a), "duplicate": (a, a),
        "oversized": tuple(sorted(tid(i) for i in range(BATCH + 1))),
        "empty id": (b"",), "long id": (b"x" * 65,)}
    c = Cluster(4)
    m = c.machines["n0"]
    m.on_start("n1", StartCheckpoint(tx_ids=lists[ids]), c.proof_of("n0"))
    vote = signed("n1", lists[ids], drop=True)
    m.on_choice("n1", vote, c.proof_of("n0"))
    assert m.drain() == VetoEffects()
    assert len(m) == 0
    assert m.dropped_counts() == {"bad_id_list": 2}


def test_ready_for_an_unknown_checkpoint_is_counted() -> None:
    c = Cluster(4)
    m = c.machines["n0"]
    m.on_ready("n1", VoteReady(checkpoint=b"\x07" * 32, voter="n1", digest=b"d"))
    m.on_ready("x9", VoteReady(checkpoint=b"\x07" * 32, voter="n1", digest=b"d"))
    assert m.dropped_counts() == {"unknown_checkpoint": 1, "not_a_member": 1}


def test_queue_is_deduplicated_and_batched_sorted() -> None:
    c = Cluster(4, batch=2)
    m = c.machines["n0"]
    for i in (3, 1, 2, 1, 3):
        m.queue(tid(i))
    c.tick()
    starts = [msg for s, _, msg in c.log if isinstance(msg, StartCheckpoint)]
    first = tuple(sorted(tid(i) for i in (1, 2, 3))[:2])
    assert starts == [StartCheckpoint(tx_ids=first)] * 3
    m.queue(first[0])  # already in an undecided checkpoint: ignored
    c.log.clear()
    c.tick()
    starts = [msg for s, _, msg in c.log if isinstance(msg, StartCheckpoint)
              and msg.tx_ids != first]  # (the first one is pulled again: undecided)
    assert [s.tx_ids for s in starts] == [tuple(sorted({tid(1), tid(2), tid(3)} - set(first)))] * 3


def test_max_open_bounds_undecided_checkpoints() -> None:
    c = Cluster(4, max_open=2)
    m = c.machines["n0"]
    for i in range(5):  # a Byzantine peer spams checkpoints of made-up ids
        m.on_start("n3", StartCheckpoint(tx_ids=(bytes([i]) * 32,)), c.proof_of("n0"))
    assert len(m) == 2
    assert m.dropped_counts() == {"too_many_open_checkpoints": 3}


@settings(max_examples=25, deadline=None)
@given(crashes=st.lists(st.booleans(), min_size=1, max_size=10))
def test_gc_bounds_memory(crashes: list[bool]) -> None:
    c = Cluster(4)
    for k, crash in enumerate(crashes):
        c.lose = (lambda s, t, m: "n3" in (s, t)) if crash else (lambda s, t, m: False)
        start(c, [1000 + k])
        c.run()
    m = c.machines["n0"]
    assert len(m) == len(crashes)
    assert len(m.votes()) == len(crashes)  # decided ones too, until gc
    undecided = sum(1 for v in m.votes() if m.blocked(v.tx_ids[0]))
    assert undecided <= sum(crashes)
    m.gc(lambda t: True)  # everything still live: nothing forgotten
    assert len(m) == len(crashes)
    m.gc(lambda t: False)
    assert len(m) == undecided  # only undecided checkpoints stay (own votes are kept)
    assert len(m.votes()) == undecided
    assert all(m.blocked(v.tx_ids[0]) for v in m.votes())
    assert len(m.relays()) <= 4 * undecided


# Properties ------------------------------------------------------------------------------


def scenario(seed_ops: list[tuple[int, int]], holders: list[int]) -> Cluster:
    c = Cluster(4)
    for h in holders:
        c.proofs[f"n{h}"][tid(h)] = proof(h)
    losses = {(a, b) for a, b in seed_ops}
    c.lose = lambda s, t, m: (int(s[1:]), int(t[1:])) in losses
    for i in range(4):
        c.machines[f"n{i}"].queue(tid(i))
    c.tick()
    c.run()
    c.lose = lambda s, t, m: False
    for _ in range(2):
        c.tick()
        c.run()
    return c


@settings(max_examples=30, deadline=None)
@given(losses=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=6),
       holders=st.lists(st.integers(0, 3), max_size=2, unique=True))
def test_honest_nodes_agree_and_are_deterministic(losses: list[tuple[int, int]],
                                                  holders: list[int]) -> None:
    c = scenario(losses, holders)
    again = scenario(losses, holders)
    assert c.log == again.log
    for node in c.nodes:
        # Every checkpoint decides once loss stops; the one holding a proof is kept.
        assert not any(c.machines[node].blocked(tid(i)) for i in range(4))
        for i in range(4):
            assert (tid(i) in c.dropped[node]) == (tid(i) in c.dropped["n0"])
            if i in holders:
                assert tid(i) not in c.dropped[node]


@settings(max_examples=60, deadline=None)
@given(plan=st.lists(st.sampled_from(["none", "drop", "veto", "forged"]), min_size=3,
                     max_size=3),
       echoes=st.lists(st.sampled_from(["none", "drop", "veto", "forged"]), min_size=3,
                       max_size=3),
       rng=st.randoms(use_true_random=False))
def test_honest_nodes_never_disagree(plan: list[str], echoes: list[str],
                                     rng: object) -> None:
    """n3 is Byzantine and holds a valid proof; it sends each correct node nothing, a drop,
    a veto or a forged veto, echoes any of them to anyone, and the network delivers in any
    order. Correct nodes always end with the same decision (none only when n3's vote is
    never delivered: unanimity needs it): DROP when n3 votes drop everywhere and shows its
    proof to nobody, KEEP when it vetoes everywhere."""
    import random
    assert isinstance(rng, random.Random)
    c = Cluster(4)
    ids = (tid(1),)
    c.machines["n0"].on_start("n2", StartCheckpoint(tx_ids=ids), c.proof_of("n0"))
    c.collect("n0")
    byz = {"drop": signed("n3", ids, drop=True),
           "veto": signed("n3", ids, drop=False, proofs=(proof(1),)),
           "forged": signed("n3", ids, drop=False, proofs=(proof(1, endorsers=2),))}
    for node, what, echo in zip(("n0", "n1", "n2"), plan, echoes, strict=True):
        if what != "none":
            c.wire.append(("n3", Send(to=node, message=byz[what])))
        if echo != "none":
            c.wire.append(("n3", Send(to=node, message=VoteEcho(vote=byz[echo]))))
    c.lose = lambda s, t, m: t == "n3"  # n3 ignores everything it hears
    while c.wire:
        src, send = c.wire.pop(rng.randrange(len(c.wire)))
        c.deliver_one(src, send)
    for _ in range(2):
        c.tick()
        c.run()
    decisions = {c.decided(node) for node in ("n0", "n1", "n2")}
    assert len(decisions) == 1
    if plan == ["drop"] * 3 and "veto" not in echoes:
        # A valid veto echoed to a correct node lets it veto with that proof itself
        # (holding a valid proof, it never votes drop): KEEP is then the right outcome.
        assert decisions == {"drop"}
    if plan == ["veto"] * 3:
        assert decisions == {"keep"}


def test_a_fenced_node_adopts_its_old_vote_fetched_by_digest() -> None:
    """n0 lost its record (fenced: it votes, echoes and readies nothing). Echoes by digest
    carry no vote, so f+1 = 2 echoes of one digest in its own instance (one of them correct:
    its old vote) make it fetch that body from those echoers and adopt it, as a full echo
    used to: never a second, different vote of its own. A forged body is dropped."""
    c = Cluster(4)
    ids = (tid(1),)
    m = c.machines["n0"]
    m.fenced = True
    m.on_start("n1", StartCheckpoint(tx_ids=ids), c.proof_of("n0"))
    c.collect("n0")
    assert m.votes() == ()
    old = signed("n0", ids, drop=True)
    echo = VoteEchoDigest(checkpoint=old.checkpoint, voter="n0",
                          digest=digest_of(FastCrypto("n0"), old))
    m.on_relay("n1", echo, c.proof_of("n0"))
    assert not any(isinstance(s.message, FetchVote) for s in c.collect("n0").sends)  # f
    m.on_relay("n2", echo, c.proof_of("n0"))
    fetches = [s for s in c.collect("n0").sends if isinstance(s.message, FetchVote)]
    assert [s.to for s in fetches] == ["n1", "n2"]
    m.on_relay("n1", VoteBody(vote=signed("n0", ids, drop=False, proofs=(proof(1),))),
               c.proof_of("n0"))
    assert m.votes() == ()
    assert m.dropped_counts() == {"vote_body_mismatch": 1}
    m.on_relay("n2", VoteBody(vote=old), c.proof_of("n0"))
    assert m.votes() == (old,)

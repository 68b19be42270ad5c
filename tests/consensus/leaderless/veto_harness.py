"""The shared set-up of the `CheckpointMachine` tests (`test_veto*.py`): genuine proofs and
signed votes, and `Cluster`, n machines wired by a FIFO network the test controls (loss by
predicate), with a restart from the durable parts of a machine (`restarted`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto
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
from phalanx.consensus.types import Message, NodeId

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

    def __init__(self, n: int = 4, *, batch: int = BATCH, max_open: int = 1024,
                 decided_once: bool = False, no_rounds: bool = False) -> None:
        """`decided_once`, `no_rounds`: the machines' deliberate bugs (`bugs.py`)."""
        self.n = n
        self.nodes = nodes_of(n)
        self.verify = verifier(n)
        self.machines = {
            node: CheckpointMachine(node_id=node, nodes=self.nodes, crypto=FastCrypto(node),
                                    checkpoint_ticks=PERIOD, batch=batch, max_open=max_open,
                                    verify_proof=self.verify, decided_once=decided_once,
                                    no_rounds=no_rounds)
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


def about(m: Message, voter: str) -> bool:
    """Whether `m` is a broadcast message of `voter`'s vote."""
    if isinstance(m, VetoChoice):
        return m.voter == voter
    if isinstance(m, VoteEcho | VoteBody):
        return m.vote.voter == voter
    if isinstance(m, VoteDigestBatch):
        return voter in m.echo_voters or voter in m.ready_voters
    return isinstance(m, VoteReady | VoteEchoDigest | FetchVote) and m.voter == voter


def restarted(c: Cluster, node: NodeId, *, record: bool = True) -> CheckpointMachine:
    old = c.machines[node]
    m = CheckpointMachine(node_id=node, nodes=c.nodes, crypto=FastCrypto(node),
                          checkpoint_ticks=PERIOD, batch=BATCH, verify_proof=c.verify,
                          restored_votes=old.votes() if record else (),
                          restored_relays=old.relays() if record else (),
                          restored_decisions=old.veto_decisions() if record else ())
    c.machines[node] = m
    return m

"""`ordered_state.OrderedState`, the deterministic machine every node runs over the votes and
closes PBFT orders (docs/LEADERLESS.md "Ordered resolution"), under arbitrary sequences of
honest, equivocating, forged and late items: each checkpoint decides at most once and only
by the rule (all n votes, or n-f votes and f+1 closes when no transaction is ambiguous:
its shown endorsements plus the uncounted members would reach Q); a kept transaction has Q
valid endorsements among the counted votes; a snapshot taken anywhere and restored (the embedded
PBFT's state transfer) continues exactly as the original."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import client_keys, endorsement, make_tx, tx_id

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.endorsement_batch import sign_one
from phalanx.consensus.leaderless.messages import (
    CloseCheckpoint,
    Endorsement,
    OrderedVote,
    TransactionProof,
)
from phalanx.consensus.leaderless.ordered_state import OrderedState
from phalanx.consensus.leaderless.veto import checkpoint_id
from phalanx.consensus.types import NodeId

NODES = tuple(NodeId(f"n{i}") for i in range(1, 5))
T1 = make_tx("set x a", no=1)
T2 = make_tx("set x b", client="c2", no=2)
IDS = tuple(sorted((tx_id(T1), tx_id(T2))))
CID = checkpoint_id(FastCrypto(NODES[0]), IDS)
Q = 3


def machine() -> OrderedState:
    return OrderedState(nodes=NODES, faults=1, crypto=FastCrypto(NodeId("x")),
                        client_keys=client_keys(), quorum_for=lambda _p: Q, tx_id_of=tx_id)


def sign(item: OrderedVote | CloseCheckpoint, as_node: NodeId) -> OrderedVote | CloseCheckpoint:
    return dataclasses.replace(item, signature=FastCrypto(as_node).sign(item))


def forged(node: str, tx: object) -> Endorsement:
    return sign_one(FastCrypto(NodeId("n4")), NodeId(node), tx_id(T1))  # n4's key


ENDORSEMENTS = {n: endorsement(n, T1) for n in ("n1", "n2", "n3", "n4")}


@st.composite
def items(draw: st.DrawFn) -> OrderedVote | CloseCheckpoint:
    """A vote or close of the one checkpoint by any member, some signed by someone else,
    some votes with evidence of T1 (valid or with a forged endorsement)."""
    who = draw(st.sampled_from(NODES))
    signer = draw(st.sampled_from((who, who, who, NodeId("n4"))))
    if draw(st.booleans()):
        return sign(CloseCheckpoint(checkpoint=CID, tx_ids=IDS, proposer=who), signer)
    shown = draw(st.lists(st.sampled_from(sorted(ENDORSEMENTS)), unique=True, max_size=4))
    endorsements = tuple(ENDORSEMENTS[n] for n in sorted(shown))
    if draw(st.integers(0, 5)) == 0:
        endorsements = (*endorsements[:1], forged("n3", T1))
    evidence = (TransactionProof(tx=T1, endorsements=endorsements),) if endorsements else ()
    return sign(OrderedVote(checkpoint=CID, tx_ids=IDS, voter=who, evidence=evidence), signer)


def run(state: OrderedState, sequence: list[OrderedVote | CloseCheckpoint]) -> list[object]:
    out = []
    for item in sequence:
        decision = state.execute(repr(item).encode(), item)
        if decision is not None:
            out.append(decision)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(items(), max_size=14), st.integers(0, 14))
def test_decides_once_by_the_rule_and_survives_a_snapshot(
        sequence: list[OrderedVote | CloseCheckpoint], cut: int) -> None:
    whole = machine()
    decisions = run(whole, sequence)
    assert len(decisions) <= 1
    voters: dict[NodeId, OrderedVote] = {}
    closers: set[NodeId] = set()
    expected_at = None
    for i, item in enumerate(sequence):  # the rule, recomputed naively
        ok = FastCrypto(NodeId("x")).verify(
            item.voter if isinstance(item, OrderedVote) else item.proposer, item,
            item.signature)
        if isinstance(item, OrderedVote):
            valid = ok and all(e.signature == ENDORSEMENTS[e.endorser].signature
                               for p in item.evidence for e in p.endorsements)
            if valid and item.voter not in voters:
                voters[item.voter] = item
        elif ok:
            closers.add(item.proposer)
        shown = {e.endorser for v in voters.values() for p in v.evidence
                 for e in p.endorsements}
        clear = len(shown) >= Q or len(shown) + 4 - len(voters) < Q  # T1 not ambiguous
        if len(voters) == 4 or (len(voters) >= 3 and len(closers) >= 2 and clear):
            expected_at = i
            break
    assert (expected_at is not None) == bool(decisions)
    if decisions:
        (decision,) = decisions
        shown = {e.endorser for v in voters.values() for p in v.evidence
                 for e in p.endorsements}
        assert (tx_id(T1) not in decision.dropped) == (len(shown) >= Q)  # type: ignore[attr-defined]
        assert tx_id(T2) in decision.dropped  # type: ignore[attr-defined]
    # A snapshot taken after `cut` items, restored, continues exactly like the original.
    first = machine()
    head = run(first, sequence[:cut])
    restored = OrderedState(nodes=NODES, faults=1, crypto=FastCrypto(NodeId("x")),
                            client_keys=client_keys(), quorum_for=lambda _p: Q,
                            tx_id_of=tx_id, snapshot=first.snapshot())
    assert head + run(restored, sequence[cut:]) == decisions
    assert restored.snapshot() == whole.snapshot()

"""A voter whose embedded PBFT is out of the others' view still gets every own vote ordered
(`stuck_resolution = "pbft"`, docs/LEADERLESS.md "Running it", the pbft-mode register run
under kill of 2026-12-03).

Found by a real-cluster run: n2, cut off while it had voted, timed its PBFT primary out and
moved to the next view alone; n1, n3 and n4 went on in the old one without it (3 = 2f + 1).
n2's own items still reach the others (`OrderingSubmit`: the primary orders them), but n2
executes nothing of that view: it learns the ordered state only by the PBFT's state
transfer (`_install`), which skips the entries, so nothing told n2 that its head item was
done. It kept re-submitting that head (a vote of a checkpoint decided long ago) and never
submitted the vote queued behind it, of a checkpoint that was ambiguous without n2's vote:
that checkpoint never decided, and every read of its key timed out.

The four ordered resolutions are driven directly (no leaderless core): checkpoint A
needs only n1, n3 and n4; checkpoint B's votes show two endorsements of T_B (n1, n4), so it
stays ambiguous until n2 votes."""

from __future__ import annotations

from leaderless_harness import EPOCH, client_keys, endorsement, make_tx, tx_id
from test_leaderless_ordered_veto import ItemCodec

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    OrderingEnvelope,
    OrderingSubmit,
    StartCheckpoint,
    Transaction,
    TransactionProof,
    TxId,
)
from phalanx.consensus.leaderless.ordered_veto import OrderedCheckpoints
from phalanx.consensus.types import NodeId
from phalanx.net import wire

wire.register_all(LEADERLESS_MESSAGES)

IDS = tuple(NodeId(f"n{i}") for i in range(1, 5))
N1, N2, N3, N4 = IDS
T_A = make_tx("set a 1", deadline=EPOCH + 100)
T_B = make_tx("set b 1", client="c2", deadline=EPOCH + 100)
PROOF_B = TransactionProof(tx=T_B, endorsements=(endorsement("n1", T_B), endorsement("n4", T_B)))


class Ordered:
    """Four `OrderedCheckpoints` and a network that can isolate one of them."""

    def __init__(self) -> None:
        self.nodes: dict[NodeId, OrderedCheckpoints] = {}
        for n in IDS:
            cfg = LeaderlessConfig(node_id=n, nodes=IDS, checkpoint_ticks=2, close_ticks=10,
                                   stuck_resolution="pbft")
            oc = OrderedCheckpoints(
                config=cfg, crypto=FastCrypto(n), client_keys=client_keys(), codec=ItemCodec(),
                tx_id_of=tx_id, evidence_of=self._evidence(n))
            self.nodes[n] = oc
        self.isolated: set[NodeId] = set()
        self._number = 0

    @staticmethod
    def _evidence(node: NodeId):  # type: ignore[no-untyped-def]
        def evidence_of(t: TxId) -> TransactionProof | None:
            return PROOF_B if t == tx_id(T_B) and node != N2 else None
        return evidence_of

    def tick(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            for oc in self.nodes.values():
                oc.tick(lambda _t: None)
            self.deliver()

    def deliver(self) -> None:
        moved = True
        while moved:
            moved = False
            for src, oc in self.nodes.items():
                self._number += 1  # every record durable at once
                oc.stamp(self._number)
                oc.persisted(self._number)
                for send in oc.drain().sends:
                    if src in self.isolated or send.to in self.isolated:
                        continue
                    moved = True
                    dst = self.nodes[send.to]
                    msg = send.message
                    if isinstance(msg, OrderingEnvelope | OrderingSubmit):
                        dst.on_envelope(src, msg)
                    elif isinstance(msg, StartCheckpoint):
                        dst.on_start(src, msg, lambda _t: None)

    def checkpoint_of(self, tx: Transaction) -> bytes:
        """The one checkpoint n1 remembers naming `tx`."""
        cids = [cid for cid, loc in self.nodes[N1]._local.items() if tx_id(tx) in loc.tx_ids]
        assert len(cids) == 1
        return bytes(cids[0])


def run() -> Ordered:
    c = Ordered()
    c.isolated.add(N2)
    for oc in c.nodes.values():
        oc.queue(tx_id(T_A))
    c.tick(2)  # every node starts {T_A} and votes; n2's vote cannot leave it
    for oc in c.nodes.values():
        oc.queue(tx_id(T_B))
    c.tick(4)  # {T_B} likewise; n2's vote of it waits behind its vote of {T_A}
    c.tick(60)  # n2's PBFT times its primary out: n2 moves to view 1 alone
    assert c.nodes[N2]._pbft.status().view >= 1
    assert not c.nodes[N2]._pbft.status().view_active
    a, b = c.checkpoint_of(T_A), c.checkpoint_of(T_B)
    for n in (N1, N3, N4):
        assert c.nodes[n]._state.decided(a), n  # three votes and the closes: dropped
        assert c.nodes[n]._state.is_open(b), n  # ambiguous without n2
    c.isolated.clear()
    c.tick(400)
    return c


def test_a_voter_out_of_view_gets_its_next_vote_ordered() -> None:
    c = run()
    b = c.checkpoint_of(T_B)
    for n in (N1, N3, N4):
        assert c.nodes[n]._pbft.status().view == 0, n  # they never followed n2
    for n in IDS:
        assert c.nodes[n]._state.decided(b), n
        assert c.nodes[n]._state.was_dropped(tx_id(T_B)), n

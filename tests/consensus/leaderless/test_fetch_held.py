"""Answers by what the asker holds (`FetchTransactions.held`, `held.HeldMasks`): a fetch of a
transaction the asker holds names the members whose unconditional endorsements it holds,
the answer carries only the others (none: no answer), and a commit certificate counts the
held endorsements with the answer's (docs/LEADERLESS.md "Answers by what the asker
holds")."""

from __future__ import annotations

import pytest
from leaderless_harness import (
    CODEC,
    EPOCH,
    Cluster,
    KvApp,
    client_keys,
    endorsement,
    make_tx,
    pending_at_n1,
    run,
    submit_split_pairs,
    tx_id,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.held import HeldMasks
from phalanx.consensus.leaderless.messages import FetchTransactions, TransactionProof
from phalanx.consensus.types import NodeId
from phalanx.protocols.leaderless_checkpoints import EnvelopeFormat

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))


def test_masks_name_the_unconditional_endorsers_in_sorted_member_order() -> None:
    members = tuple(NodeId(f"n{i}") for i in range(10, 0, -1))  # any order: sorted inside
    masks = HeldMasks(members)
    assert masks.width == 2
    assert masks.zero == b"\0\0"
    tx, other = make_tx("add x 1"), make_tx("add y 1", client="c2")
    held = masks.mask([endorsement("n1", tx), endorsement("n3", tx, (tx_id(other),)),
                       endorsement("n9", tx), endorsement("n99", tx)],  # n99: no member
                      holds_tx=False)
    assert [m for m in sorted(members) if masks.has(held, m)] == [N1, NodeId("n9")]
    assert not masks.holds_tx(held)
    assert masks.holds_tx(masks.mask([], holds_tx=True))
    assert not masks.body_only(held)
    assert masks.body_only(masks.mask([], holds_tx=False, body_only=True))
    assert HeldMasks(tuple(NodeId(f"n{i}") for i in range(1, 7))).width == 1  # 6 + 2 bits
    assert HeldMasks(tuple(NodeId(f"n{i}") for i in range(1, 8))).width == 2
    assert masks.field([b"a", b"b"], lambda _t: masks.zero) == b""  # nothing held: empty
    assert masks.field([b"a", b"b"], {b"a": b"", b"b": held}.__getitem__) == b"\0\0" + held
    assert masks.split(b"", 2) == [b"\0\0", b"\0\0"]
    assert masks.split(b"\0\0" + held, 2) == [b"\0\0", held]
    assert masks.split(b"\0\0\0", 2) is None  # not 2 bitmaps: malformed
    assert masks.split(("x",), 1) is None  # not bytes (peer input)


def test_an_answer_leaves_out_what_the_asker_holds_and_is_not_sent_when_nothing_is_left(
) -> None:
    core, app, tx = pending_at_n1()
    masks = HeldMasks((N1, N2, N3, N4))
    ask = (tx_id(tx),)

    def answer(held: bytes) -> list[object]:
        ready = run(core, app, Receive(src=N3, message=FetchTransactions(tx_ids=ask, held=held)))
        return [s.message for s in ready.messages if s.to == N3]

    (full,) = answer(b"")  # no bitmap: everything, as before
    assert isinstance(full, TransactionProof)
    assert full.tx == tx
    assert sorted(e.endorser for e in full.endorsements) == [N1, N2]
    (rest,) = answer(masks.mask([endorsement("n1", tx)], holds_tx=True))
    assert isinstance(rest, TransactionProof)
    assert [e.endorser for e in rest.endorsements] == [N2]  # n1's is held: left out
    # Nothing left for an asker that holds the transaction: no answer (the body alone would
    # change nothing there: `test_commit_triggers.py`).
    assert answer(masks.mask([endorsement("n1", tx), endorsement("n2", tx)], holds_tx=True)) == []
    # Not holding it, it gets the body (its endorsements it holds stay left out).
    (body,) = answer(masks.mask([endorsement("n1", tx), endorsement("n2", tx)], holds_tx=False))
    assert isinstance(body, TransactionProof)
    assert body.tx == tx
    assert body.endorsements == ()
    # A malformed bitmap is dropped and counted, and answered in full.
    (again,) = answer(b"\1\2\3")
    assert isinstance(again, TransactionProof)
    assert len(again.endorsements) == 2
    assert core.status().dropped.get("malformed_fetch_held") == 1


def test_an_overdue_pull_says_what_it_holds() -> None:
    core, app, tx = pending_at_n1()
    masks = HeldMasks((N1, N2, N3, N4))
    fetches = []
    now = EPOCH
    while now < tx.deadline_ms + 2_000:
        now += 100
        ready = run(core, app, Tick(now_ms=now))
        fetches += [s.message for s in ready.messages
                    if isinstance(s.message, FetchTransactions)]
    assert fetches, "the overdue transaction was pulled"
    for fetch in fetches:
        assert fetch.tx_ids == (tx_id(tx),)
        (held,) = masks.split(fetch.held, 1) or [b""]
        assert [m for m in (N1, N2, N3, N4) if masks.has(held, m)] == [N1, N2]
        assert masks.holds_tx(held)


def test_a_certificate_counts_the_held_endorsements_with_the_answers() -> None:
    """An equivocating n3 endorsed conditionally at n1 and unconditionally elsewhere: the
    answer to n1 (which holds n1's and n2's unconditional ones) carries n3's unconditional
    one alone, and n1 commits on the three (before, it needed all three in the proof)."""
    core, app, tx = pending_at_n1()
    blocker = make_tx("add y 1", client="c2")
    run(core, app, Receive(src=N3, message=endorsement("n3", tx, (tx_id(blocker),))))
    assert core.status().pending == 1
    assert core.status().committed == 0
    proof = TransactionProof(tx=tx, endorsements=(endorsement("n3", tx),))
    run(core, app, Receive(src=N4, message=proof))
    assert core.status().committed == 1
    assert app.data == {"x": b"1"}


def test_a_backlog_pulled_with_bitmaps_gets_only_what_it_lacks() -> None:
    """The refetch backlog (n4 down, split pairs pending past their deadlines at n1..n3):
    every proof answering a fetch with a bitmap leaves out the endorsements it names, and
    once n4 is back every pair is decided as before."""
    c = Cluster(4)
    c.down = {N4}
    pairs = submit_split_pairs(c, 5)
    masks = HeldMasks(c.ids)
    answered = 0
    for _ in range(40):
        c.now += 100
        for node in c.ids[:3]:
            c.step(node, Tick(now_ms=c.now))
        while c.net:
            src, send = c.net.pop(0)
            if send.to in c.down:
                continue
            ready = c.step(send.to, Receive(src=src, message=send.message))
            if isinstance(send.message, FetchTransactions) and send.message.held:
                held = masks.split(send.message.held, len(send.message.tx_ids))
                assert held is not None
                by_id = dict(zip(send.message.tx_ids, held, strict=True))
                for answer in ready.messages:
                    if isinstance(answer.message, TransactionProof):
                        answered += 1
                        mask = by_id[tx_id(answer.message.tx)]
                        assert not any(masks.has(mask, e.endorser)
                                       for e in answer.message.endorsements)
    assert answered
    c.down.clear()
    c.tick(100, rounds=60)
    assert len(pairs) == 5
    assert all(c.nodes[n].core.status().pending == 0 for n in c.ids)


def test_a_named_fetch_asks_for_the_body_alone() -> None:
    """n3 learns of a transaction only from endorsements (its client did not send it there):
    it asks each endorser for the body alone (the endorsers send it their endorsements
    themselves); the answer is the transaction without endorsements, and n3 holds it with
    the endorsement it buffered."""
    c = Cluster(4)
    c.tick(100)  # the cores know the time: n1 endorses at once (and does not relay the tx)
    tx = make_tx("add x 1")
    c.submit(tx, to=(N1,))
    n1_sends = [s for s in c.net if s[1].to == N3]
    c.net = []
    for src, send in n1_sends:
        c.step(N3, Receive(src=src, message=send.message))
    asks = [s for s in c.net if isinstance(s[1].message, FetchTransactions)]
    assert asks, "n3 asked n1 for the transaction its endorsement named"
    masks = HeldMasks(c.ids)
    (held,) = masks.split(asks[0][1].message.held, 1) or [b""]
    assert masks.body_only(held)
    assert not masks.holds_tx(held)
    c.net = []
    ready = c.step(N1, Receive(src=N3, message=asks[0][1].message))
    (answer,) = [s.message for s in ready.messages if s.to == N3]
    assert isinstance(answer, TransactionProof)
    assert answer.tx == tx
    assert answer.endorsements == ()
    c.step(N3, Receive(src=N1, message=answer))
    assert c.nodes[N3].core._store.get(tx_id(tx)) is not None  # learnt, with n1's buffered
    assert N1 in c.nodes[N3].core._store.get(tx_id(tx)).endorsements  # type: ignore[union-attr]


@pytest.mark.parametrize(("buffered", "answered", "certified"), [
    (("n2", "n3", "n4"), (), True),  # a named fetch's body-only answer
    (("n2", "n3"), ("n4",), True),  # a bitmap's answer: what the asker lacks
    (("n2", "n3"), (), False),  # fewer than Q in all
])
def test_a_stale_answer_counts_the_buffered_endorsements_towards_state_transfer(
        buffered: tuple[str, ...], answered: tuple[str, ...], certified: bool) -> None:
    """1 s-horizon seed 31: n1's clock runs ahead, so a transaction it missed is past its
    GC horizon by the time its body arrives (`stale_tx`), and only a checkpoint can bring
    it; a proof with Q valid endorsements asks for one (`_stale_certified`). The
    endorsements reached n1 directly (buffered: the transaction is unknown), so its fetches
    asked for the body alone or named them held, and the answers leave them out: the
    buffered ones count with the proof's. Before, n1 counted the proof's alone (< Q = 3),
    never asked, and ended two writes behind (`converge`)."""
    app = KvApp()
    cfg = LeaderlessConfig(node_id=N1, nodes=(N1, N2, N3, N4), gc_horizon_ms=1_000)
    core = LeaderlessCore(cfg, crypto=FastCrypto(N1), client_keys=client_keys(), app=app,
                          codec=CODEC, checkpoint_format=EnvelopeFormat())
    run(core, app, Tick(now_ms=EPOCH + 2_000))  # the horizon is EPOCH + 1000
    tx = make_tx("add x 1", deadline=EPOCH + 100)
    masks = HeldMasks((N1, N2, N3, N4))
    for node in buffered:
        ready = run(core, app, Receive(src=NodeId(node), message=endorsement(node, tx)))
        (ask,) = [s.message for s in ready.messages if isinstance(s.message, FetchTransactions)]
        (held,) = masks.split(ask.held, 1) or [b""]
        assert masks.body_only(held)  # the named fetch: the endorsers' own reach n1
    assert core.status().catching_up == ""
    proof = TransactionProof(tx=tx, endorsements=tuple(endorsement(n, tx) for n in answered))
    run(core, app, Receive(src=N2, message=proof))
    assert core.status().dropped.get("stale_tx") == 1
    assert core.status().catching_up == (
        "a certified transaction past the GC horizon" if certified else "")

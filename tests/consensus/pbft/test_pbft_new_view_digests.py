"""A NewView names its view changes by (replica, digest) (Castro-Liskov TOCS §5.2): its size
does not grow with the prepared certificates the view changes carry; a backup that lacks a
named ViewChange fetches it (from its signer, then from the new primary) and enters the view;
a NewView naming a digest that matches nothing is not entered, counted, and forgotten at the
next view change; a NewView whose O set does not follow from the named view changes is dropped.
"""

from __future__ import annotations

import dataclasses

from pbft_harness import Cluster, req

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.pbft import PBFT_MESSAGES, PbftCore
from phalanx.consensus.pbft.messages import (
    FetchViewChanges,
    NewView,
    RelayedViewChange,
    ViewChange,
    ViewChangeRef,
)
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire

wire.register_all(PBFT_MESSAGES)
CODEC = wire.default_registry()


def _view_change_to_1(
    c: Cluster, *, drop: object = None, rewrite: object = None, ticks: int = 60
) -> list[tuple[NodeId, NodeId, Message]]:
    """Crash n0 (primary of view 0), have the others ask for view 1 and `_drive`."""
    c.crash(c.ids[0])
    for i in c.ids[1:]:
        c.submit(i, req("vc", 0))
    return _drive(c, drop=drop, rewrite=rewrite, ticks=ticks)


def _drive(
    c: Cluster, *, drop: object = None, rewrite: object = None, ticks: int = 60
) -> list[tuple[NodeId, NodeId, Message]]:
    """Tick and deliver `ticks` times; every message passes `rewrite(src, dst, msg)` (the
    message delivered instead) and `drop(src, dst, msg)` (True: lost); returns every message
    sent, in order."""
    sent: list[tuple[NodeId, NodeId, Message]] = []

    def deliver() -> None:
        while c.net:
            src, dst, msg = c.net.pop(0)
            if callable(rewrite):
                msg = rewrite(src, dst, msg)
            sent.append((src, dst, msg))
            if (callable(drop) and drop(src, dst, msg)) or dst in c.down:
                continue
            c.step(dst, Receive(src=src, message=msg))

    for _ in range(ticks):
        c.tick(1)
        deliver()
    return sent


def _prepared_then_view_change(k: int) -> tuple[NewView, int]:
    """k batches committed in view 0 (below the first checkpoint: their prepared certificates
    stay in every ViewChange), then a view change: the NewView and its view changes' bytes."""
    c = Cluster(4, batch_size=1, checkpoint_interval=8, log_window=16, view_change_ticks=3)
    for no in range(k):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    assert all(len(c.app[i]) == k for i in c.ids)
    sent = _view_change_to_1(c)
    nvs = [m for _, _, m in sent if isinstance(m, NewView)]
    vcs = {m.replica: m for _, _, m in sent if isinstance(m, ViewChange) and m.new_view == 1}
    assert nvs
    assert all(c.cores[i].view == 1 for i in c.ids[1:])
    assert all(c.cores[i].status().view_active for i in c.ids[1:])
    assert all(len(vc.prepared_proofs) == k for vc in vcs.values())
    return nvs[0], sum(len(CODEC.encode(vc)) for vc in vcs.values())


def test_a_new_view_does_not_grow_with_the_prepared_certificates() -> None:
    small, small_vcs = _prepared_then_view_change(1)
    big, big_vcs = _prepared_then_view_change(6)
    assert big_vcs > 4 * small_vcs  # the view changes grow with their certificates ...
    # ... V does not: 2f+1 (replica, digest) pairs whatever they carry. (O grows by the
    # batches it re-issues, once each: no certificate travels in a NewView.)
    assert len(CODEC.encode(dataclasses.replace(big, pre_prepares=()))) == len(
        CODEC.encode(dataclasses.replace(small, pre_prepares=()))
    )
    assert len(big.pre_prepares) == 6
    assert len(CODEC.encode(big)) * 3 < big_vcs


def test_a_backup_lacking_a_view_change_fetches_it_and_enters_the_view() -> None:
    c = Cluster(4, batch_size=1, view_change_ticks=3)
    n1, n2, n3 = c.ids[1:]
    # n3's ViewChange never reaches n2 directly (only the answer to a fetch does).
    sent = _view_change_to_1(
        c, drop=lambda s, d, m: isinstance(m, ViewChange) and (s, d) == (n3, n2)
    )
    nv = next(m for _, _, m in sent if isinstance(m, NewView))
    assert n3 in {ref.replica for ref in nv.view_changes}
    # One fetch round, a tick after the NewView: the signer for its own, the new primary for
    # every missing one (here the same one).
    fetches = {d: m for s, d, m in sent if s == n2 and isinstance(m, FetchViewChanges)}
    assert sorted(fetches) == [n1, n3]
    assert all([r.replica for r in m.wanted] == [n3] for m in fetches.values())
    assert any(isinstance(m, RelayedViewChange) and (s, d) == (n3, n2) for s, d, m in sent)
    assert c.cores[n2].view == 1
    assert c.cores[n2].status().view_active
    c.submit(n1, req("after", 0))
    for _ in range(3):
        c.tick(1)
        c.deliver()
    assert all(c.app[i][-1] == b"after:0" for i in (n1, n2, n3))
    c.assert_agreement()


def test_a_backup_whose_signer_stays_silent_fetches_the_view_change_from_the_new_primary() -> None:
    c = Cluster(4, batch_size=1, view_change_ticks=3)
    n1, n2, n3 = c.ids[1:]

    def drop(s: NodeId, d: NodeId, m: Message) -> bool:
        # n3 never sends n2 its ViewChange, nor answers n2's fetch.
        return (s, d) == (n3, n2) and isinstance(m, ViewChange | RelayedViewChange)

    sent = _view_change_to_1(c, drop=drop, ticks=40)
    asked = [d for s, d, m in sent if s == n2 and isinstance(m, FetchViewChanges)]
    assert sorted(asked) == [n1, n3]  # one round (n3 silent, n1 answers), no retry
    relays = [m for s, d, m in sent if (s, d) == (n1, n2) and isinstance(m, RelayedViewChange)]
    assert [r.view_change.replica for r in relays] == [n3]
    assert c.cores[n2].view == 1
    assert c.cores[n2].status().view_active
    c.assert_agreement()


def _wrong(c: Cluster, nv: NewView, **change: object) -> NewView:
    bad = dataclasses.replace(nv, signature=b"", **change)  # type: ignore[arg-type]
    return c.byz_sign(nv.replica, bad)  # type: ignore[return-value]


def test_a_new_view_naming_a_wrong_digest_is_counted_not_entered_and_forgotten_later() -> None:
    c = Cluster(4, batch_size=1, view_change_ticks=3, max_view_change_ticks=6)
    n2, n3 = c.ids[2:]

    def rewrite(s: NodeId, d: NodeId, m: Message) -> Message:
        if isinstance(m, NewView) and m.view == 1 and d == n2:
            refs = tuple(
                ViewChangeRef(replica=r.replica, digest=bytes(32)) if r.replica == n3 else r
                for r in m.view_changes
            )
            if refs != m.view_changes:
                return _wrong(c, m, view_changes=refs)
        return m

    _view_change_to_1(c, rewrite=rewrite, ticks=4)
    core = c.cores[n2]
    assert core.status().dropped.get("view_change_digest_mismatch") == 1
    assert not (core.view == 1 and core.status().view_active)
    waiting = core._views._fetch.waiting  # the NewView waits: no one can supply that digest
    assert [w.nv.view for w in waiting.values()] == [1]
    # The primary resends its NewView to n2 (n2 re-broadcasts its ViewChange for view 1,
    # which the primary finds stale), always naming that digest: n2's view-change timer
    # moves it on, the waiting NewView is forgotten, the other two join it later.
    _drive(c, rewrite=rewrite, ticks=40)
    assert core.view >= 2
    assert all(w.nv.view >= 2 for w in core._views._fetch.waiting.values())
    c.assert_agreement()


def test_a_new_view_whose_o_set_does_not_follow_from_its_view_changes_is_dropped() -> None:
    c = Cluster(4, batch_size=1, view_change_ticks=3)
    n2 = c.ids[2]
    c.submit(c.ids[0], req("a", 0))
    c.deliver()  # seq 1 prepared everywhere: O must re-issue it

    def rewrite(s: NodeId, d: NodeId, m: Message) -> Message:
        if isinstance(m, NewView) and d == n2 and m.pre_prepares:
            return _wrong(c, m, pre_prepares=())
        return m

    _view_change_to_1(c, rewrite=rewrite, ticks=4)
    assert c.dropped(n2).get("bad_new_view") == 1
    assert not (c.cores[n2].view == 1 and c.cores[n2].status().view_active)


def test_view_changes_sharing_certificates_verify_each_vote_once() -> None:
    # Two replicas' view changes for view 1 carry certificates for the same seqs, mostly of
    # the same votes: a replica verifies the second one's outer signature and looks the
    # votes up (FastCrypto.OPS[1] counts signature verifications).
    c = Cluster(4, batch_size=1, view_change_ticks=3)
    for no in range(3):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    sent = _view_change_to_1(c, ticks=8)
    vcs = [m for _, d, m in sent if isinstance(m, ViewChange) and d == c.ids[1]]
    a = next(v for v in vcs if v.replica == c.ids[2] and v.new_view == 1)
    b = next(v for v in vcs if v.replica == c.ids[3] and v.new_view == 1)
    assert len(a.prepared_proofs) == len(b.prepared_proofs) == 3
    fresh = PbftCore(c.config(c.ids[1]), crypto=FastCrypto(c.ids[1]))
    ops = FastCrypto.OPS
    before = ops[1]
    fresh.step(Receive(src=a.replica, message=a))
    full = ops[1] - before
    assert full >= 1 + 3 * 3  # its signature, and per certificate a pre-prepare and 2 prepares
    before = ops[1]
    fresh.step(Receive(src=b.replica, message=b))
    shared = {p for cert in a.prepared_proofs for p in (cert.pre_prepare, *cert.prepares)}
    unseen = sum(
        1 for cert in b.prepared_proofs for p in (cert.pre_prepare, *cert.prepares)
        if p not in shared
    )
    assert ops[1] - before == 1 + unseen
    assert ops[1] - before < full

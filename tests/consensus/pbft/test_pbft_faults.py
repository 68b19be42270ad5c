"""PBFT under faults: view change, exponential timeouts, checkpoints and GC, state transfer,
Byzantine input dropped and counted, equivocating primaries, and the deliberate bugs."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from pbft_harness import Cluster, req

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import digest_of
from phalanx.consensus.pbft import PbftCore
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    Commit,
    NewView,
    Prepare,
    PrePrepare,
    RelayedViewChange,
    ViewChange,
    ViewChangeRef,
)
from phalanx.consensus.pbft.view_change import view_change_digest
from phalanx.consensus.types import Message, NodeId


def _pp(c: Cluster, view: int, seq: int, batch: tuple, by: NodeId) -> PrePrepare:  # type: ignore[type-arg]
    pp = PrePrepare(
        view=view, seq=seq, digest=digest_of(c.crypto[by], batch), batch=batch, replica=by
    )
    return c.byz_sign(by, pp)  # type: ignore[return-value]


def _commit(c: Cluster, by: NodeId, to: NodeId, view: int, seq: int, digest: bytes) -> Commit:
    commit = Commit(view=view, seq=seq, digest=digest, replica=by)
    return Commit(view=view, seq=seq, digest=digest, replica=by, auth=c.crypto[by].mac(to, commit))


def _commands(c: Cluster, node: NodeId) -> list[bytes]:
    return c.app[node]


def test_primary_crash_view_change_preserves_prepared_requests() -> None:
    c = Cluster(4, batch_size=1)
    c.filter = lambda s, d, m: not isinstance(m, Commit)
    c.submit(c.ids[0], req("a", 0))
    c.deliver()
    assert all(c.entries[i] == [] for i in c.ids)  # prepared everywhere, committed nowhere
    c.filter = None
    c.crash(c.ids[0])
    for i in c.ids[1:]:
        c.submit(i, req("b", 0))
    c.deliver()
    c.tick(c.config(c.ids[1]).view_change_ticks + 1)
    c.deliver()
    for i in c.ids[1:]:
        assert c.cores[i].view == 1
        assert _commands(c, i) == [b"a:0", b"b:0"]  # seq 1 re-issued by the NewView O set
    c.assert_agreement()


def test_view_change_timeout_doubles() -> None:
    # Only ViewChanges get through (no NewView ever does): three replicas keep changing view
    # together, and the timer of each consecutive view change is twice the last.
    c = Cluster(4, batch_size=1, view_change_ticks=5, max_view_change_ticks=1000)
    c.filter = lambda s, d, m: isinstance(m, ViewChange)
    group = c.ids[1:]
    for node in group:
        c.submit(node, req("a", 0))
    node = c.ids[2]
    started: dict[int, int] = {}  # view -> tick at which `node` first asked for it
    for t in range(1, 400):
        before = len(c.net)
        c.tick(1, group)
        for src, _, m in c.net[before:]:
            if src == node and isinstance(m, ViewChange):
                started.setdefault(m.new_view, t)
        c.deliver()
    gaps = [started[v + 1] - started[v] for v in range(1, 5)]
    assert started[1] == 6
    # Each timer starts a tick or two after the view change is backed (the others' votes
    # arrive), and a replica joins a view f+1 others asked for a tick or two early (rule 2).
    assert all(abs(gap - 10 * 2**k) <= 3 for k, gap in enumerate(gaps)), gaps
    assert {c.cores[n].view for n in group} == {len(started)}


def test_a_replica_that_leaves_a_view_alone_waits_for_the_others() -> None:
    # Liveness rule 1 (Castro-Liskov §4.5.2): an isolated replica asks for view 1, and no
    # later view, until 2f+1 replicas back a view change: it does not race ahead alone.
    c = Cluster(4, batch_size=1, view_change_ticks=5, max_view_change_ticks=1000)
    c.filter = lambda s, d, m: False
    node = c.ids[2]
    c.submit(node, req("a", 0))
    c.tick(300, [node])
    assert c.cores[node].view == 1
    assert not c.cores[node].status().view_active
    asked = {m.new_view for src, _, m in c.net if src == node and isinstance(m, ViewChange)}
    assert asked == {1}  # re-broadcast every fetch_ticks, never for view 2
    assert sum(isinstance(m, ViewChange) for src, _, m in c.net if src == node) > 3 * 3
    # The primary of view 0 then falls silent: once the others back the view change, the
    # primary of view 1 sends its NewView and everyone who can speak is in view 1.
    c.filter = lambda s, d, m: s != c.ids[0]
    for other in (c.ids[1], c.ids[3]):
        c.submit(other, req("a", 0))
    for _ in range(60):
        c.tick(1)
        c.deliver()
    assert {c.cores[n].view for n in c.ids[1:]} == {1}
    assert all(c.cores[n].status().view_active for n in c.ids[1:])
    assert [e.requests for e in c.entries[node] if e.requests] == [(req("a", 0),)]


def test_checkpoints_become_stable_and_collect_garbage() -> None:
    c = Cluster(4, batch_size=1, checkpoint_interval=4, log_window=8)
    for no in range(11):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    for i in c.ids:
        st_ = c.cores[i].status()
        assert st_.commit_index == 11
        assert (st_.low_water, st_.high_water) == (8, 16)
        assert st_.log_slots <= 3
        durable = c.durable[i]
        assert durable.stable_seq == 8
        assert len({cp.replica for cp in durable.stable_proof}) >= 3
        assert all(v.seq > 8 for v in durable.safety.votes)
        assert all(p.pre_prepare.seq > 8 for p in durable.prepared)


def test_lagging_replica_catches_up_by_state_transfer() -> None:
    c = Cluster(4, batch_size=1, checkpoint_interval=4, log_window=8)
    lag = c.ids[3]
    c.down.add(lag)
    for no in range(10):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    c.down.discard(lag)
    for no in range(10, 14):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    c.tick(12)
    c.deliver()
    assert c.app[lag] == c.app[c.ids[0]]
    assert len(c.app[lag]) == 14
    c.assert_agreement()


def test_wrong_checkpoint_data_is_dropped_during_state_transfer() -> None:
    c = Cluster(4, batch_size=1, checkpoint_interval=4, log_window=8)
    lag = c.ids[3]
    c.down.add(lag)
    for no in range(8):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    c.down.discard(lag)

    def corrupt(s: NodeId, d: NodeId, m: Message) -> bool:
        if type(m).__name__ == "CheckpointData":
            c.inject(s, d, type(m)(seq=m.seq, data=b"garbage", replica=m.replica))  # type: ignore[attr-defined]
            c.filter = None
            return False
        return True

    c.filter = corrupt
    for no in range(8, 12):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    assert c.dropped(lag).get("bad_checkpoint_digest") == 1
    c.tick(12)
    c.deliver()
    assert c.app[lag] == c.app[c.ids[0]]


def test_byzantine_input_is_dropped_and_counted() -> None:
    c = Cluster(4, byzantine=(3,), batch_size=1)
    byz, target = c.ids[3], c.ids[1]
    c.submit(c.ids[0], req("a", 0))
    c.deliver()
    good = c.byz_sign(byz, Prepare(view=0, seq=2, digest=b"d", replica=byz))
    pp = _pp(c, 0, 3, (req("x", 1),), c.ids[0])
    primary = c.ids[0]
    cases: list[tuple[NodeId, Message, str]] = [
        (byz, c.byz_sign(byz, Prepare(view=0, seq=99, digest=b"d", replica=byz)), "out_of_window"),
        (byz, _pp(c, 0, 3, (req("x", 1),), byz), "not_primary"),
        (primary, dataclasses.replace(pp, signature=b"forged"), "bad_signature"),
        (primary, dataclasses.replace(pp, seq=4), "bad_signature"),  # signed, then mutated
        (primary, dataclasses.replace(pp, batch=()), "bad_digest"),
        (byz, Commit(view=0, seq=2, digest=b"d", replica=byz, auth=b"bad"), "bad_auth"),
        (byz, Checkpoint(seq=4, digest=b"d", replica=byz, signature=b"forged"), "bad_signature"),
        (byz, Prepare(view=0, seq=2, digest=b"d", replica=c.ids[2]), "sender_mismatch"),
    ]
    for src, msg, reason in cases:
        before = c.dropped(target).get(reason, 0)
        c.step(target, Receive(src=src, message=msg))
        assert c.dropped(target).get(reason, 0) == before + 1, reason
    # Replays of an old message, and a stale view, are dropped too.
    c.step(target, Receive(src=byz, message=good))
    c.step(target, Receive(src=byz, message=good))
    assert c.dropped(target).get("duplicate") == 1
    wrong = _pp(c, 0, 1, (req("z", 9),), c.ids[0])
    c.step(target, Receive(src=c.ids[0], message=wrong))
    assert c.dropped(target).get("equivocation") == 1
    assert c.entries[target][0].requests == (req("a", 0),)


def test_forged_prepare_never_counts() -> None:
    """A forged prepare that would complete a certificate is dropped and counted: the
    replica does not commit on it, and takes the sender's next (valid) prepare."""
    c = Cluster(4, byzantine=(3,), batch_size=1)
    byz, target, other = c.ids[3], c.ids[1], c.ids[2]
    c.filter = lambda s, d, m: not (s == other and isinstance(m, Prepare))
    c.submit(c.ids[0], req("a", 0))
    c.deliver()
    pp = next(m for _, d, m in c.byz_inbox if d == byz and isinstance(m, PrePrepare))
    commits_from_target = lambda: [m for s, _, m in c.net if s == target and isinstance(m, Commit)]  # noqa: E731
    forged = Prepare(view=0, seq=pp.seq, digest=pp.digest, replica=byz, signature=b"x" * 32)
    c.step(target, Receive(src=byz, message=forged))
    assert c.dropped(target).get("bad_signature") == 1
    assert commits_from_target() == []
    assert c.cores[target].durable_state().prepared == ()
    signed = c.byz_sign(byz, Prepare(view=0, seq=pp.seq, digest=pp.digest, replica=byz))
    c.step(target, Receive(src=byz, message=signed))
    assert len(commits_from_target()) == 3
    (cert,) = c.cores[target].durable_state().prepared
    assert byz in {p.replica for p in cert.prepares}
    assert all(c.crypto[target].verify(p.replica, p, p.signature) for p in cert.prepares)


def test_only_the_prepares_a_certificate_needs_are_checked() -> None:
    """A backup checks one peer's prepare per slot and the primary two (of three): one that
    arrives for a certified slot is never needed, stored unchecked, and never counted."""
    c = Cluster(4, batch_size=1)
    calls: dict[NodeId, int] = {}
    for node in c.ids:
        counting = _CountingVerify(c.crypto[node], node, calls)
        c.cores[node] = PbftCore(c.config(node), crypto=counting)  # type: ignore[arg-type]
    for no in range(3):
        c.submit_all(req("a", no))
        c.deliver()
    assert all(len(c.app[n]) == 3 for n in c.ids)
    assert calls == {c.ids[0]: 6, c.ids[1]: 3, c.ids[2]: 3, c.ids[3]: 3}
    # A late forged prepare for a certified slot changes nothing (it is never counted).
    primary, backup, late = c.ids[0], c.ids[1], c.ids[3]
    before = c.cores[primary].durable_state().prepared
    pp = before[0].pre_prepare
    forged = Prepare(view=0, seq=pp.seq, digest=pp.digest, replica=late, signature=b"x" * 32)
    c.step(primary, Receive(src=late, message=forged))  # duplicate of late's real prepare
    c.step(backup, Receive(src=late, message=forged))
    assert c.cores[primary].durable_state().prepared == before
    for node in c.ids:
        for cert in c.cores[node].durable_state().prepared:
            assert all(c.crypto[node].verify(p.replica, p, p.signature) for p in cert.prepares)


class _CountingVerify:
    """A node's crypto that counts the prepares it verifies (the rest delegates)."""

    def __init__(self, inner: object, node: NodeId, calls: dict[NodeId, int]) -> None:
        self._inner, self._node, self._calls = inner, node, calls

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        if isinstance(obj, Prepare):
            self._calls[self._node] = self._calls.get(self._node, 0) + 1
        return self._inner.verify(node, obj, signature)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.booleans(), min_size=3, max_size=3),
    st.lists(st.booleans(), min_size=3, max_size=3),
    st.integers(0, 2**32),
)
def test_equivocating_primary_cannot_split_honest_replicas(
    split1: list[bool], split2: list[bool], seed: int
) -> None:
    c = Cluster(4, byzantine=(0,), batch_size=1)
    byz = c.ids[0]
    rng = random.Random(seed)
    for seq, split in ((1, split1), (2, split2)):
        a, b = (req("a", seq),), (req("b", seq),)
        for backup, pick_a in zip(c.ids[1:], split, strict=True):
            c.inject(byz, backup, _pp(c, 0, seq, a if pick_a else b, byz))
            for batch in (a, b):  # the Byzantine primary commits to everything
                d = digest_of(c.crypto[byz], batch)
                c.inject(byz, backup, _commit(c, byz, backup, 0, seq, d))
    c.deliver(rng)
    c.assert_agreement()


def test_bug_accept_unsigned_view_change_lets_forged_new_view_diverge() -> None:
    assert _forged_new_view_scenario(frozenset({"accept_unsigned_view_change"}))
    assert not _forged_new_view_scenario(frozenset())


def _forged_new_view_scenario(bugs: frozenset[str]) -> bool:
    c = Cluster(4, byzantine=(1,), bugs=bugs, batch_size=1, view_change_ticks=3)
    n0, byz, n2, n3 = c.ids
    c.filter = lambda s, d, m: not (isinstance(m, Commit) and d != n0)
    c.submit(n0, req("a", 0))
    c.deliver()
    assert c.app[n0] == [b"a:0"]
    c.filter = lambda s, d, m: d != n0 and s != n0  # n0 partitioned away
    for i in (n2, n3):
        c.submit(i, req("b", 0))
    c.tick(5, [n2, n3])
    c.deliver()
    own = c.byz_sign(
        byz,
        ViewChange(new_view=1, stable_seq=0, checkpoint_proof=(), prepared_proofs=(), replica=byz),
    )
    forged = tuple(
        ViewChange(
            new_view=1,
            stable_seq=0,
            checkpoint_proof=(),
            prepared_proofs=(),
            replica=r,
            signature=b"forged",
        )
        for r in (n2, n3)
    )
    vcs = (own, *forged)
    refs = tuple(
        ViewChangeRef(replica=vc.replica, digest=view_change_digest(c.crypto[byz], vc))
        for vc in vcs
    )
    nv = c.byz_sign(byz, NewView(view=1, view_changes=refs, pre_prepares=(), replica=byz))
    batch = (req("b", 0),)
    pp = _pp(c, 1, 1, batch, byz)
    for i in (n2, n3):
        c.inject(byz, i, nv)
        for vc in vcs:  # the NewView names them by digest: relayed beside it
            c.inject(byz, i, RelayedViewChange(view_change=vc, replica=byz))  # type: ignore[arg-type]
        c.inject(byz, i, pp)
        c.inject(byz, i, _commit(c, byz, i, 1, 1, pp.digest))
    c.deliver()
    return c.diverged()


def test_bug_skip_view_check_lets_old_view_commit_diverge() -> None:
    assert _old_view_scenario(frozenset({"skip_view_check"}))
    assert not _old_view_scenario(frozenset())


def _old_view_scenario(bugs: frozenset[str]) -> bool:
    c = Cluster(4, byzantine=(0,), bugs=bugs, batch_size=1, view_change_ticks=3)
    byz, n1, n2, n3 = c.ids
    for i in (n1, n2, n3):
        c.submit(i, req("w", 0))
    c.tick(5)
    c.deliver()
    assert all(c.cores[i].view == 1 for i in (n1, n2, n3))
    c.filter = lambda s, d, m: not (isinstance(m, Commit) and m.view == 1 and d != n1)
    c.submit(n1, req("a", 0))
    c.deliver()
    seq = c.cores[n1].executed
    assert c.app[n1][-1] == b"a:0"
    pp = _pp(c, 0, seq, (req("b", 0),), byz)
    for i in (n2, n3):
        c.inject(byz, i, pp)
        c.inject(byz, i, _commit(c, byz, i, 0, seq, pp.digest))
    c.deliver()
    return c.diverged()


def test_bug_commit_on_2f_executes_what_only_one_honest_replica_prepared() -> None:
    assert _commit_on_2f_scenario(frozenset({"commit_on_2f"}))
    assert not _commit_on_2f_scenario(frozenset())


def _commit_on_2f_scenario(bugs: frozenset[str]) -> bool:
    """Byzantine n3 helps n1 alone: with 2f commits n1 executes a batch that no other honest
    replica holds a prepared certificate for, so a later NewView built from the other three
    view changes (n0, n2, n3) may legally drop it: the 2f+1 intersection argument is gone."""
    c = Cluster(4, byzantine=(3,), bugs=bugs, batch_size=1)
    n0, n1, n2, byz = c.ids
    c.filter = lambda s, d, m: d == n1 or d == byz  # only n1 (and n3) hear anything
    c.submit(n0, req("a", 0))
    c.deliver()
    pp = next(m for _, d, m in c.byz_inbox if isinstance(m, PrePrepare))
    prep = c.byz_sign(byz, Prepare(view=0, seq=1, digest=pp.digest, replica=byz))
    c.inject(byz, n1, prep)
    c.inject(byz, n1, _commit(c, byz, n1, 0, 1, pp.digest))
    c.deliver()
    others_prepared = any(c.durable.get(i) and c.durable[i].prepared for i in (n0, n2))
    assert not others_prepared
    return c.app[n1] == [b"a:0"]


def test_a_new_primary_whose_checkpoint_became_stable_meanwhile_refreshes_its_view_change() -> None:
    # The primary of view 1 asks for view 1 with no stable checkpoint, then collects one
    # (checkpoint votes keep being re-sent) before the others' ViewChanges reach it. V must
    # carry that checkpoint: with min-s = 0, O would hold pre-prepares at or below its own
    # stable checkpoint, which its signer refuses (`phalanx sim` seed 1100 at n=4 crashed
    # that way: "PRE_PREPARE at seq 17 <= floor 24").
    c = Cluster(4, batch_size=1, checkpoint_interval=4, log_window=8, view_change_ticks=200,
                max_view_change_ticks=1000)
    silent, primary = c.ids[0], c.ids[1]
    c.filter = lambda s, d, m: not isinstance(m, Checkpoint)
    for no in range(5):
        c.submit(silent, req("a", no))
        c.deliver()
    assert [c.cores[n].status().low_water for n in c.ids] == [0, 0, 0, 0]

    def phase(checkpoints_to_primary: bool, view_changes_to_primary: bool) -> None:
        def keep(s: NodeId, d: NodeId, m: Message) -> bool:
            if s == silent:
                return False
            if isinstance(m, Checkpoint):
                return checkpoints_to_primary and d == primary
            return view_changes_to_primary or not (isinstance(m, ViewChange) and d == primary)
        c.filter = keep

    phase(checkpoints_to_primary=False, view_changes_to_primary=False)
    for n in c.ids[1:]:
        c.submit(n, req("b", 0))
    for _ in range(400):
        c.tick(1)
        c.deliver()
        if all(c.cores[n].view == 1 for n in c.ids[1:]):
            break
    assert not c.cores[primary].status().view_active
    phase(checkpoints_to_primary=True, view_changes_to_primary=False)
    for _ in range(100):
        c.tick(1)
        c.deliver()
    assert c.cores[primary].status().low_water == 4  # its floor is now 4 ...
    own = c.cores[primary]._views.own_view_change()
    assert own is not None
    assert own.stable_seq == 0  # ... its ViewChange's 0
    phase(checkpoints_to_primary=True, view_changes_to_primary=True)
    for _ in range(30):
        c.tick(1)
        c.deliver()
    assert [c.cores[n].view for n in c.ids[1:]] == [1, 1, 1]
    assert all(c.cores[n].status().view_active for n in c.ids[1:])
    assert [r for e in c.entries[c.ids[2]] for r in e.requests][-1] == req("b", 0)
    c.assert_agreement()


def test_votes_from_ourselves_or_a_non_replica_are_dropped_as_unknown_senders() -> None:
    """The sender check (a set since the n = 180 gossip cell: a tuple scan per message
    before): a vote that claims to come from the receiver itself, or from a node outside
    the cluster, is dropped and counted, never stored."""
    c = Cluster(4, batch_size=1)
    me, other = c.ids[1], c.ids[2]
    digest = b"d" * 32
    c.inject(me, me, _commit(c, me, me, 0, 1, digest))
    stranger = NodeId("n99")
    c.inject(stranger, me, Commit(view=0, seq=1, digest=digest, replica=stranger))
    c.inject(other, me, _commit(c, other, me, 0, 1, digest))  # a real peer: stored
    c.deliver()
    assert c.dropped(me).get("unknown_sender") == 2
    assert "bad_auth" not in c.dropped(me)

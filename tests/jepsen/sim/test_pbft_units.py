"""Unit tests of the Byzantine wrappers, the BFT reply filter and the BFT invariants."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Receive, Send, Submit
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.pbft import PbftConfig, PbftCore
from phalanx.consensus.pbft.messages import Checkpoint, PrePrepare, signed_part
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId
from phalanx.jepsen.attacks import ATTACKS
from phalanx.jepsen.byzantine import BEHAVIOURS, ByzantineCore, corrupt_result
from phalanx.jepsen.sim.pbft import BftChecker, BftReplies, choose_byzantine

ATTACK_PLANS = {(a,) for a in ATTACKS}
REPLICAS = tuple(NodeId(f"n{i}") for i in range(1, 5))


def _core(node: str, **kw: object) -> PbftCore:
    cfg = PbftConfig(node_id=NodeId(node), replicas=REPLICAS, batch_size=2, **kw)  # type: ignore[arg-type]
    return PbftCore(cfg, crypto=FastCrypto(NodeId(node)))


def _req(i: int) -> ClientRequest:
    return ClientRequest(client_id="c", request_no=i, command=b"x%d" % i)


def _pre_prepare(crypto: FastCrypto, batch: tuple[ClientRequest, ...]) -> PrePrepare:
    digest = digest_of(crypto, batch)
    pp = PrePrepare(view=0, seq=1, digest=digest, batch=batch, replica=NodeId("n1"))
    return PrePrepare(view=0, seq=1, digest=pp.digest, batch=batch, replica=pp.replica,
                      signature=crypto.sign(signed_part(pp)))


def _byz(behaviours: tuple[str, ...], seed: int = 1, rate: float = 1.0) -> ByzantineCore:
    return ByzantineCore(_core("n1"), behaviours=behaviours, crypto=FastCrypto(NodeId("n1")),
                         rng=random.Random(seed), rate=rate)


def test_silent_sends_nothing_but_keeps_state() -> None:
    byz = _byz(("silent",))
    ready = byz.step(Submit(request=_req(1)))  # an idle primary pre-prepares at once
    assert ready.messages == ()
    assert ready.core_state is not None  # its own record is still persisted
    assert byz.mutations["silent"] >= 1


def test_equivocating_primary_sends_two_digests_that_both_verify() -> None:
    crypto = FastCrypto(NodeId("n2"))
    for seed in range(20):
        byz = _byz(("equivocate",), seed=seed)
        ready = byz.step(Submit(request=_req(1)))  # an idle primary pre-prepares at once
        pps = [s.message for s in ready.messages if isinstance(s.message, PrePrepare)]
        digests = {pp.digest for pp in pps}
        if len(digests) == 2:
            assert all(crypto.verify(NodeId("n1"), signed_part(pp), pp.signature) for pp in pps)
            assert {pp.seq for pp in pps} == {1}
            return
    raise AssertionError("no seed of 20 split the peers into two halves")


def test_forged_pre_prepare_is_dropped_by_an_honest_backup() -> None:
    byz = _byz(("forge",))
    ready = byz.step(Submit(request=_req(1)))  # an idle primary pre-prepares at once
    backup = _core("n2")
    for send in ready.messages:
        if send.to == "n2":
            out = backup.step(Receive(src=NodeId("n1"), message=send.message))
            assert out.messages == ()  # no prepare for a forged pre-prepare
    assert backup.status().dropped.get("bad_signature", 0) >= 1


def test_mutated_messages_are_resigned_and_never_accepted_into_a_wrong_slot() -> None:
    byz = _byz(("mutate",), rate=1.0)
    ready = byz.step(Submit(request=_req(1)))  # an idle primary pre-prepares at once
    crypto = FastCrypto(NodeId("n2"))
    pps = [s.message for s in ready.messages if isinstance(s.message, PrePrepare)]
    assert pps
    assert all(crypto.verify(NodeId("n1"), signed_part(pp), pp.signature) for pp in pps)
    assert any((pp.view, pp.seq) != (0, 1) or pp.digest != digest_of(crypto, pp.batch)
               for pp in pps)


def test_bad_checkpoint_changes_the_digest_and_resigns() -> None:
    byz = _byz(("bad_checkpoint",))
    cp = Checkpoint(seq=8, digest=b"d" * 32, replica=NodeId("n1"))
    out = byz.transform((Send(to=NodeId("n2"), message=cp),))
    sent = out[0].message
    assert isinstance(sent, Checkpoint)
    assert sent.digest != cp.digest
    assert FastCrypto(NodeId("n2")).verify(NodeId("n1"), sent, sent.signature)


def test_unknown_behaviour_is_our_misuse() -> None:
    with pytest.raises(ValueError, match="lie_politely"):
        _byz(("lie_politely",))


@given(st.binary(max_size=64), st.integers(0, 2**32))
def test_corrupt_result_always_differs(result: bytes, seed: int) -> None:
    assert corrupt_result(result, random.Random(seed)) != result


def test_replies_need_f_plus_one_and_filter_a_liar() -> None:
    replies = BftReplies(("n1", "n2", "n3", "n4"), corrupting=("n1",), seed=0)
    assert replies.reply("n1", "c", 1, b"ok") is None  # corrupted, counts for nothing good
    assert replies.reply("n2", "c", 1, b"ok") is None  # f+1 = 2 needed
    assert replies.reply("n3", "c", 1, b"ok") == b"ok"
    assert replies.reply("n4", "c", 1, b"ok") is None  # decided once only
    assert replies.corrupted == 1


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from((4, 7)))
def test_byzantine_plan_is_seeded_and_within_bounds(seed: int, n: int) -> None:
    names = tuple(f"n{i}" for i in range(1, n + 1))
    f = (n - 1) // 3
    plan = choose_byzantine(seed, names, count=f)
    assert plan == choose_byzantine(seed, names, count=f)
    assert len(plan.nodes) == f
    assert all((b and set(b) <= set(BEHAVIOURS)) or b in ATTACK_PLANS for _, b in plan.behaviours)
    attacks = {b for _, b in plan.behaviours if b in ATTACK_PLANS}
    assert len(attacks) <= 1, "one attack per run, shared by every liar"
    if attacks == {("collude",)}:
        assert plan.nodes == names[:f], "colluders lead views 0 .. f-1"


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from((7, 20)))
def test_byzantine_plan_without_targeted_attacks_draws_behaviours_only(seed: int, n: int) -> None:
    names = tuple(f"n{i}" for i in range(1, n + 1))
    f = (n - 1) // 3
    plan = choose_byzantine(seed, names, count=f, targeted_attacks=False)
    assert len(plan.nodes) == f
    assert all(b and set(b) <= set(BEHAVIOURS) for _, b in plan.behaviours)
    # the same liars as the seed's behaviour draw with attacks allowed (only the attack differs)
    with_attacks = choose_byzantine(seed, names, count=f)
    if not any(b in ATTACK_PLANS for _, b in with_attacks.behaviours):
        assert plan == with_attacks


def _entry(seq: int, *reqs: ClientRequest, view: int = 0) -> Entry:
    return Entry(index=seq, term=view, kind=EntryKind.COMMAND, requests=reqs)


def test_checker_agreement_compares_batches_not_views() -> None:
    checker = BftChecker({("c", 1, b"x1"), ("c", 2, b"x2")})
    checker.observe_apply("n1", _entry(1, _req(1), view=0), 0)
    checker.observe_apply("n2", _entry(1, _req(1), view=1), 0)  # re-proposed by a NewView
    assert checker.ok
    checker.observe_apply("n3", _entry(1, _req(2)), 5)
    assert [v.invariant for v in checker.violations] == ["agreement"]


def test_checker_validity_rejects_requests_no_client_issued() -> None:
    checker = BftChecker({("c", 1, b"x1")})
    checker.observe_apply("n1", _entry(1, _req(3)), 0)
    assert [v.invariant for v in checker.violations] == ["validity"]


def test_sim_clients_send_to_the_primary_f_plus_1_name_and_retransmit_to_all() -> None:
    # As `phalanx.client.bft_calls`: alone to the primary that more than f replicas name, to
    # everyone when they do not agree, and every retransmission to everyone.
    names = ("n1", "n2", "n3", "n4")
    replies = BftReplies(names, (), seed=0)
    r = ClientRequest(client_id="c", request_no=1, command=b"x")
    assert replies.targets(r, ["n2", "n2", None, "n1"]) == ("n2",)
    assert replies.targets(r, ["n2", "n2", "n2", "n2"]) == names  # the retransmission
    lone = ClientRequest(client_id="c", request_no=2, command=b"x")
    assert replies.targets(lone, ["n3", None, None, None]) == names  # one replica's word
    seven = BftReplies(tuple(f"n{i}" for i in range(1, 8)), (), seed=0)
    claims = ["n2", "n2", None, None, None, None, None]  # f = 2: two names are not enough
    assert len(seven.targets(r, claims)) == 7
    assert seven.targets(lone, ["n2", "n2", "n2", None, None, None, None]) == ("n2",)

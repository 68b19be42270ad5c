"""CheckpointMachine inputs and bounds: malformed id lists and unknown checkpoints are
counted, the queue is deduplicated and batched, `max_open` and `gc` bound memory; and the
properties: correct nodes agree (and deterministically) under loss and against a Byzantine
voter that sends anything in any order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veto_harness import BATCH, Cluster, proof, signed, start, tid

from phalanx.consensus.core import Send
from phalanx.consensus.leaderless.messages import StartCheckpoint, VoteEcho, VoteReady
from phalanx.consensus.leaderless.veto import VetoEffects

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
    dropped = set(c.dropped["n0"])
    undecided = sum(1 for v in m.votes() if v.tx_ids[0] not in dropped)
    assert undecided <= sum(crashes)
    assert len(m.veto_decisions()) == len(crashes) - undecided
    # Each is blocked: by its drop vote while undecided, by its DROP once decided.
    assert all(m.blocked(v.tx_ids[0]) for v in m.votes())
    m.gc(lambda t: True)  # everything still live: nothing forgotten
    assert len(m) == len(crashes)
    m.gc(lambda t: False)
    assert len(m) == undecided  # only undecided checkpoints stay (own votes are kept)
    assert len(m.votes()) == undecided
    assert m.veto_decisions() == ()
    assert all(m.blocked(v.tx_ids[0]) for v in m.votes())
    assert not any(m.blocked(t) for t in dropped)  # collected DROPs are forgotten
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
        # Every checkpoint decides once loss stops; the one holding a proof is kept. Only
        # the dropped ids stay blocked (decided DROP).
        for i in range(4):
            assert c.machines[node].blocked(tid(i)) == (tid(i) in c.dropped[node])
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

"""The machine in the multi-cluster simulator: one step and two inter-cluster messages when
all is well; a faulty pair costs a retry; the permutation variant stays within f1+f2+1 steps
on reliable links; a Byzantine receiver that does not echo is healed by the next attempt;
duplicates and out-of-order arrivals deliver each value once and in order; the seeded sweep
finds no violation; and the checker catches both deliberate bugs (a receiver that accepts
without a certificate, a sender that never retries)."""

from __future__ import annotations

import pytest

from phalanx.clustersend.certificates import ClusterInfo, certify
from phalanx.clustersend.machine import ClusterSendConfig, ClusterSendMachine
from phalanx.clustersend.messages import (
    CLUSTERSEND_MESSAGES,
    AckStatement,
    CertKind,
    CsAck,
    CsEcho,
    CsSend,
    MemberSignature,
    SendStatement,
    value_digest,
)
from phalanx.clustersend.pairs import Mode, link_seed, schedule
from phalanx.clustersend.sim import (
    ClusterSpec,
    World,
    WorldConfig,
    check,
    main,
    replay_command,
    run_seed,
)
from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.crypto import ed25519_cluster


def _world(a: ClusterSpec, b: ClusterSpec, *, sends: int = 20, mode: Mode = Mode.PCS,
           loss: float = 0.0, seed: int = 1) -> World:
    world = World(WorldConfig(clusters=(a, b), links=(("A", "B"),), sends=sends, seed=seed,
                              loss=loss, machine=ClusterSendConfig(mode=mode)))
    assert world.run(), "did not finish"
    assert check(world) == []
    return world


def test_all_correct_one_step_and_two_inter_cluster_messages_per_send() -> None:
    world = _world(ClusterSpec(name="A", n=4, f=1), ClusterSpec(name="B", n=7, f=2))
    assert {s.steps for s in world.stats.values()} == {1}
    assert {s.inter_messages for s in world.stats.values()} == {2}


def test_real_ed25519_signatures_over_canonical_codec_bytes() -> None:
    """The same world with Ed25519 keys (what the runtime injects): certificates, acks and
    proofs signed over the codec's canonical bytes verify across clusters."""
    wire.register_all(CLUSTERSEND_MESSAGES)
    a = ClusterSpec(name="A", n=4, f=1, crashed=(3,))
    b = ClusterSpec(name="B", n=3, f=1, kind=CertKind.CRASH)  # a leader-signed notice too
    keys = ed25519_cluster(a.members() + b.members(), seed=b"clustersend-sim")
    world = World(WorldConfig(clusters=(a, b), links=(("A", "B"), ("B", "A")), sends=3),
                  crypto=keys)
    assert world.run()
    assert check(world) == []
    assert not any(k.startswith("dropped:") for k in world.counters)


def test_a_faulty_pair_costs_a_retry_and_the_value_still_arrives() -> None:
    world = _world(ClusterSpec(name="A", n=4, f=1, crashed=(0,)),
                   ClusterSpec(name="B", n=4, f=1, crashed=(3,)), sends=30)
    steps = [s.steps for s in world.stats.values()]
    assert max(steps) > 1  # some first pair touched a crashed member  # type: ignore[operator]
    assert world.counters["attempts"] > 30 * 3


@pytest.mark.parametrize("mode", [Mode.PERMUTATION, Mode.BIJECTIVE])
def test_worst_case_steps_on_reliable_links(mode: Mode) -> None:
    world = _world(ClusterSpec(name="A", n=7, f=2, crashed=(1, 4)),
                   ClusterSpec(name="B", n=7, f=2, crashed=(0, 6)), sends=40, mode=mode)
    bound = 5 if mode == Mode.PERMUTATION else 1
    assert max(s.steps or 0 for s in world.stats.values()) <= bound


def test_byzantine_receivers_and_senders_are_survived() -> None:
    world = _world(ClusterSpec(name="A", n=4, f=1, byzantine=((2, "forge"),)),
                   ClusterSpec(name="B", n=4, f=1, byzantine=((1, "ack_blind"),)), sends=30)
    assert world.counters.get("dropped:short_certificate", 0) + \
        world.counters.get("dropped:duplicate_signer", 0) + \
        world.counters.get("dropped:bad_signature", 0) + \
        world.counters.get("dropped:digest_mismatch", 0) > 0
    world = _world(ClusterSpec(name="A", n=4, f=1, byzantine=((0, "wrong_receiver"),)),
                   ClusterSpec(name="B", n=4, f=1, byzantine=((3, "replay"),)), sends=30)
    assert world.counters["dropped:not_my_pair"] > 0


def test_duplicates_and_reordering_deliver_each_value_once_in_order() -> None:
    a = ClusterInfo(cluster_id="A", members=tuple(NodeId(f"A/n{i}") for i in range(4)), f=1)
    b = ClusterInfo(cluster_id="B", members=tuple(NodeId(f"B/n{i}") for i in range(4)), f=1,
                    kind=CertKind.BYZANTINE)
    clusters = {"A": a, "B": b}
    me = b.members[2]
    machine = ClusterSendMachine(me, "B", clusters, crypto=FastCrypto(me))
    certs = []
    for seq in range(3):
        value = b"v%d" % seq
        st = SendStatement(src_cluster="A", dst_cluster="B", epoch=0, seq=seq,
                           digest=value_digest(value))
        certs.append((value, certify(a, st, [FastCrypto(m) for m in a.members])))
    delivered = []
    for seq in (2, 1, 2, 0, 1, 0):
        value, cert = certs[seq]
        delivered += machine.step(Receive(src=b.members[0], message=CsEcho(
            value=value, certificate=cert))).deliver
    assert [(i.seq, i.value) for i in delivered] == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
    # A CsSend of a held value from its attempt's sender: no second delivery.
    value, cert = certs[0]
    seed = link_seed("A", "B", 0, 0)
    attempt = next(x for x in range(500)
                   if schedule(Mode.PCS, seed, x, 4, 4, 1, 1)[0][1] == 2)
    sender = a.members[schedule(Mode.PCS, seed, attempt, 4, 4, 1, 1)[0][0]]
    again = machine.step(Receive(src=sender, message=CsSend(attempt=attempt, value=value,
                                                            certificate=cert)))
    assert again.deliver == ()
    assert machine.status()["delivered"] == 3


def test_acks_far_ahead_or_of_many_digests_are_dropped() -> None:
    """A Byzantine member cannot grow a receiver's ack table without bound."""
    a = ClusterInfo(cluster_id="A", members=tuple(NodeId(f"A/n{i}") for i in range(4)), f=1)
    b = ClusterInfo(cluster_id="B", members=tuple(NodeId(f"B/n{i}") for i in range(4)), f=1)
    me, byz = b.members[0], b.members[3]
    machine = ClusterSendMachine(me, "B", {"A": a, "B": b}, crypto=FastCrypto(me))
    for seq, n in ((5_000, 1), (3, 6)):
        for k in range(n):
            st = AckStatement(src_cluster="A", dst_cluster="B", dst_epoch=0, seq=seq,
                              digest=value_digest(b"made up %d" % k))
            machine.step(Receive(src=byz, message=CsAck(statement=st, signed=MemberSignature(
                signer=byz, sig=FastCrypto(byz).sign(st)))))
    status = machine.status()
    assert status["dropped:ack_too_far_ahead"] == 1
    assert status["dropped:ack_flood"] == 2  # 4 digests kept for seq 3


def test_a_seed_replays_the_same_run() -> None:
    first, again = run_seed(11)[0], run_seed(11)[0]
    assert first.now == again.now
    assert first.counters == again.counters
    assert first.delivered == again.delivered
    assert [(k, s.steps, s.inter_messages) for k, s in first.stats.items()] == \
        [(k, s.steps, s.inter_messages) for k, s in again.stats.items()]


def test_the_replay_command_runs_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "3"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")
    with pytest.raises(SystemExit):
        main(["--seed", "3", "--bug", "no_such_bug"])
    assert "unknown bugs ['no_such_bug']" in capsys.readouterr().err


SWEEP_SEEDS = range(60)


def test_seeded_sweep_finds_no_violation() -> None:
    for seed in SWEEP_SEEDS:
        _, bad = run_seed(seed)
        assert not bad, f"seed {seed}: {bad}\nreplay: {replay_command(seed)}"


@pytest.mark.long
def test_long_seeded_sweep_finds_no_violation() -> None:
    for seed in range(60, 1060):
        _, bad = run_seed(seed)
        assert not bad, f"seed {seed}: {bad}\nreplay: {replay_command(seed)}"


@pytest.mark.parametrize(("bug", "symptom"), [
    ("accept_uncertified", "never agreed to"),
    ("never_retry", "want 0.."),
])
def test_the_sweep_catches_each_deliberate_bug(bug: str, symptom: str) -> None:
    """The first sweep seeds with the bug switched on: the checker must flag one (and say
    what), else the sweep could not tell the bug from the protocol."""
    for seed in range(100):
        _, bad = run_seed(seed, frozenset({bug}))
        if bad:
            assert any(symptom in line for line in bad), bad
            return
    pytest.fail(f"100 sweep seeds with bug {bug} found no violation")


def test_a_forged_value_is_caught_only_with_the_bug() -> None:
    """A forger among the senders: the honest receiver refuses its certificates; one that
    skips the check delivers a value the sending cluster never agreed to."""
    spec_a = ClusterSpec(name="A", n=4, f=1, byzantine=((1, "forge"),))
    spec_b = ClusterSpec(name="B", n=4, f=1)
    for bugs, caught in ((frozenset(), False), (frozenset({"accept_uncertified"}), True)):
        world = World(WorldConfig(clusters=(spec_a, spec_b), links=(("A", "B"),), sends=12,
                                  machine=ClusterSendConfig(bugs=bugs), limit=3000))
        world.run()
        bad = check(world)
        assert bool([b for b in bad if "never agreed to" in b]) == caught, bad

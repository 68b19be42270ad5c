"""Each deliberate PBFT bug is caught by the targeted attack it needs (`phalanx.jepsen.attacks`),
within a fixed seed budget, and the same scenarios without the bug pass: the attacks alone
never break safety with at most f liars (if they did, the checker or the core would be wrong).

A scenario is a sweep seed whose Byzantine plan (`choose_byzantine`, n replicas, f liars) draws
the attack; the seeds are the first ones that do, so the budgets below are exact:

| bug                          | attack         | n | scenario seeds | caught by (check)      |
|------------------------------|----------------|---|----------------|------------------------|
| commit_on_2f                 | collude        | 7 | 1, 14          | seed 1 (agreement)     |
| accept_unsigned_view_change  | forge_new_view | 4 | 4, 5           | seed 5 (agreement)     |
| skip_view_check              | cross_view     | 4 | 1, 9           | seed 1 (agreement)     |
| no_view_fence                | (crash-after-ready, honest) | 4 | 0..6 | seed 6 (vote-safety) |

Every scenario seed runs (seed 4 of forge_new_view ends in a stall, a liveness violation,
since the primary resends its NewView to replicas it hears from in older views). Bug-on runs
stop early at `max_events` (the violation comes first: within 0.25 s of virtual
time; what follows is the broken cluster thrashing).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.pbft import PbftBugs, PbftConfig, PbftCore
from phalanx.consensus.pbft.bugs import SkipViewChangeSignatures
from phalanx.consensus.pbft.messages import (
    Commit,
    NewView,
    Prepare,
    PrePrepare,
    RelayedViewChange,
    signed_part,
)
from phalanx.consensus.pbft.view_change import check_new_view, resolve_view_changes
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.jepsen import nemesis
from phalanx.jepsen.attacks import AttackCore, Collusion
from phalanx.jepsen.sim.pbft import choose_byzantine
from phalanx.jepsen.sim.run import RunConfig
from phalanx.jepsen.sim.sweep import sweep

_MS = 1_000_000
_SHAPE = {"time_ns": 600 * _MS, "liveness_ns": 1_200 * _MS, "clients": 2, "keys": 2}
_BUDGET = 2
_BUG_ON_MAX_EVENTS = 30_000

CASES = [
    ("commit_on_2f", "collude", 7),
    ("accept_unsigned_view_change", "forge_new_view", 4),
    ("skip_view_check", "cross_view", 4),
]


def _scenario_seeds(attack: str, n: int, k: int) -> list[int]:
    names = tuple(f"n{i}" for i in range(1, n + 1))
    found = []
    seed = 0
    while len(found) < k:
        plan = choose_byzantine(seed, names, count=(n - 1) // 3)
        if plan.behaviours and plan.behaviours[0][1] == (attack,):
            found.append(seed)
        seed += 1
    return found


def _base(n: int) -> RunConfig:
    return RunConfig(seed=0, protocol="pbft", nodes=n, byzantine=(n - 1) // 3, **_SHAPE)


@pytest.mark.parametrize(("bug", "attack", "n"), CASES)
def test_bug_is_caught_by_its_attack_within_budget(bug: str, attack: str, n: int) -> None:
    seeds = _scenario_seeds(attack, n, _BUDGET)
    base = dataclasses.replace(_base(n), bugs=frozenset({bug}), max_events=_BUG_ON_MAX_EVENTS)
    result = sweep(base, seeds, jobs=1, stop_on_failure=False)
    assert not result.ok, f"{bug} went unnoticed by {attack} on seeds {seeds}"
    # A broken cluster may also stall (a liveness violation); the bug must show up as what
    # it is, a safety violation, on at least one scenario seed.
    reports = [f.report for f in result.failures]
    assert any("violation: agreement" in r for r in reports), "\n\n".join(reports)


@pytest.mark.parametrize(("bug", "attack", "n"), CASES)
def test_same_scenarios_without_the_bug_pass(bug: str, attack: str, n: int) -> None:
    seeds = _scenario_seeds(attack, n, _BUDGET)
    result = sweep(_base(n), seeds, jobs=1)
    assert result.ok, "\n\n".join(o.report for o in result.failures)


# ---------------------------------------------------------------------------------------------
# no_view_fence: no attack needed, a crash right after a Ready that sent votes early is enough
# (`phalanx.jepsen.sim.pbft.DurableStateCore` restarts the node from the record without them).
# Honest n=4, crash-after-ready only: the primary, restarted in view 0, pre-prepares a new
# batch at a seq whose lost pre-prepare had already left. Seeds 44, 48 and 52 catch it (6 of
# seeds 0-79 do: the primary's batching waits for returning clients, so the two clients of
# this shape share fewer, larger batches and a crash lands between an early pre-prepare and
# its persist less often than when each request had its own).

_FENCE_SEEDS = range(40, 53)


def _fence_base() -> RunConfig:
    return RunConfig(seed=0, protocol="pbft", nodes=4, faults=(nemesis.CRASH_AFTER_READY,),
                     swarm=False, **_SHAPE)


def test_no_view_fence_is_caught_as_equivocation_after_a_crash() -> None:
    base = dataclasses.replace(_fence_base(), bugs=frozenset({"no_view_fence"}),
                               max_events=_BUG_ON_MAX_EVENTS)
    result = sweep(base, _FENCE_SEEDS, jobs=1, stop_on_failure=True)
    assert not result.ok, f"no_view_fence went unnoticed on seeds {list(_FENCE_SEEDS)}"
    report = result.failures[0].report
    assert "violation: vote-safety" in report, report
    assert "equivocated" in report, report


def test_same_crash_scenarios_with_the_fence_pass() -> None:
    result = sweep(_fence_base(), _FENCE_SEEDS, jobs=1)
    assert result.ok, "\n\n".join(o.report for o in result.failures)


# ---------------------------------------------------------------------------------------------
# The attack wrappers, step by step

REPLICAS = tuple(NodeId(f"n{i}") for i in range(1, 5))


def _cfg(node: str, replicas: tuple[NodeId, ...] = REPLICAS, **kw: object) -> PbftConfig:
    return PbftConfig(node_id=NodeId(node), replicas=replicas, **kw)  # type: ignore[arg-type]


def _attacker(node: str, attack: str, seed: int = 0) -> AttackCore:
    cfg = _cfg(node)
    crypto = FastCrypto(NodeId(node))
    return AttackCore(PbftCore(cfg, crypto=crypto), attack=attack, config=cfg, crypto=crypto,
                      rng=random.Random(seed))


def _primary_pp(view: int = 0, seq: int = 1) -> PrePrepare:
    primary = REPLICAS[view % len(REPLICAS)]
    crypto = FastCrypto(primary)
    batch = (ClientRequest(client_id="c", request_no=1, command=b"w"),)
    pp = PrePrepare(view=view, seq=seq, digest=digest_of(crypto, batch), batch=batch,
                    replica=primary)
    return dataclasses.replace(pp, signature=crypto.sign(signed_part(pp)))


def test_cross_view_sends_a_signed_null_pre_prepare_for_its_next_view() -> None:
    byz = _attacker("n3", "cross_view")
    ready = byz.step(Receive(src=NodeId("n1"), message=_primary_pp()))
    pps = [s.message for s in ready.messages if isinstance(s.message, PrePrepare)]
    assert {p.view for p in pps} == {2}, "n3 leads view 2 (2 mod 4 = index of n3)"
    assert all(p.seq == 1 and p.batch == () for p in pps)
    assert all(FastCrypto(NodeId("n2")).verify(NodeId("n3"), signed_part(p), p.signature)
               for p in pps)
    assert not [s for s in ready.messages if isinstance(s.message, Commit) and s.message.view == 0]
    # A correct replica parks the future-view pre-prepare instead of preparing it.
    honest = PbftCore(_cfg("n2"), crypto=FastCrypto(NodeId("n2")))
    honest.step(Receive(src=NodeId("n1"), message=_primary_pp()))
    out = honest.step(Receive(src=NodeId("n3"), message=pps[0]))
    assert not out.messages
    buggy = PbftCore(_cfg("n2"), crypto=FastCrypto(NodeId("n2")),
                     bugs=PbftBugs(skip_view_check=True))
    out = buggy.step(Receive(src=NodeId("n3"), message=pps[0]))
    assert any(getattr(s.message, "view", None) == 2 for s in out.messages)


@pytest.mark.parametrize("trigger_seed", range(4))
def test_forged_new_view_is_rejected_unless_view_change_signatures_are_skipped(
    trigger_seed: int,
) -> None:
    byz = _attacker("n2", "forge_new_view", seed=trigger_seed)
    pp = _primary_pp()
    crypto3 = FastCrypto(NodeId("n3"))
    commit = Commit(view=0, seq=1, digest=pp.digest, replica=NodeId("n3"))
    commit = dataclasses.replace(commit, auth=crypto3.mac(NodeId("n2"), commit))
    prepare = Prepare(view=0, seq=1, digest=pp.digest, replica=NodeId("n3"))
    prepare = dataclasses.replace(prepare, signature=crypto3.sign(prepare))
    sent = []
    for src, msg in ((NodeId("n1"), pp), (NodeId("n3"), prepare), (NodeId("n3"), commit)):
        sent += [s.message for s in byz.step(Receive(src=src, message=msg)).messages]
    nvs = [m for m in sent if isinstance(m, NewView)]
    assert nvs, "the attack fires on the first prepare or commit of the replica's view"
    nv = nvs[0]
    assert nv.view == 1
    assert not [m for m in sent if isinstance(m, Commit) and m.view == 0], "own votes withheld"
    relayed = tuple(m.view_change for m in sent if isinstance(m, RelayedViewChange))
    vcs = resolve_view_changes(crypto3, nv, relayed)
    assert vcs is not None, "the forged view changes the NewView names travel beside it"
    reason, _ = check_new_view(_cfg("n3"), crypto3, nv, vcs)
    assert reason == "bad_signature"
    reason, plan = check_new_view(_cfg("n3"), SkipViewChangeSignatures(crypto3), nv, vcs)
    assert reason is None
    assert plan is not None
    assert plan.pre_prepares == ()


def test_collusion_split_needs_a_colluding_backup() -> None:
    seven = tuple(NodeId(f"n{i}") for i in range(1, 8))
    cfg = _cfg("n1", seven)
    coll = Collusion(cfg, frozenset({NodeId("n1"), NodeId("n2")}), random.Random(3))
    split = coll.split(0)
    assert split is not None
    chosen, shadow = split
    assert len(chosen) == 3  # f+1 honest backups: with the colluding backup, 2f prepares
    assert shadow in chosen
    assert not chosen & coll.colluders
    assert coll.split(1) is None, "view 2's primary (n3) is honest: nothing to hand over to"
    four = Collusion(_cfg("n1"), frozenset({NodeId("n1")}), random.Random(3))
    assert four.split(0) is None, "at n=4 one liar cannot keep the shadow from preparing"

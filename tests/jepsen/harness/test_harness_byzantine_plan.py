"""`phalanx jepsen run --byzantine`: the spec grammar, the seeded plan (at most f liars unless
a control), twin routing through the proxies, and the CLI's refusals. No processes."""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from phalanx.cli.errors import EXIT_USAGE
from phalanx.jepsen.byzantine import BEHAVIOURS, PBFT_BYZANTINE
from phalanx.jepsen.harness.byzantine_plan import (
    ANY,
    MODES,
    TWINS,
    ByzantineItem,
    ByzantinePlan,
    ByzantinePlanError,
    format_items,
    parse_byzantine,
    plan_byzantine,
)
from phalanx.jepsen.harness.cli import add_run_command
from phalanx.jepsen.harness.cluster import TWIN_B_SUFFIX, twin_routes
from phalanx.jepsen.harness.proxy import ProxyNetwork
from phalanx.jepsen.harness.runner import RunOptions
from phalanx.protocols import get as get_protocol

N4 = ("n1", "n2", "n3", "n4")


def test_modes_are_the_simulator_and_runtime_names_plus_twins() -> None:
    leaderless = get_protocol("leaderless").byzantine_modes
    assert (*BEHAVIOURS, *(m for m in leaderless if m not in BEHAVIOURS), TWINS, ANY) == MODES
    # The spec lists the modes without loading jepsen; they must be the behaviours'.
    assert get_protocol("pbft").byzantine_modes == BEHAVIOURS == PBFT_BYZANTINE.modes


def test_a_mode_must_be_the_protocols() -> None:
    names = ("n1", "n2", "n3", "n4")
    plan = plan_byzantine(parse_byzantine("lie-versions"), names, protocol="leaderless", seed=1)
    assert [m for _, m in plan.modes] == ["lie_versions"]
    with pytest.raises(ByzantinePlanError, match="pbft has no Byzantine mode 'lie_versions'"):
        plan_byzantine(parse_byzantine("lie_versions"), names, protocol="pbft", seed=1)
    with pytest.raises(ByzantinePlanError, match="leaderless has no Byzantine mode 'omit'"):
        plan_byzantine(parse_byzantine("n2=omit"), names, protocol="leaderless", seed=1)
    for seed in range(20):  # `any` draws from the run's protocol
        drawn = plan_byzantine(parse_byzantine("any"), names, protocol="leaderless", seed=seed)
        assert drawn.modes[0][1] in get_protocol("leaderless").byzantine_modes


def test_spec_grammar() -> None:
    assert parse_byzantine("") == parse_byzantine("none") == ()
    assert parse_byzantine("equivocate") == (ByzantineItem(mode="equivocate"),)
    assert parse_byzantine(" n1=corrupt-reply , twins") == (
        ByzantineItem(mode="corrupt_reply", node="n1"), ByzantineItem(mode=TWINS))
    assert format_items(parse_byzantine("n2=corrupt-reply,silent")) == "n2=corrupt_reply,silent"
    assert parse_byzantine("2,twins") == (ByzantineItem(mode=ANY), ByzantineItem(mode=ANY),
                                          ByzantineItem(mode=TWINS))
    assert parse_byzantine("0") == ()
    for bad in ("lie", "equivocate,,silent", "=silent", "n1=", "n1=bogus", "-1"):
        with pytest.raises(ByzantinePlanError):
            parse_byzantine(bad)


def test_more_than_f_is_refused_unless_the_run_is_a_control() -> None:
    two = parse_byzantine("twins,twins")
    with pytest.raises(ByzantinePlanError, match="exceed f=1"):
        plan_byzantine(two, N4, protocol="pbft", seed=1)
    plan = plan_byzantine(two, N4, protocol="pbft", seed=1, allow_violation=True)
    assert len(plan.twins) == 2
    assert plan.allow_violation
    # Twins of two nodes at n=4: each side has one honest replica, so both sides hold a
    # 2f+1 quorum with the twins (the split that can break agreement).
    assert len(plan.side_a) == 1
    assert len(plan.side_b(N4)) == 1
    with pytest.raises(ByzantinePlanError, match="no honest"):
        plan_byzantine(parse_byzantine("silent,silent,silent,silent"), N4, protocol="pbft",
                       seed=0, allow_violation=True)
    with pytest.raises(ByzantinePlanError, match="pbft"):
        plan_byzantine(parse_byzantine("silent"), ("n1", "n2", "n3"), protocol="raft", seed=0)
    for spec in ("n9=silent", "n1=silent,n1=twins"):
        with pytest.raises(ByzantinePlanError):
            plan_byzantine(parse_byzantine(spec), N4, protocol="pbft", seed=0,
                           allow_violation=True)


def test_a_count_reads_as_the_simulators_seeded_liars() -> None:
    plans = [plan_byzantine(parse_byzantine("1"), N4, protocol="pbft", seed=s) for s in range(40)]
    assert all(len(p.modes) == 1 and not p.twins for p in plans)
    assert {m for p in plans for _, m in p.modes} <= set(BEHAVIOURS)
    assert len({p.modes for p in plans}) > 4  # the seed draws both node and mode
    with pytest.raises(ByzantinePlanError, match="exceed f=1"):
        plan_byzantine(parse_byzantine("2"), N4, protocol="pbft", seed=0)


def test_pinned_items_stay_put_and_the_plan_describes_itself() -> None:
    plan = plan_byzantine(parse_byzantine("n1=equivocate"), N4, protocol="pbft", seed=9)
    assert plan.modes == (("n1", "equivocate"),)
    assert plan.mode_of("n1") == "equivocate"
    assert plan.mode_of("n2") is None
    assert plan.honest(N4) == ("n2", "n3", "n4")
    assert plan.describe() == "n1 runs equivocate"
    assert plan.label() == "byz-equivocate"
    assert ByzantinePlan().label() == ""
    assert ByzantinePlan().describe() == "none"
    doc = plan.to_json()
    assert doc["nodes"] == ["n1"]
    assert doc["modes"] == {"n1": "equivocate"}


@settings(max_examples=60, deadline=None)
@given(f=st.integers(1, 3), seed=st.integers(0, 2**32),
       modes=st.lists(st.sampled_from((*BEHAVIOURS, TWINS, ANY)), min_size=1, max_size=3))
def test_a_plan_places_every_item_once_and_splits_the_honest_replicas(
    f: int, seed: int, modes: list[str]
) -> None:
    names = tuple(f"n{i}" for i in range(1, 3 * f + 2))
    items = tuple(ByzantineItem(mode=m) for m in modes[:f])
    plan = plan_byzantine(items, names, protocol="pbft", seed=seed)
    assert plan == plan_byzantine(items, names, protocol="pbft", seed=seed)  # seeded
    assert len(plan.nodes) == len(items)
    drawn = [m for _, m in plan.modes]
    assert all(m in BEHAVIOURS for m in drawn)
    assert len(drawn) == sum(1 for i in items if i.mode != TWINS)
    assert not Counter(i.mode for i in items if i.mode not in (TWINS, ANY)) - Counter(drawn)
    assert len(plan.twins) == sum(1 for i in items if i.mode == TWINS)
    honest = plan.honest(names)
    assert set(honest).isdisjoint(plan.nodes)
    assert len(honest) + len(plan.nodes) == len(names)
    if plan.twins:
        side_b = plan.side_b(names)
        assert set(plan.side_a) | set(side_b) == set(honest)
        assert not set(plan.side_a) & set(side_b)
        assert len(plan.side_a) == (len(honest) + 1) // 2
    else:
        assert plan.side_a == ()
        assert plan.side_b(names) == ()


def test_twin_routes_send_each_side_to_its_own_twin() -> None:
    plan = ByzantinePlan(modes=(("n1", "silent"),), twins=("n7",), side_a=("n2", "n3", "n4"))
    nodes = tuple(f"n{i}" for i in range(1, 8))
    routes = twin_routes(plan, nodes)
    b = "n7" + TWIN_B_SUFFIX
    for peer in ("n2", "n3", "n4"):
        assert routes[(peer, "n7")] == "n7"
        assert routes[("n7", peer)] == peer
        assert routes[(b, peer)] is None
    for peer in ("n1", "n5", "n6"):  # side B: the other honest ones and the mode liar
        assert routes[(peer, "n7")] == b
        assert routes[(b, peer)] == peer
        assert routes[("n7", peer)] is None
    assert routes[("n2", "n3")] == "n3"
    assert routes[("n1", "n5")] == "n5"


def test_proxy_network_with_twins_keeps_the_split_through_partitions_and_heals() -> None:
    plan = ByzantinePlan(twins=("n4",), side_a=("n1", "n2"))
    targets = {n: ("127.0.0.1", 1000 + i) for i, n in enumerate(N4)}
    targets["n4-b"] = ("127.0.0.1", 2000)
    ids = {**{n: n for n in N4}, "n4-b": "n4"}
    net = ProxyNetwork(targets, rng=random.Random(1), identities=ids,
                       routes=twin_routes(plan, N4))
    assert net.links[("n3", "n4")].target == ("127.0.0.1", 2000)
    assert net.links[("n1", "n4")].target == targets["n4"]
    assert net.fixed == (("n4", "n3"), ("n4-b", "n1"), ("n4-b", "n2"))
    assert all(net.links[link].blocked for link in net.fixed)
    net.block([("n4", "n1"), ("n2", "n3")])  # node-level links: every instance of n4
    assert net.blocked() == (("n2", "n3"), ("n4", "n1"))
    assert net.links[("n4-b", "n1")].blocked
    net.heal()
    assert net.blocked() == ()
    assert all(net.links[link].blocked for link in net.fixed)
    assert not net.links[("n4", "n1")].blocked
    assert not net.links[("n4-b", "n3")].blocked
    with pytest.raises(ValueError, match="no such links"):
        net.block([("n4", "n4")])
    with pytest.raises(ValueError, match="routed"):
        ProxyNetwork(targets, rng=random.Random(1), identities=ids, routes={("n1", "n4"): "n2"})


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_cli_refuses_bad_byzantine_specs_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    console = Console(file=(tmp_path / "out.txt").open("w"))
    cases = {
        "exceed f=1": ["--protocol", "pbft", "--nodes", "4", "--byzantine", "equivocate,silent"],
        "--protocol leaderless or pbft (got raft)": ["--nodes", "3", "--byzantine", "silent"],
        "pbft has no Byzantine mode 'lie_versions'": ["--protocol", "pbft", "--nodes", "4",
                                                      "--byzantine", "lie-versions"],
        "unknown Byzantine mode": ["--protocol", "pbft", "--nodes", "4", "--byzantine", "lie"],
    }
    for message, argv in cases.items():
        args = _parse([*argv, "--store", str(tmp_path / "s")])
        assert args.handler(args, console=console) == EXIT_USAGE
        assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_run_options_name_the_byzantine_replicas() -> None:
    o = RunOptions(protocol="pbft", nodes=4, faults=("kill",), byzantine="twins,n1=silent",
                   expect_violation=True, seed=5)
    assert o.test_name == "pbft-register-kill-byz-silent+twins-n4"
    assert o.byzantine_plan().mode_of("n1") == "silent"
    assert RunOptions(protocol="pbft", nodes=4).test_name == "pbft-register-none-n4"
    with pytest.raises(ByzantinePlanError):
        RunOptions(protocol="pbft", nodes=4, byzantine="twins,n1=silent")


def test_a_dead_node_is_named_with_the_last_line_its_log_says(tmp_path: Path) -> None:
    from types import SimpleNamespace
    from typing import Any

    from phalanx.jepsen.harness.cluster import RealCluster

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "n1.log").write_text(
        "starting\n  | Traceback (most recent call last):\n"
        "  | AttributeError: 'Map' object has no attribute 'snapshot'\n  +-----------\n")
    config: Any = SimpleNamespace(directory=tmp_path, nodes=(SimpleNamespace(id="n1"),
                                                             SimpleNamespace(id="n2")))
    procs: Any = SimpleNamespace(running=lambda node: node == "n2")
    cluster = RealCluster(config=config, procs=procs, network=procs, admin=procs)
    assert cluster._dead_nodes() == (
        "; n1 exited: AttributeError: 'Map' object has no attribute 'snapshot'")

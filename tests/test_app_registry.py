"""The app registry (`phalanx.appspec`): lookups, errors, clashes, every lazy reference
resolving; node configs naming an app (default kv); and the rule that makes apps plug-ins:
outside the registry and the apps' own modules, no code compares an app's name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_protocol_registry import ROOT, SCANNED, name_comparisons

from phalanx import appspec
from phalanx.appspec import AppConfigError, AppSpec, UnknownApp
from phalanx.appspec.builtin import SPECS as BUILTIN
from phalanx.ops.local_cluster import ClusterError, init_cluster
from phalanx.ops.node_config import ConfigError, load_cluster_config, load_node_config
from phalanx.protocols import Lazy


def test_builtin_apps_are_registered_and_sorted() -> None:
    assert {"kv", "chain"} <= set(appspec.names())
    assert list(appspec.names()) == sorted(appspec.names())
    assert appspec.DEFAULT_APP in appspec.names()


def test_unknown_app_names_the_registered_ones_and_clashes_raise() -> None:
    with pytest.raises(UnknownApp, match=r"'nope'.*chain, kv"):
        appspec.get("nope")
    kv = appspec.get("kv")
    assert appspec.register(kv) is kv
    with pytest.raises(ValueError, match="already registered"):
        appspec.register(dataclasses.replace(kv, summary="another"))
    with pytest.raises(ValueError, match="app name"):
        appspec.register(dataclasses.replace(kv, name="a b"))


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda s: s.name)
def test_every_lazy_reference_of_an_app_resolves(spec: AppSpec) -> None:
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if isinstance(value, Lazy):
            assert value.load() is not None, field.name
    for name in spec.workload_names:
        assert callable(spec.workload(name))
    with pytest.raises(ValueError, match="no workload"):
        spec.workload("nope")


def test_chain_needs_its_genesis_and_a_total_order() -> None:
    chain = appspec.get("chain")
    with pytest.raises(AppConfigError, match="genesis"):
        chain.build_machine({})
    from phalanx.protocols import get as protocol_spec

    assert chain.protocol_problem(protocol_spec("leaderless")) is not None
    assert chain.protocol_problem(protocol_spec("pbft")) is None


def test_cluster_init_app_chain_writes_genesis_keys_and_configs(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", protocol="pbft", nodes=4, app="chain")
    assert cluster.app == "chain"
    genesis = cluster.app_files["genesis"]
    assert genesis.is_file()
    node = load_node_config(cluster.node_config_path("n1"))
    assert node.app == "chain"
    assert node.app_files == {"genesis": genesis}
    keys = sorted((cluster.directory / "chain" / "keys").glob("*.key"))
    assert [k.stem for k in keys] == ["a1", "a2", "a3", "a4", "a5", "minter"]
    assert all(k.stat().st_mode & 0o777 == 0o600 for k in keys)
    machine = appspec.get("chain").build_machine(node.app_files)
    assert machine.query(b"") != b""  # a typed error result, not an exception
    with pytest.raises(ClusterError, match="different orders"):
        init_cluster(tmp_path / "l", protocol="leaderless", nodes=4, app="chain")


def test_old_configs_without_app_run_kv_and_bad_apps_are_config_errors(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", nodes=1)
    path = cluster.node_config_path("n1")
    text = path.read_text()
    assert 'app = "kv"' in text
    path.write_text(text.replace('app = "kv"\n', ""))
    assert load_node_config(path).app == "kv"
    path.write_text(text.replace('app = "kv"', 'app = "nope"'))
    with pytest.raises(ConfigError, match="unknown app 'nope'"):
        load_node_config(path)
    toml = cluster.directory / "cluster.toml"
    toml.write_text(toml.read_text().replace('app = "kv"', 'app = "chain"'))
    with pytest.raises(ConfigError, match="genesis"):
        load_cluster_config(cluster.directory)


def _allowed(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith(("phalanx/appspec/", "apps/"))


def test_no_app_name_is_compared_outside_the_registry_and_the_apps() -> None:
    names = frozenset(appspec.names())
    offenders: list[str] = []
    for tree in SCANNED:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if _allowed(path):
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: compares with {name!r}"
                          for line, name in name_comparisons(path.read_text(), names)]
    assert not offenders, ("decide by the app's spec (phalanx.appspec), not by its name:\n"
                           + "\n".join(offenders))


def test_a_node_refuses_to_start_on_a_bad_genesis_before_opening_storage(
        tmp_path: Path) -> None:
    import trio

    from phalanx.runtime.node import NodeError, open_node

    cluster = init_cluster(tmp_path / "c", nodes=1, app="chain")
    config = load_node_config(cluster.node_config_path("n1"))
    config.app_files["genesis"].write_bytes(b"junk")

    async def start() -> None:
        async with open_node(config):
            pass

    with pytest.raises(NodeError, match="not a chain genesis"):
        trio.run(start)
    assert [p.name for p in config.data_dir.iterdir()] == ["IDENTITY"]  # storage untouched

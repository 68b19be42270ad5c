"""Strict configuration (issue 21, item 6) beyond the loader's unknown-key errors
(tests/test_config.py): TLS credentials that do not load or do not belong to the cluster's
CA are refused in one line naming the file before the node opens its storage; `cluster init`
refuses a layout with a port in use and warns about sizes that tolerate no fault."""

from __future__ import annotations

import argparse
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from phalanx.ops.cluster_command import add_cluster_command
from phalanx.ops.local_cluster import (
    fault_tolerance_warning,
    find_free_base_port,
    init_cluster,
)
from phalanx.ops.node_config import NodeConfig, load_node_config
from phalanx.runtime.node import NodeError, open_node
from phalanx.runtime.node_checks import check_tls_credentials


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("strict")
    a, b = root / "a", root / "b"
    init_cluster(a, nodes=2, base_port=9000)
    init_cluster(b, nodes=1, base_port=9000)
    return a, b


def _config(cluster: Path, node: str = "n1") -> NodeConfig:
    return load_node_config(cluster / "nodes" / f"{node}.toml")


def _refused(config: NodeConfig) -> str:
    with pytest.raises(NodeError) as info:
        check_tls_credentials(config)
    message = str(info.value)
    assert "\n" not in message
    assert str(config.source) in message
    return message


def test_good_credentials_pass(two_clusters: tuple[Path, Path]) -> None:
    check_tls_credentials(_config(two_clusters[0]))


def test_a_ca_file_that_is_not_a_certificate_is_named(
    two_clusters: tuple[Path, Path], tmp_path: Path
) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    cfg = _config(two_clusters[0])
    message = _refused(replace(cfg, tls=replace(cfg.tls, ca=garbage)))
    assert f"tls.ca {garbage} is not a PEM CA certificate" in message


def test_a_key_that_does_not_match_the_certificate_is_named(
    two_clusters: tuple[Path, Path]
) -> None:
    cfg = _config(two_clusters[0])
    other = _config(two_clusters[0], "n2")
    message = _refused(replace(cfg, tls=replace(cfg.tls, key=other.tls.key)))
    assert f"tls.cert {cfg.tls.cert} and tls.key {other.tls.key} do not load" in message


def test_a_certificate_of_another_cluster_is_refused(two_clusters: tuple[Path, Path]) -> None:
    a, b = two_clusters
    cfg = _config(a)
    foreign = _config(b)
    message = _refused(replace(cfg, tls=replace(cfg.tls, cert=foreign.tls.cert,
                                                key=foreign.tls.key)))
    assert f"tls.cert {foreign.tls.cert} is not signed by the CA in tls.ca {cfg.tls.ca}" in message


def test_open_node_refuses_before_opening_storage(
    two_clusters: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_clusters
    cfg = _config(a)
    ca = tmp_path / "ca.pem"
    shutil.copy(_config(b).tls.ca, ca)  # a valid CA, but not the one that signed n1
    data = tmp_path / "data"
    bad = replace(cfg, tls=replace(cfg.tls, ca=ca), data_dir=data)

    async def start() -> None:
        async with open_node(bad):
            raise AssertionError("the node started with a foreign CA")

    with pytest.raises(NodeError, match="is not signed by the CA"):
        trio.run(start)
    assert not data.exists()  # nothing created, let alone the storage


def _init(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="phalanx")
    add_cluster_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cluster", "init", *argv])
    capsys.readouterr()
    code: int = args.handler(args)
    return code, capsys.readouterr().err


def test_cluster_init_refuses_a_port_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = find_free_base_port(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 101))  # n2's client port
        taken.listen()
        code, err = _init(capsys, str(tmp_path / "c"), "--base-port", str(base))
    assert code == 2
    assert err.count("\n") == 1
    assert f"port {base + 101} on 127.0.0.1 is in use" in err
    assert "choose another --base-port" in err
    assert not (tmp_path / "c").exists()


def test_cluster_init_warns_about_sizes_that_tolerate_no_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fault_tolerance_warning("raft", 2) == (
        "warning: 2 raft nodes tolerate no fault (crash faults: losing any one node stops "
        "the cluster); 3 nodes tolerate one")
    assert "3 pbft nodes tolerate no fault" in (fault_tolerance_warning("pbft", 3) or "")
    assert "4 nodes tolerate one" in (fault_tolerance_warning("pbft", 3) or "")
    for protocol, n in (("raft", 1), ("raft", 3), ("raft", 4), ("pbft", 1), ("pbft", 4)):
        assert fault_tolerance_warning(protocol, n) is None, (protocol, n)
    code, err = _init(capsys, str(tmp_path / "c"), "--nodes", "2",
                      "--base-port", str(find_free_base_port(2)))
    assert code == 0
    assert "warning: 2 raft nodes tolerate no fault" in err

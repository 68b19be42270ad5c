"""`phalanx cluster link DIR_A DIR_B`: what it writes (public material only), what a node
reads back, and the operator's errors (one line, exit 2, nothing changed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from phalanx.ops.cluster_command import add_cluster_command
from phalanx.ops.link import describe_cluster, load_links
from phalanx.ops.local_cluster import init_cluster
from phalanx.ops.node_config import load_node_config
from phalanx.protocols.spec import FaultModel
from phalanx.runtime.identity import cluster_fingerprint


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="phalanx")
    add_cluster_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def test_link_copies_only_public_material_both_ways(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = init_cluster(tmp_path / "a", protocol="raft", nodes=3, base_port=9300,
                     services=("clustersend",))
    b = init_cluster(tmp_path / "b", protocol="pbft", nodes=4, base_port=9600)
    assert _run(["cluster", "link", str(a.directory), str(b.directory)]) == 0
    out = capsys.readouterr().out
    ida, idb = cluster_fingerprint(a.ca), cluster_fingerprint(b.ca)
    assert f"linked cluster {idb} (b, pbft, n=4, f=1)" in out
    assert f"linked cluster {ida} (a, raft, n=3, f=1)" in out
    written = sorted(p.name for p in (a.directory / "links").iterdir())
    assert written == [f"{idb}.ca.pem", f"{idb}.toml"]  # no key of any kind
    assert (a.directory / "links" / f"{idb}.ca.pem").read_bytes() == b.ca.read_bytes()
    config = load_node_config(a.node_config_path("n2"))
    (link,) = load_links(config)
    assert link.cluster_id == idb
    assert link.fault_model is FaultModel.BYZANTINE
    assert [n.id for n in link.nodes] == ["n1", "n2", "n3", "n4"]
    assert [n.port for n in link.nodes] == [9600, 9601, 9602, 9603]
    assert link.nodes == describe_cluster(b.directory).nodes  # the signing public keys too
    (back,) = load_links(load_node_config(b.node_config_path("n1")))
    assert back.cluster_id == ida
    assert back.fault_model is FaultModel.CRASH


def test_link_errors_are_one_line_and_change_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = init_cluster(tmp_path / "a", protocol="pbft", nodes=4, base_port=9300)
    plain = init_cluster(tmp_path / "r", protocol="raft", nodes=3, base_port=9600)
    for argv, needle in (
        ([str(a.directory), str(a.directory)], "the same cluster"),
        ([str(a.directory), str(tmp_path / "none")], "not a cluster directory"),
        ([str(a.directory), str(plain.directory)], "--service clustersend"),
    ):
        assert _run(["cluster", "link", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert needle in err
    assert not (a.directory / "links").exists()
    assert not (plain.directory / "links").exists()

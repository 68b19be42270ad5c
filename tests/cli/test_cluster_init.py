"""`phalanx cluster init`: the directory it writes loads, its credentials are sound, and it
refuses to overwrite anything. Also the `NodeProcesses` supervisor over stand-in processes."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from phalanx.ops import pki
from phalanx.ops.cluster_command import add_cluster_command
from phalanx.ops.local_cluster import (
    ClusterError,
    NodeProcesses,
    cluster_ports,
    ephemeral_overlap_warning,
    find_free_base_port,
    init_cluster,
    open_cluster,
    supervise,
)
from phalanx.ops.node_config import load_cluster_config, load_node_config
from phalanx.ops.ports import ephemeral_port_range, in_ephemeral_range


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx")
    add_cluster_command(parser.add_subparsers(dest="command"))
    return parser


def test_init_writes_loadable_configs(tmp_path: Path) -> None:
    d = tmp_path / "c"
    cfg = init_cluster(d, nodes=3, base_port=9000)
    assert cfg == load_cluster_config(d)
    assert cfg.protocol == "raft"
    assert [n.id for n in cfg.nodes] == ["n1", "n2", "n3"]
    assert [n.peer_addr.port for n in cfg.nodes] == [9000, 9001, 9002]
    assert [n.client_addr.port for n in cfg.nodes] == [9100, 9101, 9102]
    for i, n in enumerate(cfg.nodes):
        node = load_node_config(cfg.node_config_path(n.id))
        assert node.id == n.id
        assert node.protocol == "raft"
        assert node.peer_listen == n.peer_addr
        assert node.client_listen == n.client_addr
        assert node.metrics_listen is not None
        assert node.metrics_listen.port == 9200 + i
        assert node.data_dir == (d / "data" / n.id).resolve()
        assert node.data_dir.is_dir()
        assert {p.id for p in node.peers} == {m.id for m in cfg.nodes} - {n.id}
        assert node.members() == ("n1", "n2", "n3")
        for p in node.peers:  # every node sees the same addresses as cluster.toml
            assert p == next(m for m in cfg.nodes if m.id == p.id)
    assert (d / "logs").is_dir()
    assert (d / "run").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name != "c"], "staging dir left behind"


def test_credentials_name_their_owner_and_chain_to_the_ca(tmp_path: Path) -> None:
    d = tmp_path / "c"
    cfg = init_cluster(d, nodes=2, base_port=9000, client_name="ops")
    ca = pki.load_ca(d / "ca")  # the key matches the certificate
    for n in cfg.nodes:
        node = load_node_config(cfg.node_config_path(n.id))
        cert = x509.load_pem_x509_certificate(node.tls.cert.read_bytes())
        assert cert.issuer == ca.certificate.subject
        cert.verify_directly_issued_by(ca.certificate)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        assert f"urn:phalanx:node:{n.id}" in uris
        assert node.tls.ca.read_bytes() == (d / "ca" / "ca.pem").read_bytes()
        # the key really belongs to the certificate: a TLS context accepts the pair
        pki.peer_server_context(pki.CredentialPaths(
            certificate=node.tls.cert, private_key=node.tls.key, ca_certificate=node.tls.ca))
    client = x509.load_pem_x509_certificate(cfg.client_cert.read_bytes())
    sans = client.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "urn:phalanx:client:ops", "urn:phalanx:role:read-write"]
    for name, role in (("admin", "admin"), ("client", "read-write"), ("reader", "read-only")):
        identity = pki.identity_from_certificate(d / "clients" / f"{name}.pem")
        assert identity == pki.Identity(kind="client", name=name, role=role)
    pki.client_context(cfg.ca, certificate=cfg.client_cert, private_key=cfg.client_key)


def test_private_keys_are_owner_only(tmp_path: Path) -> None:
    d = tmp_path / "c"
    init_cluster(d, nodes=3, base_port=9000)
    keys = sorted(d.rglob("*.key"))
    assert [k.relative_to(d).as_posix() for k in keys] == [
        "ca/ca.key", "clients/admin.key", "clients/client.key", "clients/reader.key",
        "nodes/n1.key", "nodes/n2.key", "nodes/n3.key"]
    for k in keys:
        assert stat.S_IMODE(k.stat().st_mode) == 0o600, k
    assert stat.S_IMODE(d.stat().st_mode) & 0o077 == 0  # the directory itself is private


def test_pbft_and_other_sizes(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "p", protocol="pbft", nodes=4, base_port=9500)
    assert cfg.protocol == "pbft"
    assert len(cfg.nodes) == 4
    assert load_node_config(cfg.node_config_path("n4")).protocol == "pbft"


def test_init_into_an_existing_empty_directory(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    init_cluster(d, nodes=1, base_port=9000)
    assert (d / "cluster.toml").is_file()


def test_init_refuses_a_non_empty_directory_and_leaves_it_alone(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    with pytest.raises(ClusterError, match="not empty"):
        init_cluster(d, nodes=3, base_port=9000)
    assert [p.name for p in d.iterdir()] == ["precious.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_init_refuses_a_second_init(tmp_path: Path) -> None:
    d = tmp_path / "c"
    first = init_cluster(d, nodes=3, base_port=9000)
    before = (d / "ca" / "ca.pem").read_bytes()
    with pytest.raises(ClusterError, match="not empty"):
        init_cluster(d, nodes=3, base_port=9000)
    assert (d / "ca" / "ca.pem").read_bytes() == before
    assert load_cluster_config(d) == first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "between 1 and 100"),
        ({"nodes": 101}, "between 1 and 100"),
        ({"protocol": "paxos"}, "unknown protocol"),
        ({"base_port": 65_400}, "no room"),
        ({"base_port": 0}, "no room"),
        ({"client_name": "bad name"}, "invalid identity name"),
    ],
)
def test_init_rejects_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"nodes": 3, "base_port": 9000, **kwargs}
    with pytest.raises(ClusterError, match=message):
        init_cluster(tmp_path / "c", **args)  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_open_cluster_without_a_cluster_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"no cluster at .*phalanx cluster init"):
        open_cluster(tmp_path)


def test_free_base_port_is_bindable_and_outside_the_ephemeral_range() -> None:
    base = find_free_base_port(3)
    ports = cluster_ports(base, 3)
    assert len(set(ports)) == 9
    assert not any(in_ephemeral_range(p) for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_base_port_skips_a_taken_port() -> None:
    import random

    seed_rng = random.Random(7)
    first = find_free_base_port(2, rng=random.Random(7))
    with socket.socket() as s:
        s.bind(("127.0.0.1", first + 101))  # a client port of that layout
        again = find_free_base_port(2, rng=seed_rng)
    assert again != first


def test_ephemeral_overlap_warning_names_the_ports_and_a_safe_base() -> None:
    low, high = ephemeral_port_range()
    assert ephemeral_overlap_warning(low - 250, 3) is None
    warning = ephemeral_overlap_warning(low, 3)
    assert warning is not None
    assert f"ephemeral port range {low}-{high}" in warning
    assert f"below {low - 203}" in warning


# --------------------------------------------------------------------------------------------
# command line


def test_cli_init_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    d = tmp_path / "c"
    args = parser.parse_args(["cluster", "init", str(d), "--nodes", "5", "--base-port", "9300"])
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    assert "created raft cluster of 5 nodes" in captured.out
    assert "n5: peers 127.0.0.1:9304, clients 127.0.0.1:9404" in captured.out
    assert captured.err == ""  # 9300-9504 is below any ephemeral range we know of
    assert len(load_cluster_config(d).nodes) == 5
    assert args.handler(args) == 2  # an operator's mistake: exit 2 (usage), one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "not empty" in err
    up = parser.parse_args(["cluster", "up", str(tmp_path / "nothing")])
    assert up.handler(up) == 2
    assert "run `phalanx cluster init" in capsys.readouterr().err
    up = parser.parse_args(["cluster", "up", str(d), "--node", "n9"])
    assert up.handler(up) == 2
    assert "no node 'n9'" in capsys.readouterr().err
    # A base inside the ephemeral range is accepted with a warning. Its ports may be in use
    # by some connection's local end at that moment (then init refuses them, as it should):
    # the first of a few bases inside the range whose ports are free is the one checked.
    low, high = ephemeral_port_range()
    codes = []
    for i, base in enumerate(range(low, min(high - 1_000, low + 10_000), 1_000)):
        risky = parser.parse_args(["cluster", "init", str(tmp_path / f"r{i}"),
                                   "--base-port", str(base)])
        codes.append(risky.handler(risky))
        err = capsys.readouterr().err
        if codes[-1] == 0:
            assert "ephemeral port range" in err
            break
        assert "in use" in err, err
    assert codes[-1] == 0, codes


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    for argv in (["cluster", "init", "--help"], ["cluster", "up", "--help"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out
        assert "phalanx cluster" in out
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["cluster", "init", "d", "--protocol", "paxos"])
    assert exc.value.code == 2


# --------------------------------------------------------------------------------------------
# NodeProcesses, over a stand-in node: a process that exits 0 on SIGTERM, or ignores it.

_STANDIN = """
import signal, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("started", sys.argv[1], flush=True)
while True:
    time.sleep(0.05)
"""


def _standin(mode: str) -> Callable[[Path], list[str]]:
    def command(config: Path) -> list[str]:
        return [sys.executable, "-c", _STANDIN, config.stem, mode]

    return command


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_processes_start_log_kill_restart_and_stop(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "c", nodes=3, base_port=9000)
    procs = NodeProcesses(cfg, command=_standin("polite"))
    procs.start()
    try:
        for n in procs.node_ids:
            pid = procs.pid(n)
            assert pid is not None
            assert procs.pid_path(n).read_text() == f"{pid}\n"
            _wait_for(lambda n=n: f"started {n}" in procs.log_path(n).read_text())
        old = procs.pid("n2")
        assert procs.kill("n2") == -signal.SIGKILL
        assert not procs.running("n2")
        assert not procs.pid_path("n2").exists()
        procs.start(["n2"])
        assert procs.pid("n2") not in (None, old)
        _wait_for(lambda: procs.log_path("n2").read_text().count("started n2") == 2)  # appended
    finally:
        codes = procs.stop(grace=5)
    assert codes == {"n1": 0, "n2": 0, "n3": 0}
    assert not list((tmp_path / "c" / "run").iterdir())


def test_processes_stop_kills_a_node_that_ignores_sigterm(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "c", nodes=1, base_port=9000)
    procs = NodeProcesses(cfg, command=_standin("stubborn"))
    procs.start()
    _wait_for(lambda: "started n1" in procs.log_path("n1").read_text())
    assert procs.stop(grace=0.3) == {"n1": -signal.SIGKILL}


def test_processes_report_a_node_that_died(tmp_path: Path) -> None:
    cfg = init_cluster(tmp_path / "c", nodes=2, base_port=9000)
    procs = NodeProcesses(cfg, command=_standin("polite"))
    procs.start()
    try:
        for n in procs.node_ids:
            _wait_for(lambda n=n: f"started {n}" in procs.log_path(n).read_text())
        pid = procs.pid("n1")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: not procs.running("n1"))
        assert procs.exited() == {"n1": -signal.SIGKILL}
        assert procs.exited() == {}
        with pytest.raises(ClusterError, match="not running"):
            procs.signal("n1", signal.SIGTERM)
        with pytest.raises(ValueError, match="no node"):
            procs.start(["n7"])
    finally:
        assert procs.stop(grace=5) == {"n2": 0}


def test_supervise_stops_every_node_on_sigint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster up`'s loop: Ctrl-C (SIGINT to the supervisor) stops all nodes cleanly, exit 0."""
    import threading

    cfg = init_cluster(tmp_path / "c", nodes=2, base_port=9000)
    procs = NodeProcesses(cfg, command=_standin("polite"))
    run_dir = tmp_path / "c" / "run"

    def interrupt_when_up() -> None:
        # pid files appear only after supervise() installed its handlers and started the nodes
        _wait_for(lambda: len(list(run_dir.iterdir())) == 2)
        for n in ("n1", "n2"):
            _wait_for(lambda n=n: f"started {n}" in procs.log_path(n).read_text())
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # not always the default: `cmd &` ignores it
    t = threading.Thread(target=interrupt_when_up)
    t.start()
    code = supervise(procs, ["n1", "n2"], grace=5)
    t.join()
    assert code == 0
    out = capsys.readouterr().out
    assert "cluster up; Ctrl-C stops it" in out
    assert "stopping nodes" in out
    assert not procs.running("n1")
    assert not procs.running("n2")
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_supervise_exits_nonzero_when_every_node_died(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = init_cluster(tmp_path / "c", nodes=1, base_port=9000)

    def crashing(config: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]

    assert supervise(NodeProcesses(cfg, command=crashing), ["n1"], grace=1) == 1
    assert "n1 exited with status 3" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Client signing keys (protocols whose call strategy is ENDORSEMENT)


@pytest.fixture
def endorsement_protocol(monkeypatch: pytest.MonkeyPatch) -> str:
    """A test-only protocol: PBFT's spec with clients that sign (until the leaderless entry
    is registered, and so these tests do not depend on it)."""
    from dataclasses import replace

    from phalanx.protocols import CallStrategy, get, registry

    spec = replace(get("pbft"), name="endorse-test", call_strategy=CallStrategy.ENDORSEMENT)
    monkeypatch.setitem(registry._TABLE.specs, spec.name, spec)
    return spec.name


def test_init_writes_a_client_key_and_every_keyring(tmp_path: Path,
                                                    endorsement_protocol: str) -> None:
    from phalanx.ops.signing_keys import TransactionSigner

    d = tmp_path / "c"
    cfg = init_cluster(d, protocol=endorsement_protocol, nodes=4, base_port=9000)
    key = d / "clients" / "client.signing.key"
    assert cfg.client_signing_key == key.resolve()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    signer = TransactionSigner.from_file(key)
    for n in cfg.nodes:
        assert load_node_config(cfg.node_config_path(n.id)).client_keys == {
            "client": signer.public_key}


def test_init_writes_no_client_keys_for_raft_or_pbft(tmp_path: Path) -> None:
    for protocol in ("raft", "pbft"):
        cfg = init_cluster(tmp_path / protocol, protocol=protocol, nodes=4, base_port=9000)
        assert cfg.client_signing_key is None
        assert not list((tmp_path / protocol / "clients").glob("*.signing.key"))
        for n in cfg.nodes:
            assert load_node_config(cfg.node_config_path(n.id)).client_keys == {}


def test_client_key_adds_a_key_to_every_node_config(
        tmp_path: Path, endorsement_protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    from phalanx.ops.signing_keys import TransactionSigner

    d = tmp_path / "c"
    cfg = init_cluster(d, protocol=endorsement_protocol, nodes=4, base_port=9000)
    args = _parser().parse_args(["cluster", "client-key", str(d), "alice"])
    assert args.handler(args) == 0
    assert "restart" in capsys.readouterr().out
    alice = TransactionSigner.from_file(d / "clients" / "alice.signing.key")
    default = TransactionSigner.from_file(d / "clients" / "client.signing.key")
    for n in cfg.nodes:
        node = load_node_config(cfg.node_config_path(n.id))
        assert node.client_keys == {"client": default.public_key, "alice": alice.public_key}
        assert node.keys is not None  # the rest of the config survived the rewrite
    assert args.handler(args) == 2  # a second key of that name is refused
    assert "already exists" in capsys.readouterr().err


def test_client_key_refuses_bad_names_and_protocols_without_client_keys(
        tmp_path: Path, endorsement_protocol: str) -> None:
    from phalanx.ops.local_cluster import add_client_key

    init_cluster(tmp_path / "raft", nodes=3, base_port=9000)
    with pytest.raises(ClusterError, match="does not use client signing keys"):
        add_client_key(tmp_path / "raft", "alice")
    init_cluster(tmp_path / "e", protocol=endorsement_protocol, nodes=4, base_port=9000)
    with pytest.raises(ClusterError, match="letters, digits"):
        add_client_key(tmp_path / "e", "../x")
    with pytest.raises(ClusterError, match="no cluster"):
        add_client_key(tmp_path / "absent", "alice")


def test_the_registered_leaderless_protocol_gets_client_keys(tmp_path: Path) -> None:
    from phalanx.protocols import CallStrategy, get

    assert get("leaderless").call_strategy is CallStrategy.ENDORSEMENT
    cfg = init_cluster(tmp_path / "l", protocol="leaderless", nodes=4, base_port=9000)
    assert cfg.client_signing_key is not None
    for n in cfg.nodes:
        assert set(load_node_config(cfg.node_config_path(n.id)).client_keys) == {"client"}

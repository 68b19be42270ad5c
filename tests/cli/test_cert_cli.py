"""`phalanx cert issue-client` and `phalanx kv --as NAME`: client roles from the command line.

Before: every client certificate (and no certificate at all) could write; there was no way to
issue a read-only client.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_cli_e2e import _kv_here, _wait_for_leader, phalanx, running_cluster

from phalanx.cli.cert import CertError, issue_client
from phalanx.ops import pki
from phalanx.ops.local_cluster import init_cluster

__all__ = ["running_cluster"]  # the fixture, imported for pytest


def test_issue_client_writes_a_certificate_with_the_role(tmp_path: Path) -> None:
    init_cluster(tmp_path / "c", nodes=1, base_port=9000)
    paths = issue_client(tmp_path / "c", "dash", "read-only")
    assert paths.certificate == tmp_path / "c" / "clients" / "dash.pem"
    assert pki.identity_from_certificate(paths.certificate) == pki.Identity(
        kind="client", name="dash", role="read-only")
    with pytest.raises(CertError, match="exists; refusing to replace client 'dash'"):
        issue_client(tmp_path / "c", "dash", "admin")
    with pytest.raises(CertError, match="invalid client role 'root'"):
        issue_client(tmp_path / "c", "x", "root")
    with pytest.raises(CertError, match="no cluster CA at"):
        issue_client(tmp_path / "nowhere", "x", "admin")



def test_kv_refuses_a_node_certificate_as_a_client(
        tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    cluster = tmp_path / "c"
    init_cluster(cluster, nodes=1, base_port=9000)
    for suffix in (".pem", ".key"):
        (cluster / "clients" / f"n1{suffix}").write_bytes(
            (cluster / "nodes" / f"n1{suffix}").read_bytes())
    code, _, err = _kv_here(cluster, capsysbinary, "--as", "n1", "get", "k")
    assert code == 2
    assert err.endswith(b"n1.pem is not a usable client certificate: it names no phalanx "
                        b"client\n")


def test_a_read_only_client_is_refused_writes_with_exit_6(
    running_cluster: tuple[Path, subprocess.Popen[str]], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    cluster, _ = running_cluster
    c = str(cluster)
    _wait_for_leader(cluster, among={"n1", "n2", "n3"})
    assert _kv_here(cluster, capsysbinary, "put", "greeting", "hello")[0] == 0
    # `cluster init` issued a read-only `reader`; `cert issue-client` issues more.
    code, out, err = _kv_here(cluster, capsysbinary, "--as", "reader", "put", "greeting", "x")
    assert (code, out) == (6, b"")
    assert err.startswith(b"phalanx kv: forbidden: forbidden by n")
    assert err.endswith(b"writes need role read-write; client 'reader' has role read-only\n")
    assert _kv_here(cluster, capsysbinary, "--as", "reader", "get", "greeting") == (
        0, b"hello\n", b"")
    issued = phalanx("cert", "issue-client", "dash", "--role", "read-only", "--cluster", c)
    assert issued.returncode == 0, issued.stderr
    assert _kv_here(cluster, capsysbinary, "--as", "dash", "get", "--stale", "greeting")[:2] == (
        0, b"hello\n")
    assert _kv_here(cluster, capsysbinary, "--as", "dash", "delete", "greeting")[0] == 6
    code, _, err = _kv_here(cluster, capsysbinary, "--as", "nobody", "get", "greeting")
    assert code == 2
    assert b"no client 'nobody'" in err
    assert _kv_here(cluster, capsysbinary, "--as", "admin", "get", "greeting")[:2] == (
        0, b"hello\n")

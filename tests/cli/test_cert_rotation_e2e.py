"""Certificate rotation (issue 21, item 7) on real node processes while a client writes:
`phalanx cert rotate --node` replaces each node's certificate and the node reloads it live
(new handshakes present the new certificate), SIGHUP reloads too, and no write fails. The
long test replaces the cluster CA in three steps under the same load, then restarts a node,
which accepts its data directory and no longer trusts the old CA."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from phalanx import SyncClient
from phalanx.cli.main import main
from phalanx.ops import pki
from phalanx.ops.cert_rotation import rotate_node_cert
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.local_cluster import open_cluster as load_cluster


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _presented(directory: Path, port: int, client: str = "admin") -> bytes:
    """The DER certificate a node presents on a new client-port handshake."""
    clients = directory / "clients"
    context = pki.client_context(clients / "ca.pem", certificate=clients / f"{client}.pem",
                                 private_key=clients / f"{client}.key", check_hostname=False)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _file_der(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(Encoding.DER)


class Writer:
    """Writes keys on its own thread until stopped; counts what succeeded and failed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.done: dict[str, bytes] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:  # a client per batch: each opens new connections (new handshakes)
                with SyncClient(self.directory, timeout=20) as client:
                    for _ in range(10):
                        key, value = f"w{i}", f"{i}".encode()
                        client.put(key, value)
                        self.done[key] = value
                        i += 1
            except BaseException as e:  # counted: the test asserts none
                self.errors.append(e)
                return

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, int, NodeProcesses]]:
    directory = tmp_path / "c"
    base = find_free_base_port(3)
    init_cluster(directory, nodes=3, base_port=base)
    with NodeProcesses(load_cluster(directory)) as procs:
        procs.start()
        yield directory, base, procs


def test_node_certificates_rotate_under_load_without_a_failed_write(
        cluster: tuple[Path, int, NodeProcesses], capsys: pytest.CaptureFixture[str]) -> None:
    directory, base, procs = cluster
    with Writer(directory) as writer:
        while len(writer.done) < 20 and not writer.errors:
            time.sleep(0.05)
        for i, node in enumerate(("n1", "n2", "n3")):
            before = _presented(directory, base + 100 + i)
            code, out, err = _cli(capsys, "cert", "rotate", "--node", node,
                                  "--cluster", str(directory))
            assert code == 0, err
            assert f"{node}: reloaded" in out
            after = _presented(directory, base + 100 + i)
            assert after != before
            assert after == _file_der(directory / "nodes" / f"{node}.pem")
            done = len(writer.done)
            while len(writer.done) < done + 10 and not writer.errors:
                time.sleep(0.05)
        # SIGHUP: the same reload, for scripts and service managers
        rotate_node_cert(directory, "n1")
        pid = procs.pid("n1")
        assert pid is not None
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _presented(directory, base + 100) != _file_der(directory / "nodes" / "n1.pem"):
            assert time.monotonic() < deadline, "SIGHUP did not reload n1's certificate"
            time.sleep(0.1)
    assert writer.errors == []
    assert len(writer.done) >= 50
    with SyncClient(directory, timeout=20) as client:
        for key, value in writer.done.items():
            assert client.get(key) == value


def test_cert_show_lists_every_certificate_and_warns_about_expiry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "c"
    init_cluster(directory, nodes=3, base_port=find_free_base_port(3))
    code, out, _ = _cli(capsys, "cert", "show", "--cluster", str(directory))
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["ca", "CA"], ["node", "n1"], ["node", "n2"], ["node", "n3"], ["client", "admin"],
        ["client", "client"], ["client", "reader"]]
    code, _, err = _cli(capsys, "cert", "show", "--cluster", str(directory), "--days", "900")
    assert code == 1  # leaf certificates last 825 days
    assert "WARNING: node n1" in err
    # `phalanx status` warns about a certificate that expires within 30 days
    ca = pki.load_ca(directory / "ca")
    soon = pki.issue_client_cert(ca, "short", validity=pki.datetime.timedelta(days=10))
    pki.write_credentials(soon, directory / "clients")
    code, _, err = _cli(capsys, "status", "--cluster", str(directory), "--timeout", "0.2")
    assert code == 1  # (no node runs)
    assert "certificate" in err
    assert "client short" in err


@pytest.mark.long
def test_the_ca_rotates_in_three_steps_under_load(
        cluster: tuple[Path, int, NodeProcesses], capsys: pytest.CaptureFixture[str]) -> None:
    directory, base, procs = cluster
    stale = directory / "stale"  # the admin credentials of the old CA, kept aside
    stale.mkdir()
    for name in ("admin.pem", "admin.key"):
        (stale / name).write_bytes((directory / "clients" / name).read_bytes())
    with Writer(directory) as writer:
        while len(writer.done) < 20 and not writer.errors:
            time.sleep(0.05)
        for step in ("begin", "reissue", "finish"):
            code, out, err = _cli(capsys, "cert", "rotate-ca", step, "--cluster",
                                  str(directory))
            assert code == 0, (step, err)
            assert out.count("reloaded") == 3, (step, out)
            done = len(writer.done)
            while len(writer.done) < done + 20 and not writer.errors:
                time.sleep(0.05)
    assert writer.errors == []
    procs.stop(grace=5)  # one at a time in production; all at once here is as good
    procs.start()
    with SyncClient(directory, timeout=20) as client:  # the data directories were accepted
        for key, value in writer.done.items():
            assert client.get(key) == value
    # restarted, the nodes trust only the new CA: the old admin certificate is refused
    (stale / "ca.pem").write_bytes((directory / "clients" / "ca.pem").read_bytes())
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _exchange(stale, base + 100)


def _exchange(credentials: Path, port: int) -> None:
    """A handshake with `credentials` (ca.pem, admin.pem, admin.key) and one read: TLS 1.3
    reports a refused client certificate on the first read."""
    context = pki.client_context(credentials / "ca.pem",
                                 certificate=credentials / "admin.pem",
                                 private_key=credentials / "admin.key", check_hostname=False)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        tls.sendall(b"\0\0\0\0")
        if not tls.recv(1):
            raise ConnectionError("closed")

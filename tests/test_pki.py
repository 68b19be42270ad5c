"""Tests for phalanx.ops.pki: certificates, PEM files, TLS contexts and identity extraction.

TLS handshakes run over in-memory streams (no sockets): what is tested is who trusts whom.
"""

from __future__ import annotations

import datetime
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from phalanx.consensus.types import NodeId
from phalanx.ops import pki


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pki.CredentialPaths]:
    """A cluster CA with nodes n1, n2, a client, and n1 issued by a foreign CA."""
    root = tmp_path_factory.mktemp("pki")
    ca = pki.create_ca()
    paths = {"ca": pki.write_ca(ca, root / "ca")}
    for node in ("n1", "n2"):
        paths[node] = pki.write_credentials(pki.issue_node_cert(ca, node), root / "nodes")
    paths["alice"] = pki.write_credentials(pki.issue_client_cert(ca, "alice"), root / "clients")
    foreign = pki.create_ca("someone else's CA")
    paths["foreign-n1"] = pki.write_credentials(pki.issue_node_cert(foreign, "n1"), root / "x")
    return paths


async def _handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, *, server_hostname: str | None = None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Handshake in memory, then exchange one byte each way (TLS 1.3 reports a refused
    client certificate only after the client's handshake). Returns both peercerts."""
    left, right = trio.testing.memory_stream_pair()
    s = trio.SSLStream(left, server, server_side=True)
    c = trio.SSLStream(right, client, server_hostname=server_hostname)
    result: dict[str, Any] = {}

    async def run_server() -> None:
        await s.do_handshake()
        result["server"] = s.getpeercert()
        await s.send_all(b"s")
        assert await s.receive_some(1) == b"c"

    async def run_client() -> None:
        await c.do_handshake()
        result["client"] = c.getpeercert()
        await c.send_all(b"c")
        assert await c.receive_some(1) == b"s"

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_server)
            nursery.start_soon(run_client)
    return result["server"], result["client"]


async def test_nodes_authenticate_each_other_by_node_id(
    cluster: dict[str, pki.CredentialPaths],
) -> None:
    server_sees, client_sees = await _handshake(
        pki.peer_server_context(cluster["n1"]), pki.peer_client_context(cluster["n2"])
    )
    assert pki.node_id_from_peercert(server_sees) == NodeId("n2")
    assert pki.node_id_from_peercert(client_sees) == NodeId("n1")


@pytest.mark.parametrize("who", ["nobody", "foreign-n1"])
async def test_peer_server_refuses_missing_or_foreign_certificate(
    cluster: dict[str, pki.CredentialPaths], who: str
) -> None:
    if who == "nobody":
        client = pki.client_context(cluster["ca"].certificate, check_hostname=False)
    else:
        client = pki.peer_client_context(
            pki.CredentialPaths(
                certificate=cluster[who].certificate,
                private_key=cluster[who].private_key,
                ca_certificate=cluster["ca"].certificate,
            )
        )
    with pytest.RaisesGroup(trio.BrokenResourceError, allow_unwrapped=True, flatten_subgroups=True):
        await _handshake(pki.peer_server_context(cluster["n1"]), client)


async def test_client_port_requires_a_client_certificate(
    cluster: dict[str, pki.CredentialPaths],
) -> None:
    # The attack: a client holding only the public CA certificate used to get in.
    server = pki.client_server_context(cluster["n1"])
    anonymous = pki.client_context(cluster["ca"].certificate)
    with pytest.RaisesGroup(trio.BrokenResourceError, allow_unwrapped=True, flatten_subgroups=True):
        await _handshake(server, anonymous, server_hostname="localhost")
    alice = pki.client_context(
        cluster["alice"].ca_certificate,
        certificate=cluster["alice"].certificate,
        private_key=cluster["alice"].private_key,
    )
    server_sees, client_sees = await _handshake(server, alice, server_hostname="127.0.0.1")
    assert pki.identity_from_peercert(server_sees) == pki.Identity(
        kind="client", name="alice", role="read-write")
    assert pki.node_id_from_peercert(server_sees) is None  # a client is never a node
    assert pki.node_id_from_peercert(client_sees) == NodeId("n1")


async def test_insecure_client_port_makes_client_certificates_optional(
    cluster: dict[str, pki.CredentialPaths],
) -> None:
    server = pki.client_server_context(cluster["n1"], require_client_cert=False)
    anonymous = pki.client_context(cluster["ca"].certificate)
    server_sees, client_sees = await _handshake(server, anonymous, server_hostname="localhost")
    assert not server_sees
    assert pki.node_id_from_peercert(client_sees) == NodeId("n1")


@pytest.mark.parametrize("role", ["read-only", "read-write", "admin"])
def test_client_certificates_carry_their_role(tmp_path: Path, role: str) -> None:
    ca = pki.create_ca()
    paths = pki.write_credentials(pki.issue_client_cert(ca, "bob", role=role), tmp_path)
    assert pki.identity_from_certificate(paths.certificate) == pki.Identity(
        kind="client", name="bob", role=role)
    session = pki.new_client_id(paths.certificate)
    assert session.startswith("bob/")
    assert len(session) == 4 + 32
    with pytest.raises(ValueError, match="invalid client role"):
        pki.issue_client_cert(ca, "bob", role="root")
    node = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path)
    with pytest.raises(ValueError, match="not a phalanx client certificate"):
        pki.new_client_id(node.certificate)


@pytest.mark.parametrize(
    ("uris", "expected"),
    [
        (("urn:phalanx:client:a",), ("a", "read-write")),  # no marker: read-write
        (("urn:phalanx:client:a", "urn:phalanx:role:read-only"), ("a", "read-only")),
        (("urn:phalanx:role:admin", "urn:phalanx:client:a"), ("a", "admin")),
        (("urn:phalanx:client:a", "urn:phalanx:role:root"), None),  # unknown role
        # two roles are ambiguous; a role on a node certificate too
        (("urn:phalanx:client:a", "urn:phalanx:role:read-only", "urn:phalanx:role:admin"), None),
        (("urn:phalanx:node:n1", "urn:phalanx:role:admin"), None),
    ],
)
def test_client_role_extraction(uris: tuple[str, ...], expected: tuple[str, str] | None) -> None:
    identity = pki.identity_from_peercert({"subjectAltName": tuple(("URI", u) for u in uris)})
    if expected is None:
        assert identity is None
    else:
        assert identity == pki.Identity(kind="client", name=expected[0], role=expected[1])


async def test_client_checks_the_server_host_name(cluster: dict[str, pki.CredentialPaths]) -> None:
    client = pki.client_context(cluster["ca"].certificate)
    with pytest.RaisesGroup(trio.BrokenResourceError, allow_unwrapped=True, flatten_subgroups=True):
        await _handshake(
            pki.client_server_context(cluster["n1"]), client, server_hostname="evil.example"
        )


async def test_expired_certificate_is_refused(tmp_path: Path) -> None:
    ca = pki.create_ca()
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    old = pki.write_credentials(
        pki.issue_node_cert(ca, "n2", validity=datetime.timedelta(days=1), now=past), tmp_path
    )
    fresh = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path)
    with pytest.RaisesGroup(trio.BrokenResourceError, allow_unwrapped=True, flatten_subgroups=True):
        await _handshake(pki.peer_server_context(fresh), pki.peer_client_context(old))


def test_key_files_are_private_and_certificates_readable(
    cluster: dict[str, pki.CredentialPaths],
) -> None:
    for paths in cluster.values():
        assert stat.S_IMODE(paths.private_key.stat().st_mode) == 0o600
        assert stat.S_IMODE(paths.certificate.stat().st_mode) == 0o644
    assert not list(cluster["n1"].certificate.parent.glob(".*.tmp"))


def test_certificates_carry_identity_and_usage(cluster: dict[str, pki.CredentialPaths]) -> None:
    node = x509.load_pem_x509_certificate(cluster["n1"].certificate.read_bytes())
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["urn:phalanx:node:n1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    eku = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    client = x509.load_pem_x509_certificate(cluster["alice"].certificate.read_bytes())
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca = x509.load_pem_x509_certificate(cluster["ca"].certificate.read_bytes())
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca
    assert constraints.path_length == 0
    assert node.issuer == ca.subject


def test_load_ca_round_trips_and_rejects_a_mismatched_key(tmp_path: Path) -> None:
    ca = pki.create_ca()
    pki.write_ca(ca, tmp_path / "a")
    loaded = pki.load_ca(tmp_path / "a")
    assert loaded.certificate == ca.certificate
    # The loaded CA can issue certificates that chain to the original.
    issued = pki.issue_node_cert(loaded, "n3")
    assert issued.certificate.issuer == ca.certificate.subject
    pki.write_ca(pki.create_ca(), tmp_path / "b")
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    with pytest.raises(ValueError, match="does not match"):
        pki.load_ca(tmp_path / "a")


@pytest.mark.parametrize("bad", ["", "n/1", "a" * 65, "n 1", "n1:x", "é"])
def test_invalid_names_are_refused(bad: str) -> None:
    ca = pki.create_ca()
    with pytest.raises(ValueError, match="invalid identity name"):
        pki.issue_node_cert(ca, bad)
    with pytest.raises(ValueError, match="invalid identity name"):
        pki.issue_client_cert(ca, bad)


@pytest.mark.parametrize(
    ("peercert", "expected"),
    [
        (None, None),
        ({}, None),
        ({"subjectAltName": (("DNS", "n1"),)}, None),
        ({"subjectAltName": (("URI", "urn:phalanx:node:n1"),)}, "n1"),
        ({"subjectAltName": (("URI", "urn:phalanx:node:n/1"),)}, None),
        ({"subjectAltName": (("URI", "urn:phalanx:client:n1"),)}, None),
        # Two identities in one certificate are ambiguous: refused.
        (
            {"subjectAltName": (("URI", "urn:phalanx:node:n1"), ("URI", "urn:phalanx:node:n2"))},
            None,
        ),
        ({"subjectAltName": "garbage"}, None),
    ],
)
def test_node_id_extraction(peercert: dict[str, Any] | None, expected: str | None) -> None:
    assert pki.node_id_from_peercert(peercert) == expected


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        pki.create_ca(now=datetime.datetime(2024, 1, 1))

"""Cluster PKI: a private CA, node and client certificates, PEM files, TLS contexts.

This module owns the cluster's identities. A node's identity *is* its certificate: the
certificate names the node id in a URI subject alternative name ``urn:phalanx:node:<id>``
(and in the subject CN, for humans and tools). Client certificates carry
``urn:phalanx:client:<name>`` instead, so a client certificate can never pass as a replica,
and at most one role ``urn:phalanx:role:<role>`` (`CLIENT_ROLES`; what the client port lets
it do, `phalanx.runtime.client_auth`). A client certificate without a role marker (issued before
roles existed) is read-write.

Key choice: ECDSA P-256 with SHA-256 signatures. Ed25519 certificates also work with this
machine's OpenSSL 3.0 under TLS 1.3, but P-256 is accepted by every TLS stack Python may be
linked against (OpenSSL 1.1.1+, LibreSSL, TLS 1.2 fallbacks in other tools such as curl and
``openssl s_client``), so it is the choice that works everywhere.

Rules:
- Imports only the standard library and `cryptography`; never trio, the transport or the
  codec. It never pickles.
- Private keys are written unencrypted (PKCS#8 PEM) with mode 0600, atomically (temp file,
  fsync, rename); certificates with mode 0644. Protect the directory like any secret store.
- Node ids and client names are restricted to ``[A-Za-z0-9._-]{1,64}``, so they embed
  unambiguously in a URN and in file names. Anything else is our misuse: `ValueError`.
- TLS contexts require TLS 1.3. The client port REQUIRES a client certificate unless the node
  runs in the explicit insecure mode (``[client] auth = "none"``). Hostname checking is off
  on peer links: peers are pinned by node id (`node_id_from_peercert`), which is stronger
  than a host name; the host SANs are still issued so standard tools can verify a node by
  address.
- The CA is a trust root only (``pathlen=0``): leaf certificates can never sign others.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from phalanx.consensus.types import NodeId

NODE_URN_PREFIX = "urn:phalanx:node:"
CLIENT_URN_PREFIX = "urn:phalanx:client:"
ROLE_URN_PREFIX = "urn:phalanx:role:"
CLIENT_ROLES = ("read-only", "read-write", "admin")
"""Client roles, weakest first; each may do what the ones before it may
(`phalanx.runtime.client_auth`)."""
DEFAULT_CLIENT_ROLE = "read-write"
"""The role of a client certificate issued without one, and of one that carries no marker."""
DEFAULT_CA_VALIDITY = datetime.timedelta(days=3650)
DEFAULT_LEAF_VALIDITY = datetime.timedelta(days=825)
DEFAULT_HOSTS = ("localhost", "127.0.0.1")

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

IdentityKind = Literal["node", "client"]
_URN_PREFIXES: tuple[tuple[str, IdentityKind], ...] = (
    (NODE_URN_PREFIX, "node"),
    (CLIENT_URN_PREFIX, "client"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateAuthority:
    """The cluster CA: its self-signed certificate and signing key."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """A leaf identity (node or client): certificate, key, and the CA that signed it."""

    name: str
    kind: IdentityKind
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey
    ca_certificate: x509.Certificate


@dataclass(frozen=True, slots=True, kw_only=True)
class CredentialPaths:
    """Where a leaf identity lives on disk (what `ssl.SSLContext` loads)."""

    certificate: Path
    private_key: Path
    ca_certificate: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """An authenticated identity read from a verified peer certificate."""

    kind: IdentityKind
    name: str
    role: str | None = None
    """A client's role (`CLIENT_ROLES`; `DEFAULT_CLIENT_ROLE` when the certificate has no
    marker); None for a node."""


def validate_name(name: str) -> str:
    """Return `name` if it is a valid node id / client name, else raise `ValueError`."""
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid identity name {name!r}: must match [A-Za-z0-9._-]{{1,64}}")
    return name


def _now(now: datetime.datetime | None) -> datetime.datetime:
    if now is None:
        return datetime.datetime.now(datetime.UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def create_ca(
    common_name: str = "phalanx cluster CA",
    *,
    validity: datetime.timedelta = DEFAULT_CA_VALIDITY,
    now: datetime.datetime | None = None,
) -> CertificateAuthority:
    """Create a fresh self-signed cluster CA (ECDSA P-256)."""
    start = _now(now)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate=certificate, private_key=key)


def _host_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _issue(
    ca: CertificateAuthority,
    *,
    name: str,
    kind: IdentityKind,
    hosts: tuple[str, ...],
    validity: datetime.timedelta,
    now: datetime.datetime | None,
    role: str | None = None,
) -> Credentials:
    validate_name(name)
    start = _now(now)
    key = _new_key()
    urn = (NODE_URN_PREFIX if kind == "node" else CLIENT_URN_PREFIX) + name
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(urn), *_host_names(hosts)]
    if role is not None:
        sans.append(x509.UniformResourceIdentifier(ROLE_URN_PREFIX + role))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if kind == "node":
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value), False
        )
        .sign(ca.private_key, hashes.SHA256())
    )
    return Credentials(
        name=name,
        kind=kind,
        certificate=certificate,
        private_key=key,
        ca_certificate=ca.certificate,
    )


def issue_node_cert(
    ca: CertificateAuthority,
    node_id: NodeId | str,
    *,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    validity: datetime.timedelta = DEFAULT_LEAF_VALIDITY,
    now: datetime.datetime | None = None,
) -> Credentials:
    """Issue a replica certificate naming `node_id`, valid as TLS server and client.

    Args:
        hosts: DNS names and IP addresses the node listens on (added as SANs).
    """
    return _issue(ca, name=node_id, kind="node", hosts=hosts, validity=validity, now=now)


def validate_role(role: str) -> str:
    """Return `role` if it is one of `CLIENT_ROLES`, else raise `ValueError`."""
    if role not in CLIENT_ROLES:
        raise ValueError(f"invalid client role {role!r}: expected one of {', '.join(CLIENT_ROLES)}")
    return role


def issue_client_cert(
    ca: CertificateAuthority,
    name: str,
    *,
    role: str = DEFAULT_CLIENT_ROLE,
    validity: datetime.timedelta = DEFAULT_LEAF_VALIDITY,
    now: datetime.datetime | None = None,
) -> Credentials:
    """Issue a client certificate (TLS client auth only) naming client `name` in `role`."""
    return _issue(ca, name=name, kind="client", hosts=(), validity=validity, now=now,
                  role=validate_role(role))


# --------------------------------------------------------------------------------------------
# PEM files


def _cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # umask and a pre-existing temp file must not widen the mode
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_ca(ca: CertificateAuthority, directory: Path) -> CredentialPaths:
    """Write ``ca.pem`` (0644) and ``ca.key`` (0600) into `directory` (created if needed).

    The returned paths name the CA certificate as both `certificate` and `ca_certificate`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    _write_atomic(key_path, _key_pem(ca.private_key), 0o600)
    _write_atomic(cert_path, _cert_pem(ca.certificate), 0o644)
    return CredentialPaths(certificate=cert_path, private_key=key_path, ca_certificate=cert_path)


def write_ca_key(ca: CertificateAuthority, directory: Path, *, name: str = "ca.key") -> Path:
    """Replace ``ca.key`` (or `name`; 0600) in `directory` with `ca`'s key (a CA rotation:
    the bundle in ``ca.pem`` is written apart, `write_trust`)."""
    path = directory / name
    _write_atomic(path, _key_pem(ca.private_key), 0o600)
    return path


def write_credentials(credentials: Credentials, directory: Path) -> CredentialPaths:
    """Write ``<name>.pem``, ``<name>.key`` (0600) and ``ca.pem`` into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    name = validate_name(credentials.name)
    paths = CredentialPaths(
        certificate=directory / f"{name}.pem",
        private_key=directory / f"{name}.key",
        ca_certificate=directory / "ca.pem",
    )
    write_leaf(credentials, certificate=paths.certificate, private_key=paths.private_key)
    if not _holds(paths.ca_certificate, credentials.ca_certificate):
        # (a bundle that already trusts this CA, mid-rotation, is left as it is)
        _write_atomic(paths.ca_certificate, _cert_pem(credentials.ca_certificate), 0o644)
    return paths


def write_leaf(credentials: Credentials, *, certificate: Path, private_key: Path) -> None:
    """Replace a leaf's key (0600) and certificate (0644) files, each atomically: the key
    first (a reader between the two sees a key that does not fit and keeps what it has)."""
    _write_atomic(private_key, _key_pem(credentials.private_key), 0o600)
    _write_atomic(certificate, _cert_pem(credentials.certificate), 0o644)


def load_certificates(path: Path) -> list[x509.Certificate]:
    """Every certificate in PEM file `path`, in order (a CA bundle during a rotation holds
    the old and the new CA). Raises `OSError` or `ValueError`."""
    return x509.load_pem_x509_certificates(path.read_bytes())


def write_trust(path: Path, authorities: list[x509.Certificate]) -> None:
    """Replace CA file `path` with the bundle of `authorities` (0644, atomically)."""
    _write_atomic(path, b"".join(_cert_pem(c) for c in authorities), 0o644)


def _holds(path: Path, certificate: x509.Certificate) -> bool:
    try:
        return certificate in load_certificates(path)
    except (OSError, ValueError):
        return False


def _spki(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def load_ca(directory: Path) -> CertificateAuthority:
    """Load a CA written by `write_ca` (from a bundle: the certificate that fits the key).

    Raises:
        ValueError: the files are not a PEM certificate and a P-256 key that belong together.
    """
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'} is not an ECDSA key")
    for certificate in load_certificates(directory / "ca.pem"):  # a bundle mid-rotation
        if _spki(key.public_key()) == _spki(certificate.public_key()):
            return CertificateAuthority(certificate=certificate, private_key=key)
    raise ValueError(f"{directory / 'ca.key'} does not match {directory / 'ca.pem'}")


# --------------------------------------------------------------------------------------------
# TLS contexts


PAIR_RETRIES = 5
"""Tries to load a certificate and key that do not fit, 50 ms apart: `write_leaf` replaces
the key, then the certificate, so a reader between the two sees a pair that fits soon."""


def load_pair(context: ssl.SSLContext, certificate: Path, private_key: Path) -> None:
    """`context.load_cert_chain`, retried while the pair does not fit (`PAIR_RETRIES`)."""
    for attempt in range(PAIR_RETRIES):
        try:
            context.load_cert_chain(certificate, private_key)
            return
        except ssl.SSLError as e:
            if "KEY_VALUES_MISMATCH" not in str(e) or attempt == PAIR_RETRIES - 1:
                raise
            time.sleep(0.05)


def _base_context(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def peer_server_context(paths: CredentialPaths) -> ssl.SSLContext:
    """Server side of a replica link: presents the node cert, REQUIRES a cluster-CA cert."""
    context = _base_context(ssl.PROTOCOL_TLS_SERVER)
    load_pair(context, paths.certificate, paths.private_key)
    context.load_verify_locations(cafile=paths.ca_certificate)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def peer_client_context(paths: CredentialPaths) -> ssl.SSLContext:
    """Dialing side of a replica link: presents the node cert, verifies the cluster CA.

    Hostname checking is off: the caller pins the peer's node id instead.
    """
    context = _base_context(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    load_pair(context, paths.certificate, paths.private_key)
    context.load_verify_locations(cafile=paths.ca_certificate)
    return context


def client_server_context(
    paths: CredentialPaths, *, require_client_cert: bool = True
) -> ssl.SSLContext:
    """Server side of the client port: presents the node cert; REQUIRES a cluster-CA client
    certificate (a client without one fails the handshake).

    `require_client_cert=False` is the explicit insecure mode (``[client] auth = "none"``):
    certificates become optional, and one that is presented must still be valid.
    """
    context = _base_context(ssl.PROTOCOL_TLS_SERVER)
    load_pair(context, paths.certificate, paths.private_key)
    context.load_verify_locations(cafile=paths.ca_certificate)
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca_certificate: Path,
    *,
    certificate: Path | None = None,
    private_key: Path | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client's context: verifies the cluster CA; optionally presents a client cert.

    With `check_hostname` the server must be reached by a host in its SANs.
    """
    if (certificate is None) != (private_key is None):
        raise ValueError("certificate and private_key must be given together")
    context = _base_context(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=ca_certificate)
    if certificate is not None and private_key is not None:
        load_pair(context, certificate, private_key)
    return context


# --------------------------------------------------------------------------------------------
# Identity extraction


def _identity_from_uris(uris: list[str]) -> Identity | None:
    found: list[Identity] = []
    roles: list[str] = []
    for value in uris:
        if value.startswith(ROLE_URN_PREFIX):
            roles.append(value[len(ROLE_URN_PREFIX):])
            continue
        for prefix, kind in _URN_PREFIXES:
            if value.startswith(prefix):
                name = value[len(prefix) :]
                if _NAME_RE.fullmatch(name) is None:
                    return None
                found.append(Identity(kind=kind, name=name))
    if len(found) != 1 or len(roles) > 1:
        return None
    identity = found[0]
    if identity.kind == "node":
        return None if roles else identity  # a role on a node certificate is ambiguous
    role = roles[0] if roles else DEFAULT_CLIENT_ROLE
    if role not in CLIENT_ROLES:
        return None
    return Identity(kind="client", name=identity.name, role=role)


def identity_from_peercert(peercert: dict[str, Any] | None) -> Identity | None:
    """Read the phalanx identity from a *verified* certificate (`SSLObject.getpeercert()`).

    Returns None when there is no certificate, or it carries no phalanx URN, or it carries
    more than one identity or role (ambiguous: refused), or the name in the URN is not a
    valid name, or the role is unknown, or a node certificate carries a role.
    """
    if not peercert:
        return None
    uris = [entry[1] for entry in peercert.get("subjectAltName", ())
            if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == "URI"
            and isinstance(entry[1], str)]
    return _identity_from_uris(uris)


def identity_from_certificate(path: Path) -> Identity | None:
    """The phalanx identity a PEM certificate file names (as `identity_from_peercert`).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a PEM certificate.
    """
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return None
    return _identity_from_uris(san.value.get_values_for_type(x509.UniformResourceIdentifier))


def new_client_id(certificate: Path) -> str:
    """A fresh session id owned by the client certificate at `certificate`:
    ``<name>/<uuid4 hex>`` (the client port refuses ids its caller's certificate does not own,
    `phalanx.runtime.client_auth.owns_client_id`; two live clients must not share a session id).

    Raises:
        ValueError: the file names no client identity (or is not a certificate).
        OSError: it cannot be read.
    """
    identity = identity_from_certificate(certificate)
    if identity is None or identity.kind != "client":
        raise ValueError(f"{certificate}: not a phalanx client certificate")
    return f"{identity.name}/{uuid.uuid4().hex}"


def node_id_from_peercert(peercert: dict[str, Any] | None) -> NodeId | None:
    """The node id named by a verified replica certificate, or None if it names no node."""
    identity = identity_from_peercert(peercert)
    if identity is None or identity.kind != "node":
        return None
    return NodeId(identity.name)

"""Certificate expiry and rotation for a cluster directory (issue 21, item 7), behind
`phalanx cert show|rotate|rotate-ca|reload` (`phalanx.cli.cert_rotate`).

Owns: `cluster_certificates` (every CA, node and client certificate with its expiry),
`expiring`, `rotate_node_cert`, the three steps of a CA rotation (`begin_ca_rotation`,
`reissue_all`, `finish_ca_rotation`) and `reload_nodes` (ask running nodes to load their
files again: `phalanx.runtime.operator_ops`).

Without downtime, because a node reloads its certificate, key and CA bundle into its live
TLS contexts (a reload call or SIGHUP): connections opened afterwards use the new files,
open ones keep theirs. A CA rotation goes through a bundle trusted by everyone:
1. begin: a new CA; every CA file (``DIR/ca``, ``DIR/nodes``, ``DIR/clients``) becomes the
   bundle old + new; ``ca.key`` the new key (the old one kept as ``ca.key.old``); nodes
   reload (they trust both). Restart or re-open long-running clients now, so they trust
   both too (their certificates are still the old CA's, which everyone trusts).
2. reissue: every node and client certificate is issued again by the new CA, with the same
   name, role and host names; nodes reload. Hand clients their new certificates.
3. finish: every CA file holds the new CA only; nodes reload. A live TLS context never
   forgets a CA it trusted, so the old CA stays trusted by each node until its next start:
   restart the nodes one at a time (`cluster up --node N`). Refused while a node's IDENTITY
   still names the old CA (it adopts the new one on the reload of step 1 or at start).

Rules: never touches a running node's data but its IDENTITY check (read only); files are
replaced atomically (`phalanx.ops.pki`); operator errors are `CertRotationError` (one line).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from phalanx.ops import pki
from phalanx.ops.local_cluster import open_cluster
from phalanx.ops.node_config import ClusterConfig, ConfigError, NodeConfig, load_node_config
from phalanx.ops.processes import ClusterError

WARN_DAYS = 30
"""`phalanx status` and `cert show` warn about a certificate expiring within this many days."""


class CertRotationError(ClusterError):
    """An operator-fixable problem (no CA key, an unknown node, a step out of order)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CertRow:
    kind: str
    """``ca``, ``node`` or ``client``."""
    name: str
    path: Path
    not_after: datetime.datetime
    issuer: str
    """The issuing CA's common name and serial (short), to tell old from new."""

    def days_left(self, now: datetime.datetime) -> float:
        return (self.not_after - now).total_seconds() / 86400


def _issuer(cert: x509.Certificate) -> str:
    names = cert.issuer.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    key_id = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    tag = (key_id.key_identifier or b"").hex()[:8]
    return f"{_text(names[0].value) if names else '?'} {tag}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _node_configs(cluster: ClusterConfig) -> list[NodeConfig]:
    try:
        return [load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes]
    except ConfigError as e:
        raise CertRotationError(str(e)) from None


def _clients(cluster: ClusterConfig) -> list[Path]:
    folder = cluster.directory / "clients"
    return sorted(p for p in folder.glob("*.pem") if p.name != "ca.pem") \
        if folder.is_dir() else []


def cluster_certificates(directory: str | Path) -> list[CertRow]:
    """Every certificate of the cluster at `directory`: the CA file's (all of a bundle),
    each node's (from its config) and each client's (``DIR/clients/*.pem``).

    Raises:
        CertRotationError: no cluster there, or a file that does not parse.
    """
    cluster = open_cluster(directory)
    rows: list[CertRow] = []

    def add(kind: str, name: str, path: Path) -> None:
        try:
            certs = pki.load_certificates(path)
        except (OSError, ValueError) as e:
            raise CertRotationError(f"cannot read certificate {path}: {e}") from None
        for cert in certs:
            rows.append(CertRow(kind=kind, name=name, path=path,
                                not_after=cert.not_valid_after_utc, issuer=_issuer(cert)))

    add("ca", "CA", cluster.directory / "ca" / "ca.pem")
    for config in _node_configs(cluster):
        add("node", config.id, config.tls.cert)
    for path in _clients(cluster):
        add("client", path.stem, path)
    return rows


def expiring(rows: list[CertRow], *, days: float = WARN_DAYS,
             now: datetime.datetime | None = None) -> list[CertRow]:
    """Those of `rows` that expire within `days` (or already have)."""
    now = now or datetime.datetime.now(datetime.UTC)
    return [r for r in rows if r.days_left(now) < days]


def _ca(cluster: ClusterConfig) -> pki.CertificateAuthority:
    ca_dir = cluster.directory / "ca"
    try:
        return pki.load_ca(ca_dir)
    except (OSError, ValueError) as e:
        raise CertRotationError(f"cannot load the cluster CA from {ca_dir} (ca.pem and "
                                f"ca.key): {e}") from None


def _hosts(cert_path: Path) -> tuple[str, ...]:
    """The DNS and IP subject alternative names of the certificate at `cert_path`."""
    try:
        cert = pki.load_certificates(cert_path)[0]
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, IndexError, x509.ExtensionNotFound):
        return pki.DEFAULT_HOSTS
    hosts = [*sans.get_values_for_type(x509.DNSName),
             *map(str, sans.get_values_for_type(x509.IPAddress))]
    return tuple(hosts) or pki.DEFAULT_HOSTS


def rotate_node_cert(directory: str | Path, node: str) -> NodeConfig:
    """Issue node `node` a new certificate and key from the cluster CA (same host names),
    written over the files its config names. Its config (the node reloads it itself)."""
    cluster = open_cluster(directory)
    configs = {c.id: c for c in _node_configs(cluster)}
    if node not in configs:
        raise CertRotationError(f"no node {node!r} in {cluster.directory} (nodes: "
                                f"{', '.join(configs)})")
    config = configs[node]
    credentials = pki.issue_node_cert(_ca(cluster), node, hosts=_hosts(config.tls.cert))
    pki.write_leaf(credentials, certificate=config.tls.cert, private_key=config.tls.key)
    return config


def _trust_files(cluster: ClusterConfig) -> list[Path]:
    files = [cluster.directory / "ca" / "ca.pem", cluster.ca,
             *(c.tls.ca for c in _node_configs(cluster))]
    return list(dict.fromkeys(p.resolve() for p in files))


def begin_ca_rotation(directory: str | Path) -> pki.CertificateAuthority:
    """Step 1 (module docstring): a new CA, trusted beside the old one everywhere."""
    cluster = open_cluster(directory)
    old = _ca(cluster)
    ca_dir = cluster.directory / "ca"
    if len(pki.load_certificates(ca_dir / "ca.pem")) > 1:
        raise CertRotationError(f"{ca_dir / 'ca.pem'} already holds two CAs: a rotation is "
                                "under way (`phalanx cert rotate-ca reissue`, then `finish`)")
    new = pki.create_ca()
    bundle = [old.certificate, new.certificate]
    for path in _trust_files(cluster):
        pki.write_trust(path, bundle)
    pki.write_ca_key(old, ca_dir, name="ca.key.old")  # (kept for a rollback by hand)
    pki.write_ca_key(new, ca_dir)
    return new


def reissue_all(directory: str | Path) -> list[str]:
    """Step 2: every node and client certificate issued again by the current CA (the one
    ``ca.key`` holds), keeping names, roles and host names. The names reissued."""
    cluster = open_cluster(directory)
    ca = _ca(cluster)
    done = []
    for config in _node_configs(cluster):
        credentials = pki.issue_node_cert(ca, config.id, hosts=_hosts(config.tls.cert))
        pki.write_leaf(credentials, certificate=config.tls.cert, private_key=config.tls.key)
        done.append(config.id)
    for path in _clients(cluster):
        identity = pki.identity_from_certificate(path)
        key = path.with_suffix(".key")
        if identity is None or identity.kind != "client" or not key.is_file():
            continue
        credentials = pki.issue_client_cert(ca, identity.name,
                                            role=identity.role or pki.DEFAULT_CLIENT_ROLE)
        pki.write_leaf(credentials, certificate=path, private_key=key)
        done.append(identity.name)
    return done


def finish_ca_rotation(directory: str | Path) -> list[str]:
    """Step 3: the old CA leaves every CA file. Refused while a certificate the old CA
    signed remains, or a node's IDENTITY still names the old CA. The nodes whose IDENTITY
    could not be read here (data directory on another host)."""
    from phalanx.runtime.identity import IdentityError, read_identity, trusted_fingerprints

    cluster = open_cluster(directory)
    ca = _ca(cluster)
    ca_file = cluster.directory / "ca" / "ca.pem"
    if len(pki.load_certificates(ca_file)) < 2:
        raise CertRotationError(f"{ca_file} holds one CA: no rotation to finish (start one "
                                "with `phalanx cert rotate-ca begin`)")
    current = _issuer_of(ca.certificate)
    stale = [r for r in cluster_certificates(directory)
             if r.kind != "ca" and r.issuer != current]
    if stale:
        raise CertRotationError(f"{stale[0].path} is still signed by the old CA (and "
                                f"{len(stale) - 1} more): run `phalanx cert rotate-ca "
                                "reissue` first")
    unknown = []
    for config in _node_configs(cluster):
        try:
            identity = read_identity(config.data_dir)
            newest = trusted_fingerprints(config.tls.ca)[-1]
        except IdentityError:
            unknown.append(config.id)
            continue
        if identity is not None and identity.cluster != newest:
            raise CertRotationError(f"node {config.id} has not adopted the new CA yet (its "
                                    f"IDENTITY names the old one): `phalanx cert reload "
                                    f"--node {config.id}` or restart it first")
    for path in _trust_files(cluster):
        pki.write_trust(path, [ca.certificate])
    return unknown


def _issuer_of(ca: x509.Certificate) -> str:
    """What `_issuer` says of a certificate `ca` signed."""
    names = ca.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    key_id = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return f"{_text(names[0].value) if names else '?'} {key_id.digest.hex()[:8]}"


async def reload_nodes(cluster: ClusterConfig, nodes: list[str] | None = None, *,
                       seconds: float = 3.0) -> dict[str, str]:
    """Ask each of `nodes` (default: all) to reload its certificates, concurrently:
    {node: its new certificate's expiry, or why not (prefixed ``!``)}."""
    import trio

    from phalanx.client.errors import ClientError
    from phalanx.client.ops_calls import reload_call

    out: dict[str, str] = {}

    async def one(node: str) -> None:
        try:
            out[node] = (await reload_call(cluster, node, seconds=seconds)).not_after
        except ClientError as e:
            out[node] = f"!{e}"

    async with trio.open_nursery() as nursery:
        for node in nodes or [n.id for n in cluster.nodes]:
            nursery.start_soon(one, node)
    return {n.id: out[n.id] for n in cluster.nodes if n.id in out}

"""The inter-cluster path of the peer transport: which foreign nodes a node accepts, and what.

Owns: `LinkedCluster` (one linked cluster as the transport sees it: its cluster id, CA and
its nodes' peer addresses), `Intercluster` (all of them plus the message filter), the node
id qualification `qualify` / `split_qualified` (``n1@<cluster id>``), `issuer_cluster` (which
linked CA issued a verified certificate) and `is_intercluster_message` (the default filter:
wire ids in the reserved "intercluster" range, `phalanx.net.wire.RANGES`).

Invariants:
- A node of a linked cluster is known to this node ONLY by its qualified id
  ``<node>@<cluster id>``; a plain node id always means a member of our own cluster. So a
  foreign certificate that names ``n1`` can never pass for our own ``n1``: the acceptor
  decides the cluster from the CA that signed the certificate (`issuer_cluster`), never from
  the name.
- From a foreign node the transport delivers only messages the filter allows (the
  cluster-sending service's types); everything else is dropped and counted
  (`intercluster_refused`), so a linked cluster's node can never act as a member of our
  consensus.
- Linking trusts public material only (a CA certificate, addresses); nothing here holds a
  foreign private key.

Must not import: trio, consensus cores, services.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.transport_types import PeerAddress

SEPARATOR = "@"
"""Between a node id and its cluster id in a qualified id (not a legal node-name char)."""


def qualify(node: str, cluster_id: str) -> NodeId:
    """``<node>@<cluster_id>``: a node of another cluster, as this node names it."""
    return NodeId(f"{node}{SEPARATOR}{cluster_id}")


def split_qualified(node: str) -> tuple[str, str | None]:
    """(node name, cluster id) of a qualified id; (node, None) for one of our own cluster."""
    name, sep, cluster = node.partition(SEPARATOR)
    return (name, cluster) if sep else (node, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedCluster:
    """One linked cluster, as the transport needs it.

    Attributes:
        cluster_id: its id (`phalanx.runtime.identity.cluster_fingerprint` of its CA).
        ca_pem: its CA certificate (PEM): trusted for certificates naming ITS nodes only.
        peers: its nodes by their own (unqualified) ids, and their peer addresses.
        client_context: how we dial its nodes (our node certificate, verifying ITS CA only).
    """

    cluster_id: str
    ca_pem: bytes
    peers: Mapping[NodeId, PeerAddress]
    client_context: ssl.SSLContext


def linked_client_context(certificate: Path, private_key: Path, ca_pem: bytes
                          ) -> ssl.SSLContext:
    """Dialing a linked cluster's node: present OUR node certificate, verify THEIR CA only
    (as `phalanx.ops.pki.peer_client_context`, with the other cluster's CA)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(certificate, private_key)
    context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    return context


def is_intercluster_message(message: object) -> bool:
    """Whether `message`'s registered wire id is in the reserved inter-cluster range."""
    registry = wire.default_registry()
    cls = type(message)
    return cls in registry and registry.type_id(cls) in wire.RANGES["intercluster"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Intercluster:
    """Every cluster this node is linked with, and what their nodes may send us."""

    clusters: tuple[LinkedCluster, ...]
    allowed: Callable[[object], bool] = is_intercluster_message

    def __post_init__(self) -> None:
        ids = [c.cluster_id for c in self.clusters]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a cluster is linked twice: {sorted(ids)}")
        for c in self.clusters:
            if not c.cluster_id or SEPARATOR in c.cluster_id:
                raise ValueError(f"bad cluster id {c.cluster_id!r}")

    def peers(self) -> dict[NodeId, PeerAddress]:
        """Every linked node by its qualified id."""
        return {qualify(node, c.cluster_id): address
                for c in self.clusters for node, address in c.peers.items()}

    def client_contexts(self) -> dict[NodeId, ssl.SSLContext]:
        return {qualify(node, c.cluster_id): c.client_context
                for c in self.clusters for node in c.peers}

    def issuers(self) -> tuple[tuple[str, x509.Certificate], ...]:
        return tuple((c.cluster_id, x509.load_pem_x509_certificate(c.ca_pem))
                     for c in self.clusters)


class LinkedPeers:
    """What a `Transport` holds of its `Intercluster` (empty without one): the linked nodes
    by qualified id, their dial contexts, the linked CAs, the filter; `admit` decides who an
    authenticated inbound certificate is. Building it adds the linked CAs to
    `server_context`'s trust store."""

    def __init__(self, intercluster: Intercluster | None, server_context: ssl.SSLContext,
                 own: Mapping[NodeId, PeerAddress]) -> None:
        if any(split_qualified(p)[1] is not None for p in own):
            raise ValueError("peers are our own cluster's nodes (plain ids); a linked "
                             "cluster's nodes come in `intercluster`")
        self.peers: dict[NodeId, PeerAddress] = {}
        self.dial_contexts: dict[NodeId, ssl.SSLContext] = {}
        self.issuers: tuple[tuple[str, x509.Certificate], ...] = ()
        self.allowed: Callable[[object], bool] = _carry_nothing
        if intercluster is not None:
            self.peers = intercluster.peers()
            self.dial_contexts = intercluster.client_contexts()
            self.issuers = intercluster.issuers()
            self.allowed = intercluster.allowed
            for linked in intercluster.clusters:  # trust its CA (for ITS nodes only)
                server_context.load_verify_locations(cadata=linked.ca_pem.decode("ascii"))
        self.foreign = frozenset(self.peers)

    def admit(self, name: NodeId, der: bytes | None, own: Mapping[NodeId, object]
              ) -> tuple[NodeId | None, str]:
        """(the peer's id, "") for a verified certificate naming node `name`, or (None,
        why it is refused). The signing CA decides the cluster, never the name."""
        cluster = issuer_cluster(der, self.issuers)
        if cluster is not None:  # a linked cluster's CA signed it: one of ITS nodes
            src = qualify(name, cluster)
            if src not in self.foreign:
                return None, f"node {src!r} is not a node of linked cluster {cluster}"
            return src, ""
        if name not in own or name in self.foreign:
            return None, f"node {name!r} is not in the configured peer set"
        return name, ""


def _carry_nothing(message: object) -> bool:
    return False


def issuer_cluster(der: bytes | None,
                   issuers: tuple[tuple[str, x509.Certificate], ...]) -> str | None:
    """The id of the linked cluster whose CA signed the (already TLS-verified) certificate
    `der`, or None when none did (then our own CA did: it is the only other one trusted)."""
    if not der or not issuers:
        return None
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    for cluster_id, ca in issuers:
        if certificate.issuer != ca.subject:
            continue
        try:
            certificate.verify_directly_issued_by(ca)
        except (InvalidSignature, ValueError, TypeError):  # not this CA
            continue
        return cluster_id
    return None

"""Linked clusters: `phalanx cluster link DIR_A DIR_B` and what a node reads of its links.

Owns: `LinkedNode`, `ClusterLink` (one other cluster's PUBLIC material: its cluster id, CA
certificate, fault model, n and f, and per node its id, peer address and Ed25519 signing
public key), `describe_cluster` (a cluster directory's own public material), `link_clusters`
(writes each cluster's material into the other's ``DIR/links/``), `load_links` (a node's
links) and `intercluster_for` (the transport's view of them, `phalanx.net.intercluster`).

Layout: ``DIR/links/<cluster id>.toml`` and ``DIR/links/<cluster id>.ca.pem``, beside
``DIR/nodes/``; a node whose config is ``DIR/nodes/<id>.toml`` reads ``DIR/links/``.

Invariants: a cluster's id is `phalanx.runtime.identity.cluster_fingerprint` of its CA (the
one every node already records); linking copies only public files (no ``*.key`` file is
ever read for anything but deriving its public half, nor written); a cluster is never linked
with itself; linking again replaces the old link (addresses or keys changed). Bad operator
input raises `LinkError` with a one-line message that says what to do.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from phalanx.consensus.types import NodeId
from phalanx.net.intercluster import Intercluster, LinkedCluster, linked_client_context
from phalanx.net.transport_types import PeerAddress
from phalanx.ops.config_toml import dumps_toml
from phalanx.ops.node_config import (
    ConfigError,
    NodeConfig,
    load_cluster_config,
    load_node_config,
)
from phalanx.protocols import get as protocol_spec
from phalanx.protocols.spec import FaultModel

LINKS_DIR = "links"


class LinkError(Exception):
    """A link cannot be made or read (the message says what to fix)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedNode:
    id: str
    host: str
    port: int
    signing_public_key: str
    """Ed25519, hex (as in node configs' ``[[peers]]``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterLink:
    """One cluster's public material, as another cluster stores it."""

    cluster_id: str
    name: str
    """The directory name it was linked from (for operators only)."""
    protocol: str
    fault_model: FaultModel
    f: int
    ca_pem: bytes
    nodes: tuple[LinkedNode, ...]

    @property
    def n(self) -> int:
        return len(self.nodes)


def _fingerprint(ca_pem: bytes) -> str:
    return hashlib.sha256(ca_pem).hexdigest()[:32]  # = runtime.identity.cluster_fingerprint


def describe_cluster(directory: Path) -> ClusterLink:
    """The public material of the cluster in `directory` (made by `phalanx cluster init`)."""
    # Only the CLI needs the signing keys: a node loading its links must not import them
    # (they bring the leaderless and PBFT message types; see test_protocol_registry).
    from phalanx.ops.signing_keys import SigningKeyError, public_keys, read_seed

    try:
        cluster = load_cluster_config(directory)
    except (ConfigError, OSError) as e:
        raise LinkError(f"{directory}: not a cluster directory ({e}); "
                        "make one with `phalanx cluster init`") from None
    fault_model = protocol_spec(cluster.protocol).fault_model
    nodes = []
    for peer in sorted(cluster.nodes, key=lambda p: p.id):
        path = cluster.directory / "nodes" / f"{peer.id}.toml"
        try:
            config = load_node_config(path)
            if config.keys is None:
                raise LinkError(f"{path}: node {peer.id} has no signing key; cluster-sending "
                                "needs one per node: init the cluster with "
                                "`--service clustersend` (or a protocol that signs)")
            public = public_keys(read_seed(config.keys.signing_key)).signing_public_key
        except (ConfigError, SigningKeyError, OSError) as e:
            raise LinkError(f"{path}: {e}") from None
        nodes.append(LinkedNode(id=peer.id, host=config.peer_listen.host,
                                port=config.peer_listen.port, signing_public_key=public))
    ca_pem = cluster.ca.read_bytes()
    return ClusterLink(cluster_id=_fingerprint(ca_pem), name=cluster.directory.name,
                       protocol=cluster.protocol, fault_model=fault_model,
                       f=fault_model.max_faults(len(nodes)), ca_pem=ca_pem,
                       nodes=tuple(nodes))


def _write(link: ClusterLink, into: Path) -> Path:
    folder = into / LINKS_DIR
    folder.mkdir(exist_ok=True)
    (folder / f"{link.cluster_id}.ca.pem").write_bytes(link.ca_pem)
    doc: dict[str, object] = {
        "cluster_id": link.cluster_id, "name": link.name, "protocol": link.protocol,
        "fault_model": link.fault_model.value, "f": link.f,
        "ca": f"{link.cluster_id}.ca.pem",
        "nodes": [{"id": n.id, "host": n.host, "port": n.port,
                   "signing_public_key": n.signing_public_key} for n in link.nodes],
    }
    path = folder / f"{link.cluster_id}.toml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps_toml(doc))
    os.replace(tmp, path)
    return path


def link_clusters(dir_a: Path, dir_b: Path) -> tuple[ClusterLink, ClusterLink]:
    """Write each cluster's public material into the other's ``links/``."""
    a, b = describe_cluster(dir_a), describe_cluster(dir_b)
    if a.cluster_id == b.cluster_id:
        raise LinkError(f"{dir_a} and {dir_b} are the same cluster (one CA); "
                        "link two different clusters")
    _write(b, dir_a)
    _write(a, dir_b)
    return a, b


def _read_link(path: Path) -> ClusterLink:
    try:
        doc = tomllib.loads(path.read_text())
        nodes = tuple(LinkedNode(id=str(n["id"]), host=str(n["host"]), port=int(n["port"]),
                                 signing_public_key=str(n["signing_public_key"]))
                      for n in doc["nodes"])
        ca_pem = (path.parent / str(doc["ca"])).read_bytes()
        link = ClusterLink(cluster_id=str(doc["cluster_id"]), name=str(doc["name"]),
                           protocol=str(doc["protocol"]),
                           fault_model=FaultModel(doc["fault_model"]), f=int(doc["f"]),
                           ca_pem=ca_pem, nodes=nodes)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise LinkError(f"{path}: unreadable link ({type(e).__name__}: {e}); "
                        "re-run `phalanx cluster link`") from None
    if link.cluster_id != _fingerprint(ca_pem) or path.stem != link.cluster_id:
        raise LinkError(f"{path}: its CA does not match its cluster id; "
                        "re-run `phalanx cluster link`")
    return link


def links_dir(config: NodeConfig) -> Path | None:
    """``DIR/links`` for a node config at ``DIR/nodes/<id>.toml`` (None: no config file)."""
    if config.source is None:
        return None
    return config.source.resolve().parent.parent / LINKS_DIR


def load_links(config: NodeConfig) -> tuple[ClusterLink, ...]:
    """Every cluster linked with this node's cluster, by cluster id."""
    folder = links_dir(config)
    if folder is None or not folder.is_dir():
        return ()
    return tuple(_read_link(p) for p in sorted(folder.glob("*.toml")))


def intercluster_for(config: NodeConfig, links: tuple[ClusterLink, ...]
                     ) -> Intercluster | None:
    """The transport's inter-cluster peers for `links` (None without links)."""
    if not links:
        return None
    return Intercluster(clusters=tuple(
        LinkedCluster(cluster_id=link.cluster_id, ca_pem=link.ca_pem,
                      peers={NodeId(n.id): PeerAddress(host=n.host, port=n.port)
                             for n in link.nodes},
                      client_context=linked_client_context(config.tls.cert, config.tls.key,
                                                           link.ca_pem))
        for link in links))

"""The key material of a service that talks to linked clusters (`clustersend`, `announce`).

Owns: `cluster_info` (a cluster's members, f and certificate kind from its fault model),
`LinkedKeys` / `load_linked_keys` (this node's qualified id, its own cluster, the linked
clusters read from `DIR/links/` by `phalanx.ops.link`, and an `Ed25519Crypto` holding every
member's public signing key, ours and theirs), and `send_qualified` (a send to a node of our
own cluster goes by its plain id, to a linked cluster's node by its qualified id).

Invariants: every key comes from the node config (our members) or a link file (theirs),
never from a message; a malformed key is a `ServiceError` naming the file and the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from phalanx.clustersend import CertKind, ClusterInfo
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify, split_qualified
from phalanx.ops.link import LinkError, load_links
from phalanx.ops.node_config import NodeConfig
from phalanx.ops.signing_keys import SigningKeyError, read_seed
from phalanx.protocols.spec import FaultModel
from phalanx.runtime.identity import cluster_fingerprint
from phalanx.services.spec import SendFn, ServiceError


def cluster_info(cluster_id: str, members: tuple[str, ...], fault_model: FaultModel
                 ) -> ClusterInfo:
    kind = CertKind.BYZANTINE if fault_model is FaultModel.BYZANTINE else CertKind.CRASH
    return ClusterInfo(cluster_id=cluster_id,
                       members=tuple(qualify(m, cluster_id) for m in sorted(members)),
                       f=fault_model.max_faults(len(members)), kind=kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedKeys:
    me: NodeId
    """This node, qualified by its cluster id."""
    cluster: ClusterInfo
    linked: tuple[ClusterInfo, ...]
    crypto: Ed25519Crypto


def _public(hex_key: str, where: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(hex_key))
    except ValueError as e:
        raise ServiceError(f"{where}: bad signing public key ({e})") from None


def load_linked_keys(config: NodeConfig, service: str, fault_model: FaultModel,
                     messages: Mapping[int, type]) -> LinkedKeys:
    """Read this node's signing key, its peers' and the linked clusters' public keys, and
    register `messages` with the codec (before anything is signed: canonical bytes).

    Raises:
        ServiceError: no signing key, an unreadable link or key (one line, naming it).
    """
    if config.keys is None:
        raise ServiceError(f"[{service}] needs every node's signing key (make the cluster "
                           f"with `phalanx cluster init --service {service}`)")
    try:
        links = load_links(config)
        private = Ed25519PrivateKey.from_private_bytes(read_seed(config.keys.signing_key))
    except (LinkError, SigningKeyError, OSError, ValueError) as e:
        raise ServiceError(f"[{service}]: {e}") from None
    own_id = cluster_fingerprint(config.tls.ca)
    me = qualify(config.id, own_id)
    public = {me: private.public_key()}
    for peer in config.peers:
        public[qualify(peer.id, own_id)] = _public(peer.signing_public_key or "",
                                                   f"peer {peer.id}")
    linked = []
    for link in links:
        linked.append(cluster_info(link.cluster_id, tuple(n.id for n in link.nodes),
                                   link.fault_model))
        for n in link.nodes:
            public[qualify(n.id, link.cluster_id)] = _public(
                n.signing_public_key, f"links/{link.cluster_id}.toml node {n.id}")
    wire.register_all(messages)
    return LinkedKeys(me=me, cluster=cluster_info(own_id, config.members(), fault_model),
                      linked=tuple(linked),
                      crypto=Ed25519Crypto(me, private_key=private, public_keys=public,
                                           mac_keys={}))


def send_qualified(send: SendFn, own_cluster: str, node: NodeId, message: Message,
                   count: Callable[[str], None]) -> bool:
    """Send `message` to `node` (qualified) and count `send_refused` when the host refuses;
    True when sent. A node of `own_cluster` is addressed by its plain id."""
    name, cluster = split_qualified(node)
    to = NodeId(name) if cluster == own_cluster else node
    if send(to, message):
        return True
    count("send_refused")
    return False

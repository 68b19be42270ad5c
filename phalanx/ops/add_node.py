"""`phalanx cluster add-node DIR`: lay out one more node of an existing local cluster.

Owns: `add_node(directory, node_id=None)`: the next node id (``n<k+1>``) and its ports in the
`cluster init` layout (BASE+i, BASE+100+i, BASE+200+i), its certificate from the cluster's
CA (``DIR/ca/ca.key`` must be there), its data directory (marked new), its config
(``[node] joined = true``: a learner of the bootstrap configuration), and the new peer
(``joined = true``) in every other node config and in ``cluster.toml``.

Rules:
    * Only for a protocol whose runtime changes membership (its `ProtocolNode` has
      ``admin_input``: Raft). PBFT's membership is static (docs/OPERATIONS.md).
    * Writes nothing until every check passed; each config is replaced atomically.
    * Running nodes need no restart: start the new node, then `phalanx member add` it; the
      change carries its peer address (from ``cluster.toml``), and every node links to it
      once it sees the configuration (`phalanx.runtime.peer_links`; docs/OPERATIONS.md).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.local_cluster import (
    CLIENT_PORT_OFFSET,
    METRICS_PORT_OFFSET,
    cluster_config_dict,
    open_cluster,
)
from phalanx.ops.node_config import (
    Address,
    ConfigError,
    NodeConfig,
    PeerConfig,
    load_node_config,
)
from phalanx.ops.ports import ports_free
from phalanx.ops.processes import ClusterError
from phalanx.protocols import get as protocol_spec


def _write(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


def add_node(directory: str | Path, node_id: str | None = None) -> NodeConfig:
    """Add a node to the cluster at `directory` (see the module docstring); its config.

    Raises:
        ClusterError: no cluster there, a protocol with static membership, a node id in use
            or invalid, no CA key, a port of the new node in use, a config that does not load.
    """
    from phalanx.ops import pki
    from phalanx.runtime.identity import prepare_data_dir

    cluster = open_cluster(directory)
    spec = protocol_spec(cluster.protocol)
    if spec.signing_keys or not hasattr(spec.node.load(), "admin_input"):
        raise ClusterError(f"protocol {cluster.protocol} has static membership: nodes cannot "
                           "be added to a running cluster (create a new cluster instead)")
    ids = [n.id for n in cluster.nodes]
    index = len(ids)
    new_id = node_id or next(f"n{i}" for i in range(index + 1, 10 * index + 10)
                             if f"n{i}" not in ids)
    try:
        pki.validate_name(new_id)
        configs = [load_node_config(cluster.node_config_path(i)) for i in ids]
    except (ValueError, ConfigError) as e:
        raise ClusterError(str(e)) from None
    if new_id in ids or cluster.node_config_path(new_id).exists():
        raise ClusterError(f"node {new_id} already exists in {directory}")
    first = cluster.nodes[0]
    host = first.peer_addr.host
    base = first.peer_addr.port
    me = PeerConfig(id=new_id, peer_addr=Address(host=host, port=base + index),
                    client_addr=Address(host=host, port=base + CLIENT_PORT_OFFSET + index),
                    joined=True)
    metrics = Address(host=host, port=base + METRICS_PORT_OFFSET + index)
    taken = {n.peer_addr.port for n in cluster.nodes} | {n.client_addr.port
                                                          for n in cluster.nodes}
    ports = (me.peer_addr.port, me.client_addr.port, metrics.port)
    if any(p in taken for p in ports) or not ports_free(host, ports):
        raise ClusterError(f"the ports of {new_id} ({', '.join(map(str, ports))}) are in use "
                           "on " + host)
    try:
        ca = pki.load_ca(cluster.directory / "ca")
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot load the cluster CA from {cluster.directory / 'ca'} "
                           f"(needed to issue {new_id}'s certificate): {e}") from None
    template = configs[0]
    nodes_dir = cluster.directory / "nodes"
    hosts = tuple(dict.fromkeys((host, *pki.DEFAULT_HOSTS)))
    paths = pki.write_credentials(pki.issue_node_cert(ca, new_id, hosts=hosts), nodes_dir)
    data_dir = cluster.directory / "data" / new_id
    prepare_data_dir(data_dir, node=new_id, ca_certificate=paths.ca_certificate)
    config = replace(
        template, id=new_id, data_dir=data_dir, peer_listen=me.peer_addr,
        client_listen=me.client_addr, metrics_listen=metrics,
        tls=replace(template.tls, cert=paths.certificate, key=paths.private_key),
        peers=cluster.nodes, joined=True, source=None)
    target = cluster.node_config_path(new_id)
    _write(target, dumps_toml(node_config_dict(config, relative_to=nodes_dir)))
    for cfg in configs:
        path = cluster.node_config_path(cfg.id)
        _write(path, dumps_toml(node_config_dict(replace(cfg, peers=(*cfg.peers, me)),
                                                 relative_to=nodes_dir)))
    _write(cluster.directory / "cluster.toml",
           dumps_toml(cluster_config_dict(replace(cluster, nodes=(*cluster.nodes, me)))))
    return load_node_config(target)

"""Writing node configuration files: `node_config_dict` (the TOML document of a `NodeConfig`,
what `phalanx.ops.node_config.load_node_config` reads back) and `dumps_toml` (any TOML document,
written by tomli-w: every string escaped, control characters included).

Invariant: `load_node_config` of what `node_config_dict` + `dumps_toml` write gives back an
equal `NodeConfig` (tests/test_config.py round-trips it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import tomli_w

from phalanx.ops.node_config import KEYS_TABLE, NodeConfig
from phalanx.services.config import service_tables_for_toml


def dumps_toml(data: Mapping[str, object]) -> str:
    """`data` (nested mappings of strings, numbers, booleans, lists and tables) as TOML.

    Written by tomli-w rather than by hand: the hand-written writer this replaced did not
    escape control characters (a newline or a NUL in a path or an option made a file that
    `tomllib` refuses, or worse, one that reads back differently), and tomli-w is small,
    maintained, and guarantees that `tomllib` reads back exactly what it was given."""
    return tomli_w.dumps(data)


def node_config_dict(cfg: NodeConfig, *, relative_to: Path) -> dict[str, object]:
    """The TOML document for `cfg`, with paths relative to `relative_to` where possible."""

    def rel(p: Path) -> str:
        return os.path.relpath(p.resolve(), relative_to.resolve())

    node: dict[str, object] = {
        "id": cfg.id,
        "protocol": cfg.protocol,
        "app": cfg.app,
        "data_dir": rel(cfg.data_dir),
        "peer_listen": str(cfg.peer_listen),
        "client_listen": str(cfg.client_listen),
        "fsync": cfg.fsync,
    }
    if cfg.metrics_listen is not None:
        node["metrics_listen"] = str(cfg.metrics_listen)
    if cfg.joined:
        node["joined"] = True
    peers: list[dict[str, object]] = []
    for p in cfg.peers:
        peer: dict[str, object] = {"id": p.id, "peer_addr": str(p.peer_addr),
                                   "client_addr": str(p.client_addr)}
        if p.signing_public_key is not None:
            peer["signing_public_key"] = p.signing_public_key
        if p.mac_public_key is not None:
            peer["mac_public_key"] = p.mac_public_key
        if p.joined:
            peer["joined"] = True
        peers.append(peer)
    doc: dict[str, object] = {
        "node": node,
        "tls": {"ca": rel(cfg.tls.ca), "cert": rel(cfg.tls.cert), "key": rel(cfg.tls.key)},
        "timing": {
            "tick_ms": cfg.timing.tick_ms,
            "election_ticks": cfg.timing.election_ticks,
            "heartbeat_ticks": cfg.timing.heartbeat_ticks,
        },
        "checkpoint": {
            "every_entries": cfg.checkpoint.every_entries,
            "every_bytes": cfg.checkpoint.every_bytes,
            "keep": cfg.checkpoint.keep,
            "piece_memory_mb": cfg.checkpoint.piece_memory_mb,
        },
        "peers": peers,
    }
    if cfg.checkpoint.recovery_target is not None:
        checkpoint = doc["checkpoint"]
        assert isinstance(checkpoint, dict)
        checkpoint["recovery_target"] = f"{cfg.checkpoint.recovery_target:.15g}s"
    if cfg.app_files:
        doc["app"] = {k: rel(v) for k, v in sorted(cfg.app_files.items())}
    if cfg.protocol_options:
        doc["protocol"] = dict(sorted(cfg.protocol_options.items()))
    if cfg.client_auth != "required":
        doc["client"] = {"auth": cfg.client_auth}
    keys: dict[str, object] = {}
    if cfg.keys is not None:
        keys["signing_key"] = rel(cfg.keys.signing_key)
    if cfg.client_keys:
        keys["clients"] = {name: cfg.client_keys[name].hex() for name in sorted(cfg.client_keys)}
    if keys:
        doc[KEYS_TABLE] = keys
    doc.update(service_tables_for_toml(cfg.services))
    return doc

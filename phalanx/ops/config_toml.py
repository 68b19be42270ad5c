"""Writing node configuration files: `node_config_dict` (the TOML document of a `NodeConfig`,
what `phalanx.ops.node_config.load_node_config` reads back) and `dumps_toml` (the small TOML
subset we write: tables, one level of sub-tables, arrays of tables, strings, ints, floats,
bools, lists of strings).

Invariant: `load_node_config` of what `node_config_dict` + `dumps_toml` write gives back an
equal `NodeConfig` (tests/test_config.py round-trips it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from phalanx.ops.node_config import KEYS_TABLE, NodeConfig
from phalanx.services.config import service_tables_for_toml


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _scalar(key)


def dumps_toml(data: Mapping[str, object]) -> str:
    """Serialise nested mappings: top-level scalars, tables (with one level of sub-tables),
    and arrays of tables."""
    lines: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, Mapping | list)
               or (isinstance(v, list) and not any(isinstance(i, Mapping) for i in v))}
    for k, v in scalars.items():
        lines.append(f"{k} = {_scalar(v)}")
    for k, v in data.items():
        if isinstance(v, Mapping):
            lines += ["", f"[{k}]"] + [f"{ik} = {_scalar(iv)}" for ik, iv in v.items()
                                       if not isinstance(iv, Mapping)]
            for ik, iv in v.items():
                if isinstance(iv, Mapping):
                    lines += ["", f"[{k}.{ik}]"] + [f"{_key(sk)} = {_scalar(sv)}"
                                                    for sk, sv in iv.items()]
        elif isinstance(v, list) and v and all(isinstance(i, Mapping) for i in v):
            for item in v:
                lines += ["", f"[[{k}]]"] + [f"{ik} = {_scalar(iv)}" for ik, iv in item.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


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
    peers: list[dict[str, object]] = []
    for p in cfg.peers:
        peer: dict[str, object] = {"id": p.id, "peer_addr": str(p.peer_addr),
                                   "client_addr": str(p.client_addr)}
        if p.signing_public_key is not None:
            peer["signing_public_key"] = p.signing_public_key
        if p.mac_public_key is not None:
            peer["mac_public_key"] = p.mac_public_key
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
        },
        "peers": peers,
    }
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

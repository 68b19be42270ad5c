"""phalanx: crash- and Byzantine-fault-tolerant replicated state machines.

Subpackages: `phalanx.consensus` (sans-IO cores), `phalanx.protocols` (the protocol
registry), `phalanx.storage` (WAL, checkpoints), `phalanx.apps` (StateMachine API, replica
layer, KV), `phalanx.net` (codec, transport), `phalanx.runtime` (a node under trio),
`phalanx.client`, `phalanx.cli` and `phalanx.ops` (the command line, configs, PKI),
`phalanx.demo`, `phalanx.jepsen` (histories, checkers, simulator, real-cluster harness).

Client library (loaded lazily, so importing a sans-IO subpackage never pulls in trio, TLS or
the client): `Client`, `open_client`, `SyncClient` and the client errors, from
`phalanx.client.async_client` and `phalanx.client.sync_client`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx._lazy import lazy_attributes

__version__ = "0.1.0"

_LAZY = {
    "Client": "phalanx.client.async_client",
    "ClientClosed": "phalanx.client.async_client",
    "ClientError": "phalanx.client.async_client",
    "ClientTimeout": "phalanx.client.async_client",
    "ClusterUnreachable": "phalanx.client.errors",
    "KvCommandError": "phalanx.client.async_client",
    "ProtocolViolation": "phalanx.client.async_client",
    "RequestRejected": "phalanx.client.async_client",
    "open_client": "phalanx.client.async_client",
    "SyncClient": "phalanx.client.sync_client",
}

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientTimeout",
    "ClusterUnreachable",
    "KvCommandError",
    "ProtocolViolation",
    "RequestRejected",
    "SyncClient",
    "__version__",
    "open_client",
]

if TYPE_CHECKING:
    from phalanx.client.async_client import (
        Client,
        ClientClosed,
        ClientError,
        ClientTimeout,
        KvCommandError,
        ProtocolViolation,
        RequestRejected,
        open_client,
    )
    from phalanx.client.sync_client import SyncClient


__getattr__ = lazy_attributes(__name__, _LAZY, globals())

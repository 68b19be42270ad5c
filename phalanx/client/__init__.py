"""The client library: `Client` (async, trio), `SyncClient`, their errors and KV helpers.

Modules: `async_client` (the `Client` handle), `sync_client`, `connection` (one TLS
connection per node), `bft_calls` (gather f+1 matching replies), `kv` (typed KV helpers),
`errors`. Names are loaded lazily, so importing `phalanx.client.errors` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx._lazy import lazy_attributes

_LAZY = {
    "BaseVersion": "phalanx.client.kv",
    "Client": "phalanx.client.async_client",
    "open_client": "phalanx.client.async_client",
    "SyncClient": "phalanx.client.sync_client",
    "ClientClosed": "phalanx.client.errors",
    "ClientError": "phalanx.client.errors",
    "ClientTimeout": "phalanx.client.errors",
    "ClusterUnreachable": "phalanx.client.errors",
    "InvalidArgument": "phalanx.client.errors",
    "KvCommandError": "phalanx.client.errors",
    "ProtocolViolation": "phalanx.client.errors",
    "RequestRejected": "phalanx.client.errors",
    "TransactionAborted": "phalanx.client.errors",
}

__all__ = [
    "BaseVersion",
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientTimeout",
    "ClusterUnreachable",
    "InvalidArgument",
    "KvCommandError",
    "ProtocolViolation",
    "RequestRejected",
    "SyncClient",
    "TransactionAborted",
    "open_client",
]

if TYPE_CHECKING:
    from phalanx.client.async_client import Client, open_client
    from phalanx.client.errors import (
        ClientClosed,
        ClientError,
        ClientTimeout,
        ClusterUnreachable,
        InvalidArgument,
        KvCommandError,
        ProtocolViolation,
        RequestRejected,
        TransactionAborted,
    )
    from phalanx.client.sync_client import SyncClient


__getattr__ = lazy_attributes(__name__, _LAZY, globals())

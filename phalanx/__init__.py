"""phalanx: crash- and Byzantine-fault-tolerant replicated state machines.

Subpackages: `phalanx.consensus` (sans-IO cores), `phalanx.protocols` (the protocol
registry), `phalanx.storage` (WAL, checkpoints), `phalanx.apps` (StateMachine API, replica
layer, KV), `phalanx.net` (codec, transport), `phalanx.runtime` (a node under trio),
`phalanx.client`, `phalanx.cli` and `phalanx.ops` (the command line, configs, PKI),
`phalanx.demo`, `phalanx.jepsen` (histories, checkers, simulator, real-cluster harness).

The public API (loaded lazily, so importing a sans-IO subpackage never pulls in trio, TLS or
the client); everything else is internal and may change between versions:

- the application contract: `StateMachine`, `StateSnapshot`, `SnapshotFormatError`
  (`phalanx.apps.interface`; docs/STATE_MACHINES.md) and `GeneratedCommand` (the optional
  `random_command` testing hook: `phalanx.apps.command_source`);
- running nodes: `open_node`, `serve_node`, `Node`, `NodeConfig`, `ClusterConfig`,
  `load_node_config`, `open_cluster`, `init_cluster`, `find_free_base_port`, `ConfigError`;
- the client: `Client`, `open_client`, `SyncClient` and the client errors (all derive from
  `ClientError`);
- a plain class as a state machine: `replicated`, `query`, `Replicated` (the client proxy),
  `ReplicatedMachine`, `ReplicatedCallError` (`phalanx.replicated_class`);
- testing: `check_history`, `read_history`, `HistoryRecorder` (`phalanx.jepsen`).
"""

from __future__ import annotations

from phalanx._lazy import TYPE_CHECKING, lazy_attributes

__version__ = "0.1.0"

_LAZY = {
    "Client": "phalanx.client.async_client",
    "ClientClosed": "phalanx.client.async_client",
    "ClientError": "phalanx.client.async_client",
    "ClientTimeout": "phalanx.client.async_client",
    "ClusterUnreachable": "phalanx.client.errors",
    "InvalidArgument": "phalanx.client.errors",
    "KvCommandError": "phalanx.client.async_client",
    "ProtocolViolation": "phalanx.client.async_client",
    "RequestRejected": "phalanx.client.async_client",
    "open_client": "phalanx.client.async_client",
    "SyncClient": "phalanx.client.sync_client",
    "StateMachine": "phalanx.apps.interface",
    "StateSnapshot": "phalanx.apps.interface",
    "SnapshotFormatError": "phalanx.apps.interface",
    "GeneratedCommand": "phalanx.apps.command_source",
    "replicated": "phalanx.replicated_class",
    "query": "phalanx.replicated_class",
    "Replicated": "phalanx.replicated_class",
    "ReplicatedMachine": "phalanx.replicated_class",
    "ReplicatedCallError": "phalanx.replicated_class",
    "open_node": "phalanx.runtime.node",
    "serve_node": "phalanx.runtime.node",
    "Node": "phalanx.runtime.node",
    "NodeConfig": "phalanx.ops.node_config",
    "ClusterConfig": "phalanx.ops.node_config",
    "ConfigError": "phalanx.ops.node_config",
    "load_node_config": "phalanx.ops.node_config",
    "open_cluster": "phalanx.ops.local_cluster",
    "init_cluster": "phalanx.ops.local_cluster",
    "find_free_base_port": "phalanx.ops.local_cluster",
    "check_history": "phalanx.jepsen.checker",
    "read_history": "phalanx.jepsen.history",
    "HistoryRecorder": "phalanx.jepsen.history",
}

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientTimeout",
    "ClusterConfig",
    "ClusterUnreachable",
    "ConfigError",
    "GeneratedCommand",
    "HistoryRecorder",
    "InvalidArgument",
    "KvCommandError",
    "Node",
    "NodeConfig",
    "ProtocolViolation",
    "Replicated",
    "ReplicatedCallError",
    "ReplicatedMachine",
    "RequestRejected",
    "SnapshotFormatError",
    "StateMachine",
    "StateSnapshot",
    "SyncClient",
    "__version__",
    "check_history",
    "find_free_base_port",
    "init_cluster",
    "load_node_config",
    "open_client",
    "open_cluster",
    "open_node",
    "query",
    "read_history",
    "replicated",
    "serve_node",
]

if TYPE_CHECKING:
    from phalanx.apps.command_source import GeneratedCommand
    from phalanx.apps.interface import SnapshotFormatError, StateMachine, StateSnapshot
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
    from phalanx.client.errors import ClusterUnreachable, InvalidArgument
    from phalanx.client.sync_client import SyncClient
    from phalanx.jepsen.checker import check_history
    from phalanx.jepsen.history import HistoryRecorder, read_history
    from phalanx.ops.local_cluster import find_free_base_port, init_cluster, open_cluster
    from phalanx.ops.node_config import ClusterConfig, ConfigError, NodeConfig, load_node_config
    from phalanx.replicated_class import (
        Replicated,
        ReplicatedCallError,
        ReplicatedMachine,
        query,
        replicated,
    )
    from phalanx.runtime.node import Node, open_node, serve_node


__getattr__ = lazy_attributes(__name__, _LAZY, globals())

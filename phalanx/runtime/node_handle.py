"""The handle of a running node: what `phalanx.runtime.node.open_node` yields.

Owns: `Node` (read-only accessors over a running node's parts: its config, driver, peer
transport, client port, metrics, bound addresses, services and piece transfer; safe from any
task), `NodeStatistics` (one snapshot of its counters) and `bound_address` (where a
listener is really bound, for port 0). Both classes are re-exported by
`phalanx.runtime.node`, their public import path.
Must not import: `phalanx.runtime.node` (which imports this module), the CLI, the client
library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import trio

from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus
from phalanx.net.client_protocol import StatusReply
from phalanx.net.transport import Transport, TransportStatistics
from phalanx.ops.node_config import Address, NodeConfig
from phalanx.runtime.client_port import ClientPort, ClientPortStatistics
from phalanx.runtime.driver import Driver
from phalanx.runtime.driver_stats import DriverStatistics
from phalanx.runtime.metrics import NodeMetrics
from phalanx.runtime.piece_transfer import PieceTransfer
from phalanx.services import NodeService

__all__ = ["Node", "NodeStatistics", "bound_address"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatistics:
    driver: DriverStatistics
    transport: TransportStatistics
    client_port: ClientPortStatistics
    group_commit_batches: int
    fsyncs: int
    hard_state_writes: int


class Node:
    """A running node (yielded by `open_node`). Read-only accessors; safe from any task."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        driver: Driver,
        transport: Transport,
        client_port: ClientPort,
        metrics: NodeMetrics,
        peer_address: Address,
        client_address: Address,
    ) -> None:
        self.config = config
        self.driver = driver
        self.transport = transport
        self.client_port = client_port
        self.metrics = metrics
        self.peer_address = peer_address
        """Where the peer listener is bound (the real port when configured with port 0)."""
        self.client_address = client_address
        """Where the client port is bound."""
        self.metrics_port: int | None = None
        self.services: Mapping[str, NodeService] = {}
        """The node's running services by name (`phalanx.services`), e.g.
        ``node.services["gossip"].publish(b"...")`` (`phalanx.services.gossip_node`)."""
        self.pieces: PieceTransfer | None = None
        """Shard-level state transfer (`phalanx.runtime.piece_transfer`), when the protocol
        relays piece manifests (`ProtocolSpec.piece_transfer`): its `stats`."""

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def replica(self) -> Replica:
        return self.driver.replica

    def core_status(self) -> CoreStatus:
        return self.driver.status()

    def status(self, nonce: int = 0) -> StatusReply:
        """What `phalanx status` shows: role, term, leader, commit/applied, checkpoint, peers."""
        return self.driver.status_reply(nonce)

    def statistics(self) -> NodeStatistics:
        committer = self.driver.committer
        return NodeStatistics(
            driver=self.driver.stats,
            transport=self.transport.statistics(),
            client_port=self.client_port.stats,
            group_commit_batches=committer.batches,
            fsyncs=committer.syncs,
            hard_state_writes=committer.hard_state_writes,
        )


def bound_address(listeners: list[trio.SocketListener], host: str) -> Address:
    """Where the first of `listeners` is bound (the real port when asked for port 0)."""
    port = listeners[0].socket.getsockname()[1]
    return Address(host=host, port=int(port))

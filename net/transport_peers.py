"""A running `phalanx.net.transport.Transport`'s peer set: peers added and removed at run time.

Owns: `DynamicPeers` (a base class of `Transport`, which provides the state declared here):
`add_peer` (a new peer, or one that moved: its queue, its link task, the inbound limits
grown), `remove_peer` (its link task cancelled, its inbound connection closed, queued and
held frames dropped, the limits shrunk), `knows`, and `start_links` (the link tasks of the
configured peers, in the transport's nursery, which later additions reuse).

Rules:
    * Who is a peer decides who may connect: a removed peer's inbound connection is closed
      at once and its next one is refused (not in the peer set); an added peer's
      certificate is trusted because the cluster CA signed it, like any peer's.
    * A removed peer's link task cleans up its own queue after it was cancelled, and only
      if that queue is still the current one (the peer may be back by then, with a new one).
    * Sends to a removed peer raise `LocalProtocolError` like any unknown destination:
      callers that follow a changing membership check `knows` first.
    * Only for this cluster's peers; linked clusters' nodes stay as configured.

Must not import: consensus cores, storage, apps, the codec. Runs under trio.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from phalanx.consensus.types import LocalProtocolError, NodeId
from phalanx.net.conn_gate import ConnectionGate, max_peer_pending, max_peer_sockets
from phalanx.net.framing import InboundBudget
from phalanx.net.transport_types import PeerAddress

logger = logging.getLogger("phalanx.net.transport")



class DynamicPeers:
    """Run-time peer set changes of `Transport` (see the module docstring)."""

    node_id: NodeId
    _peers: dict[NodeId, PeerAddress]
    _queues: dict[
        NodeId, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]]
    _queued: dict[NodeId, int]
    _send_capacity: int
    _max_frame_size: int
    _inbound_scopes: dict[NodeId, trio.CancelScope]
    _redial: dict[NodeId, trio.Event]
    _held: dict[NodeId, list[bytes]]
    _held_bytes: dict[NodeId, int]
    gate: ConnectionGate
    budget: InboundBudget
    _nursery: trio.Nursery | None
    _link_scopes: dict[NodeId, trio.CancelScope]
    peers_added: int
    peers_removed: int

    if TYPE_CHECKING:
        async def run_peer_link(self, dst: NodeId) -> None:
            """Dial and serve the link to `dst` (provided by `PeerDialer`)."""

    def knows(self, dst: NodeId) -> bool:
        """Whether `dst` is a peer now (frames may be sent to it)."""
        return dst in self._peers

    def start_links(self, nursery: trio.Nursery) -> None:
        """Start a link task per peer in `nursery`, where `add_peer` starts later ones."""
        self._nursery = nursery
        for peer in list(self._peers):
            self._start_link(peer)

    def _start_link(self, dst: NodeId) -> None:
        nursery = self._nursery
        if nursery is None:
            return
        scope = trio.CancelScope()
        self._link_scopes[dst] = scope
        nursery.start_soon(self._link_task, dst, scope, self._queues[dst])

    async def _link_task(self, dst: NodeId, scope: trio.CancelScope,
                         queue: tuple[trio.MemorySendChannel[bytes],
                                      trio.MemoryReceiveChannel[bytes]]) -> None:
        with scope:
            await self.run_peer_link(dst)
        if self._queues.get(dst) is queue:  # removed, and not back since: forget its queue
            del self._queues[dst]
            self._queued.pop(dst, None)

    def add_peer(self, node: NodeId, address: PeerAddress) -> bool:
        """Link to `node` at `address` from now on (and accept it); whether anything
        changed. A peer at a new address is relinked there.

        Raises:
            LocalProtocolError: `node` is this node.
        """
        if node == self.node_id:
            raise LocalProtocolError(f"a node cannot be its own peer ({node!r})")
        current = self._peers.get(node)
        if current == address:
            return False
        if current is not None:
            self.remove_peer(node)
        self._peers[node] = address
        self._peers = dict(sorted(self._peers.items()))
        self._queues[node] = trio.open_memory_channel[bytes](self._send_capacity)
        self._queued[node] = 0
        self._resize()
        self.peers_added += 1
        logger.info("%s: peer %s added at %s", self.node_id, node, address)
        self._start_link(node)
        return True

    def remove_peer(self, node: NodeId) -> bool:
        """Stop linking to `node` and accepting it; whether it was a peer."""
        if self._peers.pop(node, None) is None:
            return False
        self._held.pop(node, None)
        self._held_bytes.pop(node, None)
        scope = self._link_scopes.pop(node, None)
        if scope is not None:
            scope.cancel()  # its task forgets the queue once it has ended
        else:
            self._queues.pop(node, None)
            self._queued.pop(node, None)
        inbound = self._inbound_scopes.get(node)
        if inbound is not None:
            inbound.cancel()
        self._redial.pop(node, None)
        self._resize()
        self.peers_removed += 1
        logger.info("%s: peer %s removed", self.node_id, node)
        return True

    def _resize(self) -> None:
        n = len(self._peers)
        self.gate.max_connections = max_peer_sockets(n)
        self.gate.max_pending = max_peer_pending(n)
        self.budget.limit = max(1, n) * self._max_frame_size

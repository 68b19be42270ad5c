"""A running node's peer links follow the membership its core knows (issue 21: adding a
node to a running cluster without restarts).

Owns: `PeerLinks`: the address book (the node config's peers, plus the addresses that
configurations carry, `Configuration.addresses`, written there by `member add`), `sync`
(the transport's peer set brought in step with a configuration: members with a known
address linked, nodes that left since this node saw them as members unlinked), `send`
(the driver's send: a message to a node that is no peer now is dropped and counted, never
raised: the core may address a member before its link exists) and `watch` (polls the
driver's status and syncs on every configuration change).

Rules:
    * A node this node has never seen as a member stays linked if its config names it (a
      new node runs before it is added); only a node that was a member and is no longer
      one is unlinked. A configuration that comes back (a truncated log) relinks it.
    * An address that does not parse is ignored and counted (`bad_addresses`): it came
      from the log, which a faulty operator may have filled.
    * This node never links to itself; linked clusters' nodes are not touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

import trio

from phalanx.consensus.core import CoreStatus
from phalanx.consensus.types import Configuration, Message, NodeId, address_map
from phalanx.net.transport import Transport
from phalanx.net.transport_types import PeerAddress

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.05
"""How often `watch` looks at the core's configuration (the driver refreshes its status
per tick)."""


def parse_address(text: str) -> PeerAddress | None:
    """``host:port`` as a `PeerAddress`, or None when it is not one."""
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return PeerAddress(host=host.strip("[]"), port=int(port))


class PeerLinks:
    """Keeps `transport`'s peer set in step with the membership (module docstring)."""

    def __init__(self, node_id: NodeId, transport: Transport,
                 configured: Mapping[NodeId, PeerAddress]) -> None:
        self.node_id = node_id
        self._transport = transport
        self._known: dict[NodeId, PeerAddress] = dict(configured)
        self._seen: set[NodeId] = set()
        self._last: Configuration | None = None
        self.unknown_peer_drops = 0
        """Messages for a node that is no peer now (not linked yet, or removed)."""
        self.bad_addresses = 0

    def send(self, dst: NodeId, message: Message) -> bool:
        """The driver's send: `Transport.send_nowait`, or False (counted) for a non-peer."""
        if self._transport.knows(dst):
            return self._transport.send_nowait(dst, message)
        self.unknown_peer_drops += 1
        return False

    def peers(self) -> tuple[str, ...]:
        """This cluster's peers linked now (what `phalanx status` lists), sorted."""
        return tuple(sorted(str(n) for n in self._known if self._transport.knows(n)))

    def sync(self, config: Configuration | None) -> None:
        """Bring the peer set in step with `config` (no-op when it did not change)."""
        if config is None or config == self._last:
            return
        self._last = config
        for node, text in address_map(config.addresses).items():
            address = parse_address(text)
            if address is None:
                self.bad_addresses += 1
                logger.warning("%s: ignoring bad peer address %r of %s in the configuration",
                               self.node_id, text, node)
                continue
            if node != self.node_id:
                self._known[NodeId(node)] = address
        members = set(config.members())
        self._seen |= members
        gone = self._seen - members
        for node in sorted(self._known):
            if node in gone:
                if self._transport.remove_peer(node):
                    logger.info("%s: %s left the membership: link dropped", self.node_id, node)
            elif self._transport.add_peer(node, self._known[node]):
                logger.info("%s: linking to %s at %s (membership)", self.node_id, node,
                            self._known[node])

    async def watch(self, status: Callable[[], CoreStatus]) -> None:
        """Sync on every configuration change the core reports, until cancelled."""
        while True:
            self.sync(getattr(status(), "config", None))
            await trio.sleep(POLL_SECONDS)

"""The accepting half of `phalanx.net.transport.Transport`: the listener and the reading tasks.

Owns: `PeerAcceptor` (a base class of `Transport`, which provides the state declared here):
`serve_peer_listener` accepts peer connections within the inbound limits
(`phalanx.net.conn_gate`), runs the TLS handshake under a timeout, admits the peer named by
its verified certificate (our cluster's peers, or a linked cluster's node:
`phalanx.net.intercluster.LinkedPeers.admit`), replaces an older connection from the same
peer, cuts the dialer's backoff to that peer short, sends the `WELCOME` frame and then only
reads: frames decoded with the injected codec and delivered as ``(src, message)`` (to
`inbound` or the `deliver` callback). Also `WELCOME`.

Rules (the module docstring of `phalanx.net.transport` has the connection model): peer bytes
never raise here: a refused peer, a malformed or oversized frame or a stream ending inside a
frame closes only that connection, logged and counted; after the welcome the acceptor never
writes. Must not import: consensus cores, storage, apps, the codec (it is injected).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence

import trio

from phalanx.consensus.types import NodeId
from phalanx.net.conn_gate import ConnectionGate
from phalanx.net.framing import (
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    InboundBudget,
    encode_frame,
)
from phalanx.net.intercluster import LinkedPeers
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport_dial import RECEIVE_CHUNK, _describe
from phalanx.net.transport_types import PeerAddress, TransportCounters
from phalanx.ops.pki import node_id_from_peercert

logger = logging.getLogger("phalanx.net.transport")

WELCOME = encode_frame(b"")
"""The acceptor's single write: an empty frame meaning "authenticated, go ahead"."""


def _remote(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except OSError:
        return "<unknown>"
    return f"{host}:{port}"


class PeerAcceptor:
    """The listener and reading tasks of `Transport` (see the module docstring)."""

    node_id: NodeId
    _peers: dict[NodeId, PeerAddress]
    _server_context: ssl.SSLContext
    _handshake_timeout: float
    _counters: TransportCounters
    _linked_peers: LinkedPeers
    _decode: Callable[[bytes], object]
    _decode_error: type[Exception]
    _max_frame_size: int
    _inbound_send: trio.MemorySendChannel[tuple[NodeId, object]]
    _inbound_scopes: dict[NodeId, trio.CancelScope]
    _redial: dict[NodeId, trio.Event]
    _deliver: Callable[[NodeId, object], Awaitable[None]] | None
    _after_read: Callable[[], None] | None
    gate: ConnectionGate
    budget: InboundBudget
    intercluster_refused: int

    # ----------------------------------------------------------------------------------------
    # Accepting

    async def serve_peer_listener(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[Sequence[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept peer connections on `listeners` forever (until cancelled).

        Calls ``task_status.started(listeners)`` once accepting.
        """
        await trio.serve_listeners(
            self._handle_inbound, list(listeners), task_status=task_status
        )

    def _refuse(self, remote: str, reason: str) -> None:
        self._counters.connections_refused += 1
        logger.warning("%s: refused peer connection from %s: %s", self.node_id, remote, reason)

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        if not self.gate.try_open():  # full: close before any TLS work
            stream.socket.close()
            return
        try:
            remote = _remote(stream)
            tls = TlsStream(stream, self._server_context, server_side=True)
            try:
                await self._serve_inbound(tls, remote)
            finally:
                await trio.aclose_forcefully(tls)
        finally:
            self.gate.closed()

    async def _serve_inbound(self, tls: TlsStream, remote: str) -> None:
        with self.gate.handshaking() as pending, \
                trio.move_on_after(self._handshake_timeout) as timeout:
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                self._refuse(remote, f"TLS handshake failed ({_describe(exc)})")
                return
        if pending.cancelled_caught:
            self._refuse(remote, "handshake shed: too many unauthenticated connections")
            return
        if timeout.cancelled_caught:
            self._refuse(remote, f"TLS handshake timed out after {self._handshake_timeout}s")
            return
        src = node_id_from_peercert(tls.getpeercert())
        if src is None:
            self._refuse(remote, "certificate names no phalanx node")
            return
        admitted, problem = self._linked_peers.admit(src, tls.getpeercert_der(), self._peers)
        if admitted is None:
            self._refuse(remote, problem)
            return
        src = admitted
        redial = self._redial.pop(src, None)
        if redial is not None:
            redial.set()
            self._counters.early_redials += 1
        with trio.CancelScope() as scope:
            previous = self._inbound_scopes.get(src)
            self._inbound_scopes[src] = scope
            if previous is not None:
                previous.cancel()
                self._counters.connections_replaced += 1
                logger.info("%s: new connection from %s replaces the older one", self.node_id, src)
            try:
                self._counters.connections_accepted += 1
                logger.info("%s: accepted peer %s from %s", self.node_id, src, remote)
                await self._receive_loop(tls, src)
            finally:
                if self._inbound_scopes.get(src) is scope:
                    del self._inbound_scopes[src]

    async def _receive_loop(self, tls: TlsStream, src: NodeId) -> None:
        c = self._counters
        deliver, after_read = self._deliver, self._after_read
        foreign, allowed = src in self._linked_peers.foreign, self._linked_peers.allowed
        decoder = FrameDecoder(max_frame_size=self._max_frame_size, budget=self.budget)
        try:
            await tls.send_all(WELCOME)
            while True:
                data = await tls.receive_some(RECEIVE_CHUNK)
                if not data:
                    decoder.eof()
                    logger.info("%s: peer %s closed its connection", self.node_id, src)
                    return
                c.bytes_in += len(data)
                decoder.feed(data)
                while (payload := decoder.next_frame()) is not None:
                    try:
                        message = self._decode(payload)
                    except self._decode_error as exc:
                        c.malformed_frames += 1
                        logger.warning(
                            "%s: closing connection from %s: malformed frame (%s)",
                            self.node_id,
                            src,
                            exc,
                        )
                        return
                    c.frames_in += 1
                    if foreign and not allowed(message):
                        self.intercluster_refused += 1
                        continue
                    if deliver is None:
                        await self._inbound_send.send((src, message))
                    else:
                        await deliver(src, message)
                if after_read is not None:
                    after_read()
        except FrameTooLarge as exc:
            c.oversized_frames += 1
            logger.warning("%s: closing connection from %s: %s", self.node_id, src, exc)
        except FrameError as exc:
            c.malformed_frames += 1
            logger.warning(
                "%s: closing connection from %s: malformed frame (%s)", self.node_id, src, exc
            )
        except trio.BrokenResourceError as exc:
            logger.info("%s: connection from %s lost (%s)", self.node_id, src, _describe(exc))
        finally:
            if after_read is not None:  # messages delivered before a bad frame
                after_read()
            decoder.release()

    def _close_inbound(self) -> None:
        self._inbound_send.close()

"""The dialing half of `phalanx.net.transport.Transport`: one link task per peer.

Owns: `PeerDialer` (a base class of `Transport`, which provides the state declared here):
`run_peer_link` dials a peer (TCP, TLS, the server's node id checked against the one meant,
then the acceptor's welcome), drains the peer's send queue into the link until it breaks
(`_pump`, coalescing queued frames into one write), and redials with a jittered backoff
that an inbound connection from the peer cuts short. Also `open_tcp_stream_to_other`
(refuses a TCP self-connection) and `_describe` (log text for a broken stream).

See `phalanx.net.transport` for the connection model, the welcome, direct writes and the
queues. Must not import: consensus cores, storage, apps, the codec.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Mapping

import trio

from phalanx.consensus.types import LocalProtocolError, NodeId
from phalanx.net.framing import FrameDecoder, FrameError
from phalanx.net.intercluster import qualify, split_qualified
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport_types import Backoff, PeerAddress, TransportCounters
from phalanx.ops.pki import node_id_from_peercert

logger = logging.getLogger("phalanx.net.transport")

RECEIVE_CHUNK = 64 * 1024
"""Bytes requested per `receive_some`."""

SEND_BATCH_BYTES = 256 * 1024
"""A dialer coalesces queued frames into one write up to about this many bytes."""


class _DialFailed(Exception):
    """A dial attempt did not yield an authenticated, welcomed link."""


class _LinkClosed(Exception):
    """An established outbound link ended."""


async def open_tcp_stream_to_other(host: str, port: int) -> trio.SocketStream:
    """`trio.open_tcp_stream`, refusing a connection to itself with `OSError`.

    When nothing listens on a port inside the kernel's ephemeral range, a dial can be handed
    that very port as its source and TCP's simultaneous open connects the socket to itself;
    the socket would then hold the port a restarting node needs (see `phalanx.ops.ports`).
    """
    tcp = await trio.open_tcp_stream(host, port)
    if tcp.socket.getsockname() == tcp.socket.getpeername():
        await trio.aclose_forcefully(tcp)
        raise OSError(f"connection to {host}:{port} reached itself (nothing listens there)")
    return tcp


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, trio.BrokenResourceError) and cause is not None:
        exc = cause
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__




class PeerDialer:
    """The link tasks of `Transport` (see the module docstring)."""

    node_id: NodeId
    _peers: dict[NodeId, PeerAddress]
    _client_context: ssl.SSLContext
    _dial_contexts: dict[NodeId, ssl.SSLContext]
    """Linked clusters' nodes (qualified ids): the context that trusts THEIR CA only."""
    _handshake_timeout: float
    _backoff: Backoff
    _rng: random.Random
    _counters: TransportCounters
    _queues: Mapping[
        NodeId, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]]
    _redial: dict[NodeId, trio.Event]
    _linked: set[NodeId]
    _links: dict[NodeId, TlsStream]
    _queued: dict[NodeId, int]

    # ----------------------------------------------------------------------------------------
    # Dialing

    async def run_peer_link(self, dst: NodeId) -> None:
        """Keep a link to `dst` up and drain its send queue into it, forever (until cancelled)."""
        if dst not in self._queues:
            raise LocalProtocolError(f"{dst!r} is not a configured peer of {self.node_id!r}")
        attempt = 0
        mine = self._queues[dst]  # (a peer removed and added again gets a new queue)
        while True:
            address = self._peers[dst]
            try:
                tls = await self._dial(dst, address)
            except _DialFailed as exc:
                self._counters.dial_failures += 1
                delay = self._backoff.delay(attempt, self._rng)
                logger.info(
                    "%s: dial %s at %s failed (%s); retry %d in %.3fs",
                    self.node_id,
                    dst,
                    address,
                    exc,
                    attempt + 1,
                    delay,
                )
                attempt += 1
                if await self._sleep_or_redial(dst, delay):
                    attempt = 0
                continue
            attempt = 0
            self._counters.outbound_established += 1
            logger.info("%s: link to %s at %s established", self.node_id, dst, address)
            self._linked.add(dst)
            self._links[dst] = tls
            try:
                await self._pump(dst, tls)
            except _LinkClosed as exc:
                logger.info("%s: link to %s closed (%s)", self.node_id, dst, exc)
            finally:
                self._linked.discard(dst)
                self._links.pop(dst, None)
                if self._queues.get(dst) is mine:
                    self._queued[dst] = mine[1].statistics().current_buffer_used
                await trio.aclose_forcefully(tls)
            await self._sleep_or_redial(dst, self._backoff.delay(attempt, self._rng))

    async def _sleep_or_redial(self, dst: NodeId, delay: float) -> bool:
        """Sleep `delay` seconds, or less if `dst` connects to us meanwhile (then True)."""
        event = trio.Event()
        self._redial[dst] = event
        with trio.move_on_after(delay):
            await event.wait()
        if self._redial.get(dst) is event:
            del self._redial[dst]
        return event.is_set()

    async def _dial(
        self, dst: NodeId, address: PeerAddress
    ) -> TlsStream:
        with trio.move_on_after(self._handshake_timeout):
            try:
                tcp = await open_tcp_stream_to_other(address.host, address.port)
            except OSError as exc:
                raise _DialFailed(_describe(exc)) from None
            context = self._dial_contexts.get(dst, self._client_context)
            tls = TlsStream(tcp, context, server_hostname=None)
            try:
                await self._handshake_and_welcome(dst, address, tls)
            except BaseException:
                await trio.aclose_forcefully(tls)
                raise
            return tls
        raise _DialFailed(f"no welcome within {self._handshake_timeout}s")

    async def _handshake_and_welcome(
        self, dst: NodeId, address: PeerAddress, tls: TlsStream
    ) -> None:
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            raise _DialFailed(f"TLS handshake failed ({_describe(exc)})") from None
        named = node_id_from_peercert(tls.getpeercert())
        if named is not None and dst in self._dial_contexts:  # only its cluster's CA verified it
            named = qualify(named, split_qualified(dst)[1] or "")
        if named != dst:
            self._counters.outbound_refused += 1
            reason = f"server at {address} is {named!r}, expected {dst!r}"
            logger.warning("%s: refused link: %s", self.node_id, reason)
            raise _DialFailed(reason)
        decoder = FrameDecoder(max_frame_size=1)
        while True:
            try:
                data = await tls.receive_some(RECEIVE_CHUNK)
            except trio.BrokenResourceError as exc:
                raise _DialFailed(f"refused by {dst} ({_describe(exc)})") from None
            if not data:
                raise _DialFailed(f"{dst} closed the connection before welcoming us")
            self._counters.bytes_in += len(data)
            try:
                decoder.feed(data)
                welcome = decoder.next_frame()
            except FrameError as exc:
                raise _DialFailed(f"bad welcome from {dst} ({exc})") from None
            if welcome is None:
                continue
            if welcome or decoder.buffered:
                raise _DialFailed(f"bad welcome from {dst} (unexpected bytes)")
            return

    async def _pump(self, dst: NodeId, tls: TlsStream) -> None:
        """Write queued frames to `dst` until the link breaks; raises `_LinkClosed`."""
        mine = self._queues[dst]
        queue = mine[1]
        reason: list[str] = []
        in_flight = 0  # frames taken off the queue and not yet known to be written
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                # The acceptor writes nothing after the welcome: EOF, an error or any byte
                # ends the link.
                try:
                    data = await tls.receive_some(RECEIVE_CHUNK)
                except trio.BrokenResourceError as exc:
                    reason.append(_describe(exc))
                else:
                    reason.append("unexpected bytes from acceptor" if data else "peer closed")
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            while True:
                frame = await queue.receive()
                batch, size = [frame], len(frame)
                while size < SEND_BATCH_BYTES:
                    try:
                        frame = queue.receive_nowait()
                    except trio.WouldBlock:
                        break
                    batch.append(frame)
                    size += len(frame)
                in_flight = len(batch)
                try:
                    await tls.send_all(b"".join(batch))
                except trio.BrokenResourceError as exc:
                    reason.append(_describe(exc))
                    nursery.cancel_scope.cancel()
                    break
                in_flight = 0
                if self._queues.get(dst) is mine:
                    self._queued[dst] -= len(batch)
                self._counters.frames_out += len(batch) - batch.count(b"")  # not wake-ups
                self._counters.bytes_out += size
        self._counters.frames_lost += in_flight
        raise _LinkClosed(reason[0] if reason else "cancelled")

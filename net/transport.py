"""Authenticated replica-to-replica transport: TCP + mutual TLS + length-prefixed frames, on trio.

This module owns the peer links of one node: a listener that accepts authenticated peers and
delivers their messages, and one reconnecting dialer task per peer that drains a bounded
send queue. It knows nothing about consensus; messages are opaque objects turned into bytes
by an injected `encode`/`decode` pair (normally `phalanx.net.codec`).

Connection model (one direction per TCP connection):
- Every node dials every peer for its *own* outbound messages and receives only on the
  connections it accepted. A pair of nodes therefore has two connections, each used one way;
  there is no tie-breaking between simultaneous dials and no shared state between directions.
- Acceptor: TLS handshake (cluster CA, client certificate REQUIRED), then the node id is read
  from the verified certificate (`phalanx.ops.pki.node_id_from_peercert`). A peer with no
  certificate, a certificate from another CA, a certificate naming no node (e.g. a client
  certificate) or naming a node outside the configured peer set is refused: logged with the
  reason, counted in `connections_refused`, connection closed. An accepted peer is sent one
  empty frame (the *welcome*); after that the acceptor never writes again. A newer
  connection from the same node replaces (closes) the older one, so one peer cannot pile up
  connections.
- Dialer: TCP connect, TLS handshake, check that the server's certificate names exactly the
  node we meant to reach (else refused, logged, counted in `outbound_refused`), then wait for
  the welcome before taking anything off the send queue. Under TLS 1.3 the client finishes
  its handshake before the server has judged the client certificate; the welcome is how the
  dialer learns it was accepted, so no frame is ever written into a connection that is
  about to be refused. After the welcome, any byte from the acceptor is a protocol violation.
- Reconnect: after a failed dial or a lost connection the dialer sleeps
  `Backoff.delay(attempt, rng)` (jittered exponential, injectable rng/base/cap) and retries
  forever; `attempt` resets after a welcome. An authenticated inbound connection from the
  peer is proof it is up again (a restart): it cuts the dialer's sleep short and resets
  `attempt`, so a restarted node is redialled at once, not after a grown backoff.

Code: this module owns `Transport` (construction, the send side: queues, direct and held
writes, statistics) and running it (`open_peer_transport`, `run_peer_transport`); its bases
own the rest: `phalanx.net.transport_accept.PeerAcceptor` (listener, handshake, admission,
reading tasks), `phalanx.net.transport_dial.PeerDialer` (link tasks) and
`phalanx.net.transport_peers.DynamicPeers` (run-time peer set).

Peer set: fixed at construction, changed at run time by `add_peer`/`remove_peer`
(`phalanx.net.transport_peers`: a node that joined or left the membership).

Connection state: `connected_peers()` names the peers whose outbound link is established
(welcomed, not yet broken): the peers this node can send to right now. It is what an operator
means by "connected" (`phalanx status`); it does not depend on the peer having sent anything
(two Raft followers never message each other, yet each keeps a live link to the other).

Delivery guarantees: best effort, FIFO per link while a connection lasts. Frames dequeued into
a connection that then breaks are lost (counted in `frames_lost`); consensus cores retransmit.

Direct writes: while a peer's link is up and nothing is queued for it, `send_nowait` writes
the frame from the caller's task (`TlsStream.try_send`), with no hand-off to the link task;
if the socket takes only part of it, the link task writes the rest before anything queued
after it (`has_backlog` is True until then). Otherwise frames go through the queue below.

Holding (`hold_sends`): `send_nowait` holds the frames it would write directly, per peer,
until the owner calls `flush` (the driver does at the end of each pass over its input and
before it blocks): then each peer's held frames leave in ONE TLS write (one record, one
`send` syscall) instead of one per frame. A peer's held frames are written at once when they
reach `SEND_BATCH_BYTES`. Frames that must queue (the link is down, or frames already wait
for the link task) go to the queue as without holding; the link task coalesces those. A
flush that finds the socket busy queues the held frames (their `send_nowait` already said
True, so a full queue drops them there, counted in `queue_full_drops`); held frames count
in `has_backlog`. Short of `SEND_BATCH_BYTES`, a held frame waits for `flush`, so the owner
bounds how long it waits (the driver: one pass).

Send queues: one bounded queue of encoded frames per peer. `send_nowait` REFUSES THE NEWEST
frame when the queue is full (returns False, counted in `queue_full_drops`): the caller learns
of the backpressure immediately and older, already-accepted messages keep their order.
`send` waits for room instead. While a peer's link is down its queue takes at most
`down_queue_capacity` frames (refusals counted in `down_drops`): a few messages queued at
start or across a short redial still arrive, but a long partition does not pile up a backlog
of stale messages that would all be delivered, decoded and answered when the link returns
(the consensus cores retransmit what still matters).

Inbound: ``(src, message)`` pairs, src the authenticated node id, into a bounded trio memory
channel (`Transport.inbound`). When the consumer is slow the reading tasks block, and TCP flow
control pushes back on the senders.

Linked clusters (`phalanx.net.intercluster`): their nodes are extra peers ``<node>@<cluster>``
whose CA signed their certificate; from them only inter-cluster messages are delivered (the
rest dropped, counted in `intercluster_refused`); an unlinked cluster's node fails the TLS
handshake.

Inbound limits (`phalanx.net.conn_gate`): at most ``2 * len(peers) + PEER_SLACK`` sockets
open on the peer port (more are closed at once, before TLS; a replaced connection may linger
a moment beside its successor) and at most ``len(peers) + PEER_SLACK`` still unauthenticated
(a newer one sheds the oldest handshake; an authenticated peer link is never shed for a
newcomer). The frame decoders of all peer links share an `InboundBudget` of
``len(peers) * max_frame_size`` bytes: the structural bound (one inbound link per peer),
made explicit.

Peer input is normal input: a malformed frame (codec `decode_error`, or a stream that ends
inside a frame) or an oversized frame closes only that connection, logged and counted; the
node keeps serving everyone else. Nothing here `assert`s on peer bytes.

Must not import: consensus cores, storage, apps, the codec (it is injected). Runs under trio
with real sockets and the real clock (handshake timeouts, backoff sleeps); the deterministic
simulator never runs this module.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from phalanx.consensus.types import LocalProtocolError, Message, NodeId
from phalanx.net.conn_gate import ConnectionGate, max_peer_pending, max_peer_sockets
from phalanx.net.framing import DEFAULT_MAX_FRAME_SIZE, InboundBudget, encode_frame
from phalanx.net.intercluster import Intercluster, LinkedPeers
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport_accept import WELCOME, PeerAcceptor
from phalanx.net.transport_dial import (
    RECEIVE_CHUNK,
    SEND_BATCH_BYTES,
    PeerDialer,
    open_tcp_stream_to_other,
)
from phalanx.net.transport_peers import DynamicPeers
from phalanx.net.transport_types import (
    Backoff,
    PeerAddress,
    TransportCounters,
    TransportStatistics,
)

__all__ = ["RECEIVE_CHUNK", "SEND_BATCH_BYTES", "WELCOME", "Backoff", "PeerAddress", "Transport",
           "TransportStatistics", "open_peer_transport", "open_tcp_stream_to_other",
           "run_peer_transport"]


class Transport(PeerAcceptor, PeerDialer, DynamicPeers):
    """The peer links of node `node_id`. Usually created by `open_peer_transport`.

    Args:
        node_id: this node.
        peers: every other replica and where its listener is. Must not contain `node_id`.
        server_context: `phalanx.ops.pki.peer_server_context` (client certificates required).
        client_context: `phalanx.ops.pki.peer_client_context`.
        encode, decode, decode_error: the codec. `decode` must raise only `decode_error` on
            bad bytes; anything else it raises is a codec bug and propagates.
        max_frame_size: the largest payload sent or accepted.
        send_queue_capacity: frames queued per peer before `send_nowait` refuses.
        down_queue_capacity: frames queued per peer while its link is down before
            `send_nowait` refuses (at most `send_queue_capacity`).
        inbound_capacity: messages buffered for the consumer of `inbound`.
        backoff, rng: reconnect delays (`rng` is only used for jitter).
        handshake_timeout: seconds allowed for TCP connect + TLS handshake + welcome.
        deliver: where the reading tasks hand each ``(src, message)`` (awaited: a slow
            consumer blocks them, as a full `inbound` channel would). None: into `inbound`.
            Delivering straight to the consumer saves a task hop per message. Also settable
            with `set_deliver` before the transport runs, as is `after_read`.
        after_read: called after the messages of each read were delivered (`set_deliver`).
        hold_sends: hold the frames `send_nowait` would write directly until `flush`, so a
            peer's frames of one pass leave in one write (see the module docstring). The
            owner must call `flush` before it blocks or yields.
        intercluster: linked clusters' nodes and what they may send (their CAs are added
            to `server_context`); None: our cluster only.
    """

    def __init__(
        self,
        *,
        node_id: NodeId,
        peers: Mapping[NodeId, PeerAddress],
        server_context: ssl.SSLContext,
        client_context: ssl.SSLContext,
        encode: Callable[[Any], bytes],
        decode: Callable[[bytes], object],
        decode_error: type[Exception],
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        send_queue_capacity: int = 1024,
        down_queue_capacity: int = 64,
        inbound_capacity: int = 1024,
        backoff: Backoff | None = None,
        rng: random.Random,
        handshake_timeout: float = 10.0,
        deliver: Callable[[NodeId, object], Awaitable[None]] | None = None,
        after_read: Callable[[], None] | None = None,
        hold_sends: bool = False,
        intercluster: Intercluster | None = None,
    ) -> None:
        self._linked_peers = LinkedPeers(intercluster, server_context, peers)
        self._dial_contexts = self._linked_peers.dial_contexts
        self.intercluster_refused = 0
        """Messages from a linked cluster's node that the inter-cluster path does not carry."""
        peers = {**peers, **self._linked_peers.peers}
        if node_id in peers:
            raise ValueError(f"peers must not contain this node ({node_id!r})")
        if send_queue_capacity < 1 or inbound_capacity < 1 or down_queue_capacity < 1:
            raise ValueError("send_queue_capacity, down_queue_capacity and inbound_capacity "
                             "must be >= 1")
        self._send_capacity = send_queue_capacity
        self._down_capacity = min(down_queue_capacity, send_queue_capacity)
        if not server_context.verify_mode == ssl.CERT_REQUIRED:
            raise ValueError("server_context must require client certificates (CERT_REQUIRED)")
        if not client_context.verify_mode == ssl.CERT_REQUIRED:
            raise ValueError("client_context must verify the server (CERT_REQUIRED)")
        self.node_id = node_id
        # Sorted so that task start order and statistics never depend on the caller's dict.
        self._peers = dict(sorted(peers.items()))
        self._server_context = server_context
        self._client_context = client_context
        self._encode = encode
        self._decode = decode
        self._decode_error = decode_error
        self._max_frame_size = max_frame_size
        self._backoff = backoff if backoff is not None else Backoff()
        self._rng = rng
        self._handshake_timeout = handshake_timeout
        self._counters = TransportCounters()
        self.gate = ConnectionGate(max_connections=max_peer_sockets(len(peers)),
                                   max_pending=max_peer_pending(len(peers)))
        """Inbound socket limits (see the module docstring)."""
        self.budget = InboundBudget(max(1, len(peers)) * max_frame_size)
        self._queues: dict[
            NodeId, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]
        ] = {
            peer: trio.open_memory_channel[bytes](send_queue_capacity) for peer in self._peers
        }
        self._inbound_send, self.inbound = trio.open_memory_channel[tuple[NodeId, object]](
            inbound_capacity
        )
        """Authenticated ``(src, message)`` pairs, in per-connection arrival order."""
        self._inbound_scopes: dict[NodeId, trio.CancelScope] = {}
        self._redial: dict[NodeId, trio.Event] = {}
        """Set by an authenticated inbound connection from the peer: redial it now."""
        self._linked: set[NodeId] = set()
        """Peers whose outbound link is established (welcomed and not yet broken)."""
        self._deliver = deliver
        self._after_read = after_read
        self._running = False
        self._nursery: trio.Nursery | None = None
        self._link_scopes: dict[NodeId, trio.CancelScope] = {}
        self.peers_added = self.peers_removed = 0
        """Run-time peer set changes (`add_peer`, `remove_peer`)."""
        self._links: dict[NodeId, TlsStream] = {}
        """The established outbound streams (as `_linked`), for direct writes."""
        self._queued: dict[NodeId, int] = dict.fromkeys(self._peers, 0)
        """Frames put on a peer's queue and not yet written (or lost) by its link task:
        while any are, new frames queue behind them instead of being written directly."""
        self._hold = hold_sends
        self._held: dict[NodeId, list[bytes]] = {}
        """Frames held for `flush` (`hold_sends`), per peer, in send order."""
        self._held_bytes: dict[NodeId, int] = {}
        self._last_message: object = None
        self._last_frame = b""
        """The last protocol message framed and its frame: a broadcast (an equal message to
        every peer, e.g. AppendEntries to followers at the same index) is encoded once.
        Only `Message`s (frozen dataclasses of immutable fields) are reused this way."""

    def set_deliver(self, deliver: Callable[[NodeId, object], Awaitable[None]], *,
                    after_read: Callable[[], None] | None = None) -> None:
        """Hand inbound messages to `deliver` instead of `inbound` (see `__init__`), and
        call `after_read` (if given) after the messages of each read were delivered,
        before the reading task waits for the next read (and when its connection ends):
        `deliver` may then leave work for it that must be done before the task yields
        (`phalanx.runtime.driver_inline`: a pass stepped in the reading task).

        Raises:
            LocalProtocolError: the transport is already running (messages may already be
                queued in `inbound`; switching now could reorder a link's messages).
        """
        if self._running:
            raise LocalProtocolError("set_deliver after the transport started")
        self._deliver = deliver
        self._after_read = after_read

    @property
    def peers(self) -> Mapping[NodeId, PeerAddress]:
        return dict(self._peers)

    # ----------------------------------------------------------------------------------------
    # Sending

    def _frame(self, dst: NodeId, message: object) -> bytes:
        if dst not in self._peers:
            raise LocalProtocolError(f"{dst!r} is not a configured peer of {self.node_id!r}")
        if not isinstance(message, Message):  # maybe mutable: never reuse its bytes
            return encode_frame(self._encode(message), max_frame_size=self._max_frame_size)
        last = self._last_message
        if message is last or (type(message) is type(last) and message == last):
            return self._last_frame  # the same message to another peer: same bytes
        frame = encode_frame(self._encode(message), max_frame_size=self._max_frame_size)
        self._last_message, self._last_frame = message, frame
        return frame

    def send_nowait(self, dst: NodeId, message: object) -> bool:
        """Queue `message` for `dst` without blocking.

        Returns:
            True if queued; False if `dst`'s queue is full (the message is refused, counted in
            `queue_full_drops`, and the queue is left unchanged), or if `dst`'s link is down
            and `down_queue_capacity` frames are already queued (counted in `down_drops`).

        Raises:
            LocalProtocolError: `dst` is not a configured peer.
            ValueError: the encoded message exceeds `max_frame_size`.
            Whatever `encode` raises for a message it cannot encode (`EncodeError` from
            `phalanx.net.codec`): encoding happens here, at the call site, never in a link task.
        """
        frame = self._frame(dst, message)
        if self._hold:
            held = self._held.get(dst)
            if held is None and dst in self._links and not self._queued[dst]:
                self._held[dst] = [frame]
                self._held_bytes[dst] = len(frame)
                return True
            if held is not None:
                held.append(frame)
                size = self._held_bytes[dst] = self._held_bytes[dst] + len(frame)
                if size >= SEND_BATCH_BYTES:
                    self._write_held(dst, self._held.pop(dst))
                return True
        elif self._write_direct(dst, frame, 1):
            return True
        queue = self._queues[dst][0]
        if dst not in self._linked and self._down_capacity < self._send_capacity:
            used = queue.statistics().current_buffer_used
            if self._down_capacity <= used < self._send_capacity:
                self._counters.down_drops += 1
                return False
        try:
            queue.send_nowait(frame)
        except trio.WouldBlock:
            self._counters.queue_full_drops += 1
            return False
        self._queued[dst] += 1
        return True

    def _write_direct(self, dst: NodeId, data: bytes, frames: int) -> bool:
        """Write `frames` frames (`data`) to `dst` from the caller's task, in one TLS write,
        if its link is up and nothing waits for the link task; False: nothing done."""
        link = self._links.get(dst)
        if link is None or self._queued[dst] or not link.try_send(data):
            return False
        # Written from the caller's task: no hand-off to the link task, and the frames are
        # on their way before the caller blocks (e.g. on an fsync).
        c = self._counters
        c.frames_out += frames
        c.bytes_out += len(data)
        c.direct_writes += frames
        c.direct_write_calls += 1
        if link.backlogged:  # the socket took part of it: the link task writes the rest
            self._queues[dst][0].send_nowait(b"")  # (room: the queue is empty)
            self._queued[dst] += 1
        return True

    def _write_held(self, dst: NodeId, frames: list[bytes]) -> None:
        self._held_bytes.pop(dst, None)
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        if self._write_direct(dst, data, len(frames)):
            return
        # The link went down, or its task is writing: queue them, in order.
        queue = self._queues[dst][0]
        for frame in frames:
            try:
                queue.send_nowait(frame)
            except trio.WouldBlock:
                self._counters.queue_full_drops += 1
                continue
            self._queued[dst] += 1

    def flush(self) -> None:
        """Write the frames held since the last flush (`hold_sends`): one TLS write per
        peer. Never blocks; a no-op when nothing is held."""
        if self._held:
            held, self._held = self._held, {}
            for dst, frames in held.items():
                self._write_held(dst, frames)

    async def send(self, dst: NodeId, message: object) -> None:
        """Queue `message` for `dst`, waiting while the queue is full (backpressure)."""
        frame = self._frame(dst, message)
        await self._queues[dst][0].send(frame)
        self._queued[dst] += 1

    def has_backlog(self) -> bool:
        """Whether some frame handed to `send_nowait`/`send` is not written yet (it waits
        for its link task, or for its link to come up)."""
        return bool(self._held) or any(self._queued.values())

    def connected_peers(self) -> tuple[NodeId, ...]:
        """The peers whose outbound link is up right now (welcomed, not broken), sorted."""
        return tuple(sorted(self._linked))

    def statistics(self) -> TransportStatistics:
        c = self._counters
        queued = sum(
            send.statistics().current_buffer_used for send, _ in self._queues.values()
        )
        return TransportStatistics(
            bytes_in=c.bytes_in,
            bytes_out=c.bytes_out,
            frames_in=c.frames_in,
            frames_out=c.frames_out,
            connections_accepted=c.connections_accepted,
            connections_refused=c.connections_refused,
            connections_replaced=c.connections_replaced,
            outbound_established=c.outbound_established,
            outbound_refused=c.outbound_refused,
            dial_failures=c.dial_failures,
            malformed_frames=c.malformed_frames,
            oversized_frames=c.oversized_frames,
            queue_full_drops=c.queue_full_drops,
            frames_lost=c.frames_lost,
            queued_frames=queued,
            early_redials=c.early_redials,
            down_drops=c.down_drops,
            direct_writes=c.direct_writes,
            direct_write_calls=c.direct_write_calls,
            connections_shed=self.gate.stats.shed_full + self.gate.stats.shed_pending,
        )


@asynccontextmanager
async def open_peer_transport(
    *, listeners: Sequence[trio.SocketListener], **config: Any
) -> AsyncIterator[Transport]:
    """Run a `Transport` (its listener and one link task per peer) for the `async with` body.

    `config` is passed to `Transport`. On exit every connection is closed and `inbound` ends.

    Example::

        listeners = await trio.open_tcp_listeners(port, host=host)
        async with open_peer_transport(listeners=listeners, node_id=..., ...) as transport:
            transport.send_nowait(NodeId("n2"), message)
            async for src, message in transport.inbound:
                ...
    """
    async with run_peer_transport(Transport(**config), listeners=listeners) as transport:
        yield transport


@asynccontextmanager
async def run_peer_transport(
    transport: Transport, *, listeners: Sequence[trio.SocketListener]
) -> AsyncIterator[Transport]:
    """Run an already built `transport` (its listener and link tasks) for the `async with`
    body, as `open_peer_transport` does: for a caller that must wire the transport into its
    consumer (`Transport.set_deliver`) before any message can arrive."""
    if transport._running:
        raise LocalProtocolError("the transport is already running")
    transport._running = True
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(transport.serve_peer_listener, listeners)
            transport.start_links(nursery)
            try:
                yield transport
            finally:
                nursery.cancel_scope.cancel()
    finally:
        transport._close_inbound()

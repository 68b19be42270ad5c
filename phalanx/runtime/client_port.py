"""The client port of a node: TLS connections speaking `phalanx.net.client_protocol`.

Owns: `ClientPort` (accepts TLS connections, server-authenticated, client certificates
REQUIRED unless the node runs with ``[client] auth = "none"``) and one `_Connection` per
client: a reader that decodes frames into `ClientCall`/`StatusCall` and hands them to the
driver (a `ServiceCall` to the node's services, `ServiceSink`), and a writer that sends the
replies back, coalescing whatever is ready into one write. Replies may be out of order
(pipelining).

Authentication and authorization (`phalanx.runtime.client_auth`): a connection without a valid
cluster-CA client certificate fails the handshake (`handshake_failures`); one whose
certificate names no client (a node's certificate, an unknown role) is closed right after it
(`unauthenticated`). Every call is checked against the connection's `Principal` before it
reaches the driver: a call for a session the client does not own, or a write from a
read-only client, is answered `ReplyStatus.FORBIDDEN` here (`forbidden_calls`), and a
`ClientHello` for another client's session is not subscribed (`forbidden_subscriptions`).
With ``require_client_auth=False`` (insecure mode) nothing is checked.

Limits and errors (client input is normal input, never asserted on):
- A connection has at most `max_in_flight` unanswered calls; the reader stops reading while
  it is at the limit, so TCP flow control pushes back on a client that outruns the node.
- Subscriptions (`ClientHello`, PBFT clients): when the sink is a `SubscribingSink`, a
  connection may subscribe to the answers for up to `MAX_SUBSCRIPTIONS` client ids; the
  node then sends it the answers to requests it executes but was not asked here
  (`phalanx.runtime.waiters`). Those hold no call slot; at most `max_in_flight` of them wait
  unwritten per connection, and more are dropped and counted (`unasked_dropped`): a client
  that does not read them retransmits. The hello is answered with
  `ClientHelloReply(subscribed=...)`, False when the sink cannot route such answers.
- Resource limits (`phalanx.net.conn_gate`, `phalanx.net.framing`): at most
  `max_connections` sockets open (more are closed at once, before TLS), at most
  `max_handshakes` of them still handshaking (a newer one sheds the oldest), handshakes
  started at most `handshake_rate` per second (burst `handshake_burst`), and their crypto
  runs in one worker thread (`TlsStream.do_handshake(offload=...)`), so a handshake flood
  cannot starve the event loop that also serves the peers. A request frame may be at
  most `max_frame_size` bytes (the node derives it from the application's largest legal
  command, `client_frame_limit`); the partial frames of all connections together buffer at
  most `buffer_budget` bytes beyond 128 KiB each (`InboundBudget`): a connection whose
  partial frame does not fit is closed (`budget_closes`). Replies may be larger
  (`max_reply_size`).
- A malformed frame, an oversized frame, an undecodable payload or a message that is not a
  call closes THAT connection with a logged reason (counted in `ClientPortStatistics`); the
  node keeps serving everyone else. A connection that closes drops its waiters in the driver
  (the client retries with the same ids).

Must not import: consensus cores, storage, apps. The driver is reached through the small
`CallSink` protocol.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import trio

from phalanx.net import wire
from phalanx.net.client_protocol import (
    ClientCall,
    ClientHello,
    ClientHelloReply,
    ClientReply,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.net.codec import DecodeError
from phalanx.net.conn_gate import ConnectionGate
from phalanx.net.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    BudgetExceeded,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    InboundBudget,
    encode_frame,
)
from phalanx.net.tls_stream import TlsStream
from phalanx.ops.admin_messages import AdminCall, AdminReply
from phalanx.ops.ops_messages import BackupCall, OpsCall, OpsReply, ReloadCall
from phalanx.ops.ops_messages import refusal as ops_refusal
from phalanx.runtime.client_auth import Principal, owns_client_id, principal_from_peercert, refusal
from phalanx.services.messages import ServiceCall, ServiceReply

logger = logging.getLogger(__name__)

RECEIVE_CHUNK = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0
MAX_SUBSCRIPTIONS = 16
"""Client ids one connection may subscribe to (one per client is the norm)."""

REQUEST_ENVELOPE_BYTES = 4096
"""Room for a `ClientCall`'s envelope around its command (client id of at most 128 bytes,
numbers, msgpack headers), with margin."""
DEFAULT_MAX_REQUEST_FRAME = 4 * 1024 * 1024
"""The request frame limit when the application declares no `max_command_bytes`."""
DEFAULT_MAX_CONNECTIONS = 512
"""Client sockets open at once (the node lowers it to fit its descriptor limit)."""
DEFAULT_MAX_HANDSHAKES = 64
"""Client connections still in their TLS handshake at once (a newer one sheds the oldest)."""
DEFAULT_HANDSHAKE_RATE = 200.0
DEFAULT_HANDSHAKE_BURST = 4
"""Client TLS handshakes started per second, and in a burst. Their crypto (~0.5 ms a step,
~2 ms to verify a client certificate) runs in one worker thread, not on the event loop, so
a flood costs the loop only the dispatch; the rate bounds that thread's share of the CPU."""
DEFAULT_BUFFER_BUDGET = 64 * 1024 * 1024
LOG_LINES_PER_SECOND = 5
"""Failed or refused client handshakes logged one by one per second (`QuietLog`)."""
"""Bytes of partial request frames all client connections may buffer beyond 128 KiB each."""


def client_frame_limit(max_command_bytes: int | None) -> int:
    """The largest request frame worth reading: the application's largest legal command plus
    the request envelope (`DEFAULT_MAX_REQUEST_FRAME` without an `Admission` hook)."""
    if max_command_bytes is None:
        return DEFAULT_MAX_REQUEST_FRAME
    return max_command_bytes + REQUEST_ENVELOPE_BYTES


class QuietLog:
    """Logs at most `per_second` INFO lines a second; the others are counted, and the next
    line logged says how many were left out. A handshake flood (thousands of failures a
    second, each counted in the metrics) must not become as many log lines on the disk."""

    def __init__(self, log: logging.Logger, per_second: int = LOG_LINES_PER_SECOND) -> None:
        self._log = log
        self._per_second = per_second
        self._window = -math.inf
        self._lines = 0
        self.skipped = 0
        """Lines left out since the last one logged."""

    def info(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._lines = now, 0
        if self._lines >= self._per_second:
            self.skipped += 1
            return
        self._lines += 1
        if self.skipped:
            msg += " (and %d similar lines not logged)"
            args = (*args, self.skipped)
            self.skipped = 0
        self._log.info(msg, *args)


class CallSink(Protocol):
    """The driver as the client port sees it."""

    async def calls(self, calls: Sequence[ClientCall], target: _Connection) -> None: ...

    async def request_status(self, nonce: int, target: _Connection) -> None: ...

    def disconnected(self, target: _Connection) -> None: ...


class ServiceSink(Protocol):
    """The node's services as the client port sees them (`phalanx.runtime.services`):
    answers a `ServiceCall` at once, checking the caller's role; never raises."""

    def service_call(self, call: ServiceCall, principal: Principal | None) -> ServiceReply: ...


class AdminSink(Protocol):
    """Answers `AdminCall`s (`phalanx.runtime.admin_ops.AdminOps`)."""

    async def answer(self, call: AdminCall, principal: Principal | None) -> AdminReply: ...

    async def answer_ops(self, call: OpsCall, principal: Principal | None) -> OpsReply:
        """Backups and certificate reloads (`phalanx.runtime.operator_ops`)."""
        ...


@runtime_checkable
class SubscribingSink(CallSink, Protocol):
    """A sink that can route unasked answers (`ClientWaiters.subscribe`). `subscribe` is
    called from the connection's reader task and must not block."""

    def subscribe(self, client_id: str, target: _Connection) -> None: ...


@dataclass(slots=True)
class ClientPortStatistics:
    connections_accepted: int = 0
    connections_open: int = 0
    handshake_failures: int = 0
    malformed_frames: int = 0
    oversized_frames: int = 0
    unexpected_messages: int = 0
    calls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    direct_replies: int = 0
    """Replies written from the driver's task (no hand-off to the connection's writer)."""
    subscriptions: int = 0
    unasked_replies: int = 0
    """Answers sent to a subscribed connection that did not ask this node."""
    unasked_dropped: int = 0
    """Unasked answers dropped because too many waited unwritten on their connection."""
    unauthenticated: int = 0
    """Connections closed after the handshake: their certificate names no client."""
    forbidden_calls: int = 0
    """Calls answered FORBIDDEN (another client's session, or a role that does not allow it)."""
    forbidden_subscriptions: int = 0
    """`ClientHello`s for another client's session (not subscribed)."""
    budget_closes: int = 0
    """Connections closed because their partial frame did not fit the inbound budget."""


class _Connection:
    """One client connection; `deliver` is called by the driver's task and never blocks.

    Replies are encoded as they are delivered. With `ClientPort(batch_replies=True)` they
    gather until the port's `flush` (the driver calls it once per pass), so the replies of
    one pass leave in one write; otherwise each is flushed at once. A flush writes directly
    from the calling task when nothing is queued before it (`TlsStream.try_send`); else it
    queues the bytes for the connection's writer task, which keeps the order. An entry of
    the queue is (bytes, call slots their replies free, unasked replies in them);
    ``(b"", 0, 0)`` only asks the writer to write what a `try_send` left behind.

    A reply frees a call slot iff it answers a call read on this connection (`asked`, by
    (client_id, request_no), counted: a call repeated on one connection is answered per
    copy); an unasked answer (subscription) holds none.
    """

    def __init__(self, remote: str, max_in_flight: int, port: ClientPort) -> None:
        self.remote = remote
        self.closed = False
        self.slots = trio.Semaphore(max_in_flight)
        self.tls: TlsStream | None = None
        """Set once the handshake is done: replies may then be written directly."""
        self.queued = 0
        """Entries on the queue not yet written by the writer task."""
        self._port = port
        self.scope: trio.CancelScope | None = None
        """The connection's tasks (set while they run)."""
        self._frames: list[bytes] = []
        self._held = 0  # replies in `_frames` that free a call slot
        self._max_unasked = max_in_flight
        self.unasked = 0
        """Unasked answers delivered and not yet written."""
        self.asked: dict[tuple[str, int], int] = {}
        """Calls read here and not answered yet, by (client_id, request_no)."""
        self.subscribed: list[str] = []
        self.principal: Principal | None = None
        """The authenticated client (None only in the insecure mode)."""
        # Unbounded, but never holds more than `max_in_flight` slot-holding replies and
        # `max_in_flight` unasked ones (+ wake-ups).
        self.out_send, self.out_recv = trio.open_memory_channel[tuple[bytes, int, int]](
            math.inf)

    def deliver(self, reply: ClientReply | StatusReply | ClientHelloReply | ServiceReply
                | AdminReply | OpsReply
                ) -> None:
        if self.closed:
            return
        port = self._port
        held = True
        if isinstance(reply, ClientReply):
            key = (reply.client_id, reply.request_no)
            count = self.asked.get(key)
            if count is None:
                if self.unasked >= self._max_unasked:
                    port.stats.unasked_dropped += 1
                    return
                held = False
                self.unasked += 1
                port.stats.unasked_replies += 1
            elif count == 1:
                del self.asked[key]
            else:
                self.asked[key] = count - 1
        try:
            frame = encode_frame(wire.encode(reply), max_frame_size=port.max_reply_size)
        except ValueError as exc:  # a reply larger than max_frame_size: our own limit
            port._close(self, f"cannot send reply: {exc}")
            self.closed = True
            if self.scope is not None:
                self.scope.cancel()  # ends the reader and the writer: the connection closes
            return
        self._frames.append(frame)
        self._held += held
        if not port.batch_replies:
            self.flush()
        elif len(self._frames) == 1:
            port._dirty.append(self)

    def flush(self) -> None:
        frames, self._frames = self._frames, []
        held, self._held = self._held, 0
        if not frames or self.closed:
            return
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        port, tls = self._port, self.tls
        if tls is not None and not self.queued and tls.try_send(data):
            port.stats.bytes_out += len(data)
            port.stats.direct_replies += len(frames)
            self.written_replies(held, len(frames) - held)
            if tls.backlogged:  # the writer task writes the rest
                self._enqueue(b"", 0, 0)
            return
        self._enqueue(data, held, len(frames) - held)

    def written_replies(self, held: int, unasked: int) -> None:
        """Replies are on the wire: free their call slots and unasked room."""
        for _ in range(held):
            self.slots.release()
        self.unasked -= unasked

    def _enqueue(self, data: bytes, held: int, unasked: int) -> None:
        self.queued += 1
        self._port.queued_replies += 1
        self.out_send.send_nowait((data, held, unasked))

    def written(self, count: int) -> None:
        self.queued -= count
        self._port.queued_replies -= count


class ClientPort:
    """Serves client connections for one node (see the module docstring)."""

    def __init__(
        self,
        sink: CallSink,
        *,
        ssl_context: ssl.SSLContext,
        node_id: str,
        max_frame_size: int = DEFAULT_MAX_REQUEST_FRAME,
        max_reply_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = 1024,
        batch_replies: bool = False,
        require_client_auth: bool = True,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
        handshake_rate: float | None = DEFAULT_HANDSHAKE_RATE,
        handshake_burst: int = DEFAULT_HANDSHAKE_BURST,
        buffer_budget: int = DEFAULT_BUFFER_BUDGET,
        services: ServiceSink | None = None,
        admin: AdminSink | None = None,
    ) -> None:
        """`require_client_auth=False` is the insecure mode: pass a context that does not
        require client certificates (`phalanx.ops.pki.client_server_context`) with it.
        `services` answers `ServiceCall`s (none: each is answered ERROR); `admin` answers
        `AdminCall`s (`phalanx.runtime.admin_ops`; none: ERROR)."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if require_client_auth and ssl_context.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError("require_client_auth needs a context that requires client "
                             "certificates (CERT_REQUIRED)")
        self.require_client_auth = require_client_auth
        self._sink = sink
        self._services = services
        self._admin = admin
        self._context = ssl_context
        self._node_id = node_id
        self.max_frame_size = max_frame_size
        """The largest request frame read (a larger one closes its connection)."""
        self.max_reply_size = max_reply_size
        self.gate = ConnectionGate(max_connections=max_connections,
                                   max_pending=max_handshakes, handshake_rate=handshake_rate,
                                   handshake_burst=handshake_burst)
        self.budget = InboundBudget(buffer_budget)
        self._handshake_log = QuietLog(logger)
        self._handshake_thread = trio.CapacityLimiter(1)
        """Handshake crypto runs in one worker thread, off the event loop (`TlsStream`)."""
        self._max_in_flight = max_in_flight
        self.stats = ClientPortStatistics()
        self.batch_replies = batch_replies
        self.queued_replies = 0
        """Entries queued for writer tasks, over all connections."""
        self._dirty: list[_Connection] = []

    def flush(self) -> None:
        """Write (or queue) the replies delivered since the last flush, one write per
        connection (`batch_replies`)."""
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def has_backlog(self) -> bool:
        """Whether a reply handed to a connection is not written yet."""
        return self.queued_replies > 0 or bool(self._dirty)

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[Sequence[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept client connections on `listeners` until cancelled."""
        await trio.serve_listeners(self._handle, list(listeners), task_status=task_status)

    def _subscribe(self, client_id: str, conn: _Connection) -> bool:
        """Subscribe `conn` to `client_id`'s unasked answers; whether it is subscribed."""
        sink = self._sink
        if not isinstance(sink, SubscribingSink) or "#" in client_id or not client_id:
            return False  # (a lane id is covered by its client's subscription)
        if conn.principal is not None and not owns_client_id(conn.principal.name, client_id):
            self.stats.forbidden_subscriptions += 1
            return False
        if client_id not in conn.subscribed:
            if len(conn.subscribed) >= MAX_SUBSCRIPTIONS:
                return False
            conn.subscribed.append(client_id)
            self.stats.subscriptions += 1
        sink.subscribe(client_id, conn)
        return True

    def _close(self, conn: _Connection, reason: str) -> None:
        logger.warning("%s: closing client connection from %s: %s", self._node_id, conn.remote,
                       reason)

    async def _handle(self, stream: trio.SocketStream) -> None:
        gate = self.gate
        if not gate.try_open():  # full: close before any TLS work (counted in the gate)
            stream.socket.close()
            return
        try:
            await self._handle_open(stream)
        finally:
            gate.closed()

    async def _handle_open(self, stream: trio.SocketStream) -> None:
        try:
            host, port, *_ = stream.socket.getpeername()
            remote = f"{host}:{port}"
        except OSError:
            remote = "<unknown>"
        tls = TlsStream(stream, self._context, server_side=True)
        conn = _Connection(remote, self._max_in_flight, self)
        try:
            with self.gate.handshaking() as pending, \
                    trio.move_on_after(HANDSHAKE_TIMEOUT) as timeout:
                try:
                    await self.gate.wait_turn()
                    await tls.do_handshake(offload=self._handshake_thread)
                except trio.BrokenResourceError as exc:
                    self.stats.handshake_failures += 1
                    self._handshake_log.info("%s: client TLS handshake from %s failed: %s",
                                             self._node_id, remote, exc.__cause__ or exc)
                    return
            if pending.cancelled_caught or timeout.cancelled_caught:
                self.stats.handshake_failures += 1
                return
            if self.require_client_auth:
                conn.principal = principal_from_peercert(tls.getpeercert())
                if conn.principal is None:
                    self.stats.unauthenticated += 1
                    self._handshake_log.info("%s: refused client connection from %s: its "
                                             "certificate names no phalanx client",
                                             self._node_id, remote)
                    return
            conn.tls = tls
            self.stats.connections_accepted += 1
            self.stats.connections_open += 1
            try:
                async with trio.open_nursery() as nursery:
                    conn.scope = nursery.cancel_scope
                    nursery.start_soon(self._writer, tls, conn, nursery.cancel_scope)
                    await self._reader(tls, conn)
                    nursery.cancel_scope.cancel()
            finally:
                self.stats.connections_open -= 1
        finally:
            conn.closed = True
            conn.tls = None
            conn.written(conn.queued)  # whatever is still queued is dropped with it
            self._sink.disconnected(conn)
            await trio.aclose_forcefully(tls)

    async def _reader(self, tls: TlsStream, conn: _Connection) -> None:
        st = self.stats
        decoder = FrameDecoder(max_frame_size=self.max_frame_size, budget=self.budget)
        try:
            while True:
                data = await tls.receive_some(RECEIVE_CHUNK)
                if not data:
                    return
                st.bytes_in += len(data)
                decoder.feed(data)
                # The calls of one read go to the driver as one item (one core pass, one
                # proposal); a status call or a full connection hands over those before it.
                calls: list[ClientCall] = []
                while (payload := decoder.next_frame()) is not None:
                    try:
                        message = wire.decode(payload)
                    except DecodeError as exc:
                        st.malformed_frames += 1
                        self._close(conn, f"malformed message ({exc})")
                        return
                    if isinstance(message, ClientCall):
                        try:
                            conn.slots.acquire_nowait()
                        except trio.WouldBlock:
                            await self._sink.calls(calls, conn)
                            calls = []
                            await conn.slots.acquire()
                        st.calls += 1
                        request = message.request
                        key = (request.client_id, request.request_no)
                        conn.asked[key] = conn.asked.get(key, 0) + 1
                        if conn.principal is not None and (
                                why := refusal(conn.principal, request)) is not None:
                            st.forbidden_calls += 1
                            conn.deliver(ClientReply(
                                client_id=request.client_id, request_no=request.request_no,
                                status=ReplyStatus.FORBIDDEN, replica=self._node_id,
                                message=why))
                            conn.flush()
                            continue
                        calls.append(message)
                    elif isinstance(message, ClientHello):
                        await conn.slots.acquire()
                        conn.deliver(ClientHelloReply(
                            client_id=message.client_id,
                            subscribed=self._subscribe(message.client_id, conn)))
                        conn.flush()
                    elif isinstance(message, StatusCall):
                        await self._sink.calls(calls, conn)
                        calls = []
                        await conn.slots.acquire()
                        await self._sink.request_status(message.nonce, conn)
                    elif isinstance(message, ServiceCall):
                        await conn.slots.acquire()
                        conn.deliver(ServiceReply(
                            nonce=message.nonce, status=ReplyStatus.ERROR,
                            message="this node runs no services") if self._services is None
                            else self._services.service_call(message, conn.principal))
                        conn.flush()
                    elif isinstance(message, AdminCall):
                        await conn.slots.acquire()
                        conn.deliver(AdminReply(
                            nonce=message.nonce, status=ReplyStatus.ERROR,
                            message="this node answers no admin operations")
                            if self._admin is None
                            else await self._admin.answer(message, conn.principal))
                        conn.flush()
                    elif isinstance(message, (BackupCall, ReloadCall)):
                        await conn.slots.acquire()
                        conn.deliver(ops_refusal(message, self._node_id,
                                                 "this node answers no operator calls")
                                     if self._admin is None
                                     else await self._admin.answer_ops(message,
                                                                       conn.principal))
                        conn.flush()
                    else:
                        st.unexpected_messages += 1
                        self._close(conn, f"unexpected message {type(message).__name__}")
                        return
                await self._sink.calls(calls, conn)
        except FrameTooLarge as exc:
            st.oversized_frames += 1
            self._close(conn, str(exc))
        except BudgetExceeded as exc:
            st.budget_closes += 1
            self._close(conn, str(exc))
        except FrameError as exc:
            st.malformed_frames += 1
            self._close(conn, f"malformed frame ({exc})")
        except trio.BrokenResourceError:
            return
        finally:
            decoder.release()

    async def _writer(
        self,
        tls: TlsStream,
        conn: _Connection,
        scope: trio.CancelScope,
    ) -> None:
        recv = conn.out_recv
        try:
            while True:
                entries = [await recv.receive()]
                while True:
                    try:
                        entries.append(recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                data = b"".join(data for data, _, _ in entries)
                await tls.send_all(data)
                conn.written(len(entries))
                self.stats.bytes_out += len(data)
                conn.written_replies(sum(held for _, held, _ in entries),
                                     sum(unasked for _, _, unasked in entries))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()

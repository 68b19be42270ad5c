"""Client connections: one lazily dialled TLS connection per node and the replies it carries.

Owns: `ConnectionPool` (used by `phalanx.client.Client`), a node's `NodeSlot` (its connection
state and every call and status request waiting on it), a request's `PendingCall` (the inbox
the readers fill), `CallTimer` (ends a call's attempt wait at its time: one heap and one task
per client instead of a cancel scope per call) and `ClientStatistics` (the counters the
client and its pool share).

Connections. The first frame queued for a node starts one task in the client's nursery that
dials it (TCP with TCP_NODELAY, TLS 1.3, bounded by `dial_timeout`), checks that the server's
certificate names that node id (`pki.node_id_from_peercert`, unless `verify_node_ids` is off),
then runs a reader (frames -> replies, dispatched by request number to the waiting
`PendingCall`, status replies by nonce) and a writer (all queued frames coalesced into one
`send_all`). The frame of a call alone on its connection is written at once by the caller's
task (`TlsStream.try_send`) when nothing waits before it; the writer only finishes what the
socket did not take. Concurrent calls go through the writer, which coalesces them. Any
number of concurrent calls share it. When the connection or the dial fails, every call
waiting on that node is told at once (`LOST`), and the next frame dials again.

Subscriptions (PBFT): a pool made with a `hello` frame (`ClientHello`) writes it first on
every new connection; the node's `ClientHelloReply` sets the slot's `subscribed`. A call may
then be registered on a subscribed slot without being sent there (`register`): that node
answers it unasked once it executes it. A status reply to the slot's probe records the
primary the node names (`primary_claim`).

Invariant: every call or status request registered on a slot was sent, or is queued, on the
slot's current connection, or the connection is subscribed (a failed connection clears
them when it tells them, and clears `subscribed` and `primary_claim`).

Must not import: `phalanx.client.async_client` (which builds on this), consensus cores, storage, the
runtime. Never pickles. Not deterministic: real sockets, the real clock.
"""

from __future__ import annotations

import heapq
import math
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import trio

from phalanx.net import wire
from phalanx.net.client_protocol import ClientHelloReply, ClientReply, StatusReply
from phalanx.net.codec import DecodeError
from phalanx.net.framing import FrameDecoder, FrameError
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport import open_tcp_stream_to_other
from phalanx.ops import pki

NodeAddress = tuple[str, str, int]
"""``(node_id, host, port)`` of a node's client port."""

RECEIVE_CHUNK = 64 * 1024
_M = TypeVar("_M", ClientReply, StatusReply)


class PoolNotRunning(RuntimeError):
    """A frame was queued before the pool was given a nursery (our own misuse)."""


@dataclass(slots=True, kw_only=True)
class ClientStatistics:
    """Counters since the client opened (a snapshot: `Client.statistics()` copies them)."""

    calls: int = 0
    retries: int = 0
    patient_waits: int = 0
    """Attempt timeouts that kept waiting because the node was alive (heard from or probed)."""
    probes: int = 0
    """Status probes sent to a silent node with calls waiting on it."""
    redirects: int = 0
    timeouts: int = 0
    primary_only: int = 0
    """PBFT attempts sent to the primary alone (the backups answer unasked)."""
    connections_opened: int = 0
    connection_failures: int = 0
    replies_dropped: int = 0
    """Replies for no live call, for another client, or undecodable (connection closed)."""


LOST = None
"""A call's inbox item for "the connection to that node failed"."""


class PendingCall(Generic[_M]):
    """One request in flight: an inbox of (node, reply-or-LOST) filled by the readers."""

    __slots__ = ("_event", "client_id", "expired", "inbox", "request_no", "unsent_mark",
                 "until")

    def __init__(self, client_id: str, request_no: int) -> None:
        self.client_id = client_id
        self.request_no = request_no
        self.unsent_mark = -1
        """`ConnectionPool.unsent_mark` when the call began (-1: unknown, may have been sent)."""
        self.inbox: deque[tuple[str, _M | None]] = deque()
        self._event: trio.Event | None = None
        self.until = math.nan
        """The trio time the current `next_before` wait ends at (armed on `CallTimer`)."""
        self.expired = False
        """`until` passed (set by the `CallTimer`)."""

    def push(self, node: str, reply: _M | None) -> None:
        self.inbox.append((node, reply))
        if self._event is not None:
            self._event.set()

    async def next(self) -> tuple[str, _M | None]:
        if not self.inbox:
            self._event = trio.Event()
            await self._event.wait()
        return self.inbox.popleft()

    async def next_before(self, until: float, timer: CallTimer) -> tuple[str, _M | None] | None:
        """The next inbox item, or None when trio time `until` passed first (an item
        already in the inbox is returned even then, as `next` inside ``move_on_at`` would).

        The same as ``with trio.move_on_at(until): return await self.next()`` without a
        cancel scope per wait (~6 us each, and a deadline in trio's heap): `timer` wakes
        the call at `until` (`CallTimer`, one heap and one task per client)."""
        if self.inbox:
            return self.inbox.popleft()
        if self.until != until:
            self.until = until
            self.expired = False
            timer.arm(self, until)
        if self.expired:
            return None
        self._event = event = trio.Event()
        await event.wait()
        if self.inbox:
            return self.inbox.popleft()
        return None  # woken by the timer

    def expire(self, until: float) -> None:
        """`CallTimer`: the wait armed for `until` is over (a later wait's arm wins)."""
        if self.until == until:
            self.expired = True
            if self._event is not None:
                self._event.set()


class CallTimer:
    """Wakes `PendingCall`s whose `next_before` wait passed its time: a heap of (until,
    call) and one task (`run`, in the client's nursery) sleeping until the earliest.

    A call's attempt waits are armed at "now + attempt timeout", so arms come in nearly
    increasing order and an arm is one heap push; the task's sleep is shortened only when
    an arm is earlier than its current target. Entries of calls that ended, or re-armed,
    stay until their time and are then skipped (`PendingCall.expire` checks `until`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, PendingCall[Any]]] = []
        self._seq = 0
        self._target = math.inf
        self._scope: trio.CancelScope | None = None

    def arm(self, call: PendingCall[Any], until: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (until, self._seq, call))
        if until < self._target:
            self._target = until
            if self._scope is not None:
                self._scope.deadline = until

    async def run(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                until, _, call = heapq.heappop(heap)
                call.expire(until)
            self._target = heap[0][0] if heap else math.inf
            with trio.CancelScope(deadline=self._target) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None


class NodeSlot:
    """One node: its address, its connection (if any) and what waits on it."""

    __slots__ = ("calls", "connected", "host", "last_heard", "leads", "node_id", "outbox",
                 "port", "primary_claim", "probe_answered", "probe_nonce", "probe_sent",
                 "refused", "running", "statuses", "subscribed", "tls", "wake")

    def __init__(self, node_id: str, host: str, port: int) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.running = False  # a connection task exists (dialling or connected)
        self.connected = False
        self.refused = False
        """The last dial was refused (ECONNREFUSED: nothing listens); reset on a connect."""
        self.tls: TlsStream | None = None
        """The established connection (None while dialling or down): `queue` writes to it
        directly when nothing waits in `outbox`."""
        self.outbox: list[bytes] = []
        self.wake = trio.Event()
        # Invariant: every call/status here was sent (or queued) on the current connection.
        self.calls: dict[int, PendingCall[ClientReply]] = {}
        self.statuses: dict[int, PendingCall[StatusReply]] = {}
        self.last_heard = -math.inf  # trio time of the last bytes from the node
        self.probe_nonce: int | None = None  # a liveness probe in flight on this connection
        self.probe_sent = -math.inf
        self.leads: bool | None = None  # the answer to the newest probe: role == "leader"
        self.probe_answered = -math.inf
        self.subscribed = False  # the node accepted this connection's `ClientHello`
        self.primary_claim: str | None = None  # the primary the newest probe answer names


def normalise_nodes(nodes: Sequence[NodeAddress]) -> dict[str, NodeSlot]:
    """One slot per node, in the given order; raises ValueError on a bad or repeated id."""
    slots: dict[str, NodeSlot] = {}
    for entry in nodes:
        node_id, host, port = entry
        pki.validate_name(node_id)
        if node_id in slots:
            raise ValueError(f"node {node_id!r} listed twice")
        slots[node_id] = NodeSlot(node_id, host, int(port))
    if not slots:
        raise ValueError("a client needs at least one node")
    return slots


class ConnectionPool:
    """The connections of one client, one slot per node (see the module docstring).

    Args:
        nodes: the nodes' client ports.
        ssl_context: the client's TLS context.
        verify_node_ids: check that each node's certificate names its node id.
        dial_timeout: seconds allowed for TCP connect and TLS handshake.
        max_frame_size: the largest reply frame accepted.
        stats: the client's counters (the pool updates the connection ones).
        hello: a frame written first on every new connection (a PBFT client's
            `ClientHello`), or None.
    """

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        ssl_context: ssl.SSLContext,
        verify_node_ids: bool,
        dial_timeout: float,
        max_frame_size: int,
        stats: ClientStatistics,
        hello: bytes | None = None,
    ) -> None:
        self.slots = normalise_nodes(nodes)
        self._hello = hello
        self.nursery: trio.Nursery | None = None
        """Where connection tasks run; set by `open_client` before any frame is queued."""
        self._ssl_context = ssl_context
        self._verify_node_ids = verify_node_ids
        self._dial_timeout = dial_timeout
        self._max_frame_size = max_frame_size
        self._stats = stats

    def send(self, node: str, call: PendingCall[ClientReply], frame: bytes) -> None:
        """Register `call` on `node` (its reply is dispatched to it) and queue `frame`."""
        slot = self.slots[node]
        slot.calls[call.request_no] = call
        # Alone on the connection: write at once. With other calls in flight, more are likely
        # to come in this scheduler pass: the writer coalesces them into one write, which the
        # node reads as one batch (one proposal).
        self.queue(slot, frame, direct=len(slot.calls) == 1)

    def register(self, node: str, call: PendingCall[ClientReply]) -> None:
        """Register `call` on `node` without sending it there: the caller checked that the
        slot is connected and subscribed (the node answers it unasked)."""
        slot = self.slots[node]
        if not (slot.connected and slot.subscribed):
            raise ValueError(f"register on {node}, which is not subscribed")  # our misuse
        slot.calls[call.request_no] = call

    def queue(self, slot: NodeSlot, frame: bytes, *, direct: bool = True) -> None:
        """Write `frame` to `slot`'s connection now if `direct` and nothing is queued before
        it (saves a wake-up of the writer task), else queue it, dialling if none is running.

        Order: a direct write (`TlsStream.try_send`) happens only while the outbox is empty
        and the stream has nothing pending or being written; otherwise the frame joins the
        outbox behind everything else. What the socket did not take stays in the stream's
        backlog, which the writer task finishes (and a socket error surfaces there).
        """
        tls = slot.tls
        if direct and tls is not None and not slot.outbox and tls.try_send(frame):
            if tls.backlogged:
                slot.wake.set()
            return
        slot.outbox.append(frame)
        slot.wake.set()
        if not slot.running:
            self._start(slot)

    def _start(self, slot: NodeSlot) -> None:
        if self.nursery is None:
            raise PoolNotRunning("use open_client(...) to run a Client")
        if self._hello is not None:
            slot.outbox.insert(0, self._hello)
            slot.wake.set()
        slot.running = True
        self.nursery.start_soon(self._run_connection, slot, name=f"client:{slot.node_id}")

    def unsent_mark(self) -> int:
        """A mark for a call about to start: the connections opened so far, or -1 when some
        connection is open (a request could go out on it at once)."""
        if any(slot.connected for slot in self.slots.values()):
            return -1
        return self._stats.connections_opened

    def nothing_sent(self, call: PendingCall[Any]) -> bool:
        """True when `call` can never have reached a node: no connection was open when it
        began, none opened since, and every node's last dial was refused."""
        return (call.unsent_mark >= 0
                and self._stats.connections_opened == call.unsent_mark
                and all(slot.refused for slot in self.slots.values()))

    def refusals(self) -> str:
        """``n1 (127.0.0.1:7001), ...``: the nodes and addresses that refused."""
        return ", ".join(f"{s.node_id} ({s.host}:{s.port})" for s in self.slots.values()
                         if s.refused)

    def forget(self, request_no: int) -> None:
        """Unregister the call numbered `request_no` from every node (it ended)."""
        for slot in self.slots.values():
            slot.calls.pop(request_no, None)

    def fail_all(self) -> None:
        """Tell everything waiting on any node that its connection is gone (client closed)."""
        for slot in self.slots.values():
            self.fail(slot)

    def fail(self, slot: NodeSlot) -> None:
        """Tell everything waiting on `slot` that its connection is gone."""
        slot.outbox.clear()
        slot.probe_nonce = None
        slot.leads = None
        slot.subscribed = False
        slot.primary_claim = None
        calls, statuses = slot.calls, slot.statuses
        slot.calls, slot.statuses = {}, {}
        for call in calls.values():
            call.push(slot.node_id, LOST)
        for waiter in statuses.values():
            waiter.push(slot.node_id, LOST)

    async def _dial(self, slot: NodeSlot) -> TlsStream:
        tcp = await open_tcp_stream_to_other(slot.host, slot.port)  # sets TCP_NODELAY
        hostname = slot.host if self._ssl_context.check_hostname else None
        tls = TlsStream(tcp, self._ssl_context, server_hostname=hostname)
        try:
            await tls.do_handshake()
            if self._verify_node_ids:
                named = pki.node_id_from_peercert(tls.getpeercert())
                if named != slot.node_id:
                    raise ssl.SSLError(f"{slot.host}:{slot.port} presented node {named!r}, "
                                       f"expected {slot.node_id!r}")
        except BaseException:
            await trio.aclose_forcefully(tls)
            raise
        return tls

    async def _run_connection(self, slot: NodeSlot) -> None:
        tls: TlsStream | None = None
        try:
            with trio.move_on_after(self._dial_timeout):
                tls = await self._dial(slot)
        except (OSError, ssl.SSLError, trio.BrokenResourceError) as e:
            tls = None
            slot.refused = _refused(e)
        if tls is None:
            self._stats.connection_failures += 1
            slot.running = False
            self.fail(slot)
            return
        self._stats.connections_opened += 1
        slot.connected = True
        slot.refused = False
        try:
            slot.tls = tls
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop, slot, tls, nursery.cancel_scope)
                await self._read_loop(slot, tls)
                nursery.cancel_scope.cancel()
        finally:
            # Fail before awaiting the close, so no call is queued onto a dying connection.
            slot.tls = None
            slot.running = slot.connected = False
            self.fail(slot)
            await trio.aclose_forcefully(tls)

    async def _write_loop(
        self, slot: NodeSlot, tls: TlsStream, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                if not slot.outbox:
                    if tls.backlogged:  # the rest of a direct write (`queue`)
                        await tls.send_all(b"")
                        continue
                    slot.wake = trio.Event()
                    await slot.wake.wait()
                    continue
                batch, slot.outbox = slot.outbox, []
                await tls.send_all(batch[0] if len(batch) == 1 else b"".join(batch))
        except (OSError, ssl.SSLError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._stats.connection_failures += 1
            scope.cancel()

    async def _read_loop(self, slot: NodeSlot, tls: TlsStream) -> None:
        """Dispatch replies until EOF or a broken/garbled stream (which ends the connection)."""
        decoder = FrameDecoder(max_frame_size=self._max_frame_size)
        node = slot.node_id
        try:
            while True:
                data = await tls.receive_some(RECEIVE_CHUNK)
                if not data:
                    return
                slot.last_heard = trio.current_time()
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    message = wire.decode(frame)
                    if isinstance(message, StatusReply) and message.nonce == slot.probe_nonce:
                        slot.probe_nonce = None  # alive (last_heard is already fresh)
                        slot.leads = message.role == "leader"
                        slot.primary_claim = message.leader
                        slot.probe_answered = slot.last_heard
                        continue
                    if isinstance(message, ClientHelloReply):
                        slot.subscribed = message.subscribed
                        continue
                    if isinstance(message, ClientReply):
                        call = slot.calls.get(message.request_no)
                        if call is not None and call.client_id == message.client_id:
                            call.push(node, message)
                            continue
                    elif isinstance(message, StatusReply):
                        waiter = slot.statuses.get(message.nonce)
                        if waiter is not None:
                            waiter.push(node, message)
                            continue
                    self._stats.replies_dropped += 1
        except (DecodeError, FrameError):
            self._stats.replies_dropped += 1
            self._stats.connection_failures += 1
        except (OSError, ssl.SSLError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._stats.connection_failures += 1


def _refused(exc: BaseException) -> bool:
    """Whether a dial failed because the address refused it (ECONNREFUSED), looking through
    trio's "all attempts to connect failed" group."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return all(_refused(e) for e in cause.exceptions)
    return False

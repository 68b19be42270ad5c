"""In-test fake nodes for the client tests: real trio TLS servers speaking the client protocol.

A `FakeNode` serves `phalanx.net.client_protocol` on 127.0.0.1 with a real `phalanx.ops.pki`
node certificate. What it answers is decided by its `behaviour` (swappable at any time);
`KvBackend` is a real `KvStateMachine` behind the replica layer's session rule, shared by the
fake nodes of one fake cluster, so tests can check exactly-once application.

A node answers a `ClientHello` with `subscribable` (False by default, like a node whose
driver cannot route unasked answers); a subscribed node can `push` an unasked reply to the
connection that subscribed, as a PBFT backup answers a request it executed from a
pre-prepare. `primary` is what its status names as the primary (`StatusReply.leader`).
"""

from __future__ import annotations

import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from phalanx.apps.kv import KvStateMachine
from phalanx.client.async_client import Client, open_client
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import (
    ClientCall,
    ClientHello,
    ClientHelloReply,
    ClientReply,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.net.framing import FrameDecoder, encode_frame
from phalanx.net.transport import Backoff
from phalanx.ops import pki

client_protocol.register()

HOST = "127.0.0.1"
GUARD = 20  # seconds: a hang guard only
FAST = Backoff(base=0.005, cap=0.02)


@dataclass
class Certs:
    ca: Path
    nodes: dict[str, pki.CredentialPaths]
    client: pki.CredentialPaths

    def client_context(self) -> ssl.SSLContext:
        return pki.client_context(
            self.ca,
            certificate=self.client.certificate,
            private_key=self.client.private_key,
            check_hostname=False,
        )


def make_certs(root: Path, names: tuple[str, ...]) -> Certs:
    ca = pki.create_ca()
    paths = pki.write_ca(ca, root / "ca")
    nodes = {n: pki.write_credentials(pki.issue_node_cert(ca, n), root / "nodes") for n in names}
    client = pki.write_credentials(pki.issue_client_cert(ca, "tester"), root / "clients")
    return Certs(ca=paths.certificate, nodes=nodes, client=client)


class Drop:
    """Behaviour result: close the connection without replying."""


class Silent:
    """Behaviour result: never reply (the request is swallowed)."""


Action = ClientReply | Drop | Silent | bytes
"""A reply, a connection drop, silence, or raw bytes written as one frame (garbage)."""
Behaviour = Callable[["FakeNode", ClientCall], Awaitable[Action]]


@dataclass
class KvBackend:
    """A real KV state machine behind the replica layer's session rule (see apps/replica.py)."""

    machine: KvStateMachine = field(default_factory=KvStateMachine)
    sessions: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    applied: list[tuple[str, int]] = field(default_factory=list)
    expired: list[tuple[str, int]] = field(default_factory=list)

    def execute(self, call: ClientCall) -> bytes | None:
        """The result, or None for an expired request number."""
        request = call.request
        if request.read_only:
            return self.machine.query(request.command)
        last = self.sessions.get(request.client_id)
        if last is not None and request.request_no == last[0]:
            return last[1]
        if last is not None and request.request_no < last[0]:
            self.expired.append((request.client_id, request.request_no))
            return None
        result = self.machine.apply(request.command)
        self.sessions[request.client_id] = (request.request_no, result)
        self.applied.append((request.client_id, request.request_no))
        return result


def reply(
    node: FakeNode,
    call: ClientCall,
    status: ReplyStatus,
    *,
    result: bytes = b"",
    leader_hint: str | None = None,
    message: str = "",
    replica: str | None = None,
) -> ClientReply:
    return ClientReply(
        client_id=call.request.client_id,
        request_no=call.request.request_no,
        status=status,
        replica=node.node_id if replica is None else replica,
        result=result,
        leader_hint=leader_hint,
        message=message,
    )


async def serve_kv(node: FakeNode, call: ClientCall) -> Action:
    """Behaviour of a healthy leader over `node.backend`."""
    if node.backend is None:
        raise RuntimeError("serve_kv needs a backend")
    result = node.backend.execute(call)
    if result is None:
        return reply(node, call, ReplyStatus.ERROR, message="expired")
    return reply(node, call, ReplyStatus.OK, result=result)


def redirect_to(leader: str | None) -> Behaviour:
    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.REDIRECT, leader_hint=leader)

    return behaviour


@dataclass
class FakeNode:
    node_id: str
    server_context: ssl.SSLContext
    behaviour: Behaviour
    backend: KvBackend | None = None
    port: int = 0
    received: list[ClientCall] = field(default_factory=list)
    connections: int = 0
    statuses: int = 0
    role: str = "follower"
    """What this node's `StatusReply` says it is (the client's liveness probe reads it)."""
    primary: str | None = None
    subscribable: bool = False
    hellos: list[str] = field(default_factory=list)
    subscriber: tuple[trio.SSLStream[trio.SocketStream], trio.Lock] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_ssl_over_tcp_listeners(0, self.server_context, host=HOST)
        self.port = listeners[0].transport_listener.socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self.connections += 1
        decoder = FrameDecoder()
        send_lock = trio.Lock()
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        nursery.cancel_scope.cancel()
                        return
                    decoder.feed(data)
                    while (frame := decoder.next_frame()) is not None:
                        message = wire.decode(frame)
                        if isinstance(message, ClientHello):
                            self.hellos.append(message.client_id)
                            if self.subscribable:
                                self.subscriber = (stream, send_lock)
                            answer = ClientHelloReply(client_id=message.client_id,
                                                      subscribed=self.subscribable)
                            async with send_lock:
                                await stream.send_all(encode_frame(wire.encode(answer)))
                            continue
                        if isinstance(message, StatusCall):
                            self.statuses += 1
                            async with send_lock:
                                await stream.send_all(
                                    encode_frame(wire.encode(self.status(message)))
                                )
                            continue
                        if not isinstance(message, ClientCall):
                            raise TypeError(f"unexpected {message!r}")
                        self.received.append(message)
                        nursery.start_soon(self._answer, stream, send_lock, message,
                                           nursery.cancel_scope)
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(
        self,
        stream: trio.SSLStream[trio.SocketStream],
        lock: trio.Lock,
        call: ClientCall,
        scope: trio.CancelScope,
    ) -> None:
        action = await self.behaviour(self, call)
        if isinstance(action, Silent):
            return
        if isinstance(action, Drop):
            scope.cancel()
            return
        payload = action if isinstance(action, bytes) else wire.encode(action)
        async with lock:
            try:
                await stream.send_all(encode_frame(payload))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                scope.cancel()

    def status(self, call: StatusCall) -> StatusReply:
        return StatusReply(
            nonce=call.nonce, node=self.node_id, protocol="raft", role=self.role, term=7,
            leader=self.primary, commit_index=3, applied_index=3, last_checkpoint=0, peers=(),
        )

    async def push(self, reply: ClientReply) -> bool:
        """Send `reply` unasked to the subscribed connection; False if there is none."""
        if self.subscriber is None:
            return False
        stream, lock = self.subscriber
        async with lock:
            try:
                await stream.send_all(encode_frame(wire.encode(reply)))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
        return True

    def request_ids(self) -> list[tuple[str, int]]:
        return [(c.request.client_id, c.request.request_no) for c in self.received]


async def start_nodes(
    nursery: trio.Nursery, certs: Certs, behaviours: Mapping[str, Behaviour],
    backend: KvBackend | None = None, *, cert_of: dict[str, str] | None = None,
) -> dict[str, FakeNode]:
    """Start one fake node per entry; `cert_of` lets a node present another node's cert."""
    nodes: dict[str, FakeNode] = {}
    for name, behaviour in behaviours.items():
        cert = certs.nodes[(cert_of or {}).get(name, name)]
        node = FakeNode(
            node_id=name,
            server_context=pki.client_server_context(cert),
            behaviour=behaviour,
            backend=backend,
        )
        await nursery.start(node.serve)
        nodes[name] = node
    return nodes


def addresses(nodes: dict[str, FakeNode]) -> list[tuple[str, str, int]]:
    return [(name, HOST, node.port) for name, node in nodes.items()]


@asynccontextmanager
async def cluster(
    certs: Certs,
    behaviours: Mapping[str, Behaviour],
    backend: KvBackend | None = None,
    *,
    cert_of: dict[str, str] | None = None,
    **options: object,
) -> AsyncIterator[tuple[Client, dict[str, FakeNode]]]:
    """Fake nodes and a client of them (fast backoff, 3 s timeout, 0.5 s attempts)."""
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nodes = await start_nodes(nursery, certs, behaviours, backend, cert_of=cert_of)
            kwargs: dict[str, object] = {
                "ssl_context": certs.client_context(), "timeout": 3.0,
                "attempt_timeout": 0.5, "backoff": FAST, "rng": random.Random(7),
            }
            kwargs.update(options)
            async with open_client(addresses(nodes), **kwargs) as client:  # type: ignore[arg-type]
                yield client, nodes
            nursery.cancel_scope.cancel()

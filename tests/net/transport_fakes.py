"""Shared pieces of the transport tests (tests/net/test_transport*.py): two real nodes over
loopback TCP + mutual TLS, hand-driven raw peers, and `LogWaiter`, which lets a trio test wait
for the transport's log record of what it did. The fixtures (`creds`, `logs`) are in
`conftest.py`."""


from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio
import trio.testing

from phalanx.consensus.types import (
    NodeId,
)
from phalanx.net.transport import (
    WELCOME,
    Backoff,
    PeerAddress,
    Transport,
    open_peer_transport,
)
from phalanx.ops import pki

HOST = "127.0.0.1"
GUARD = 15  # seconds: a hang guard only
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
MAX_FRAME = 4096


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def decode(data: bytes) -> object:
    result: object = json.loads(data)
    return result


class LogWaiter(logging.Handler):
    """Collects transport log records and lets a trio test wait for one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def messages(self, needle: str) -> list[str]:
        return [r.getMessage() for r in self.records if needle in r.getMessage()]

    async def wait_for(self, needle: str, count: int = 1) -> list[str]:
        with trio.fail_after(GUARD):
            while len(found := self.messages(needle)) < count:
                await self._changed.wait()
        return found


async def listen(port: int = 0) -> list[trio.SocketListener]:
    return await trio.open_tcp_listeners(port, host=HOST)


def address(listeners: list[trio.SocketListener]) -> PeerAddress:
    return PeerAddress(host=HOST, port=listeners[0].socket.getsockname()[1])


def node(
    creds: dict[str, pki.CredentialPaths],
    name: NodeId,
    listeners: list[trio.SocketListener],
    peers: dict[NodeId, PeerAddress],
    **overrides: Any,
) -> AbstractAsyncContextManager[Transport]:
    config: dict[str, Any] = {
        "node_id": name,
        "peers": {p: a for p, a in peers.items() if p != name},
        "server_context": pki.peer_server_context(creds[name]),
        "client_context": pki.peer_client_context(creds[name]),
        "encode": encode,
        "decode": decode,
        "decode_error": ValueError,
        "max_frame_size": MAX_FRAME,
        "rng": random.Random(7),
        "backoff": Backoff(base=0.005, cap=0.05),
    }
    config.update(overrides)
    return open_peer_transport(listeners=listeners, **config)


async def receive(transport: Transport) -> tuple[NodeId, object]:
    with trio.fail_after(GUARD):
        return await transport.inbound.receive()


@asynccontextmanager
async def raw_peer(
    creds: dict[str, pki.CredentialPaths], who: str | None, target: PeerAddress
) -> AsyncIterator[trio.SSLStream[trio.SocketStream]]:
    """A hand-driven TLS connection presenting `who`'s certificate (None: no certificate)."""
    if who is None:
        context = pki.client_context(creds["n1"].ca_certificate, check_hostname=False)
    else:
        context = pki.peer_client_context(creds[who])
    stream = await trio.open_ssl_over_tcp_stream(target.host, target.port, ssl_context=context)
    try:
        yield stream
    finally:
        await trio.aclose_forcefully(stream)


async def read_until_closed(stream: trio.SSLStream[trio.SocketStream]) -> bytes:
    """Everything the server sends before it closes the connection (EOF or TLS alert)."""
    received = b""
    with trio.fail_after(GUARD):
        while True:
            try:
                await stream.do_handshake()
                data = await stream.receive_some()
            except trio.BrokenResourceError:
                return received
            if not data:
                return received
            received += data


async def welcomed(stream: trio.SSLStream[trio.SocketStream]) -> None:
    with trio.fail_after(GUARD):
        data = b""
        while len(data) < len(WELCOME):
            chunk = await stream.receive_some()
            assert chunk, "closed before the welcome"
            data += chunk
    assert data == WELCOME

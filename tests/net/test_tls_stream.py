"""TlsStream: handshake, data both ways, large writes, close and failure semantics, interop
with trio.SSLStream, fairness (periodic checkpoints) and its concurrency rules."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from phalanx.net.tls_stream import YIELD_EVERY, TlsStream
from phalanx.ops import pki


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pki.CredentialPaths]:
    root: Path = tmp_path_factory.mktemp("tls")
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    return {name: pki.write_credentials(pki.issue_node_cert(ca, name), root / name)
            for name in ("n1", "n2")}


Wrap = Callable[[trio.SocketStream, ssl.SSLContext, bool], Any]


def lean(stream: trio.SocketStream, context: ssl.SSLContext, server: bool) -> TlsStream:
    return TlsStream(stream, context, server_side=server)


def stock(stream: trio.SocketStream, context: ssl.SSLContext, server: bool) -> Any:
    return trio.SSLStream(stream, context, server_side=server, server_hostname=None)


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """(accepted, dialled) ends of one loopback TCP connection."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    accepted: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        async def accept() -> None:
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
    await listener.aclose()
    return accepted[0], tcp


@asynccontextmanager
async def tls_pair(
    creds: dict[str, pki.CredentialPaths], *, server: Wrap = lean, client: Wrap = lean,
) -> AsyncIterator[tuple[Any, Any]]:
    """(server side, client side) of one loopback connection, handshakes done."""
    accepted, tcp = await tcp_pair()
    s = server(accepted, pki.peer_server_context(creds["n1"]), True)
    c = client(tcp, pki.peer_client_context(creds["n2"]), False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.do_handshake)
        nursery.start_soon(c.do_handshake)
    try:
        yield s, c
    finally:
        await trio.aclose_forcefully(s)
        await trio.aclose_forcefully(c)


async def receive_exactly(stream: Any, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(65536)
        assert chunk, "stream ended early"
        data += chunk
    return bytes(data)


async def test_data_flows_both_ways_and_peers_are_authenticated(
        creds: dict[str, pki.CredentialPaths]) -> None:
    async with tls_pair(creds) as (s, c):
        assert pki.node_id_from_peercert(s.getpeercert()) == "n2"
        assert pki.node_id_from_peercert(c.getpeercert()) == "n1"
        await c.send_all(b"ping")
        assert await receive_exactly(s, 4) == b"ping"
        await s.send_all(b"pong!")
        assert await receive_exactly(c, 5) == b"pong!"


async def test_a_write_larger_than_the_socket_buffers_arrives_whole(
        creds: dict[str, pki.CredentialPaths]) -> None:
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB: the writer must wait for room
    async with tls_pair(creds) as (s, c):
        received: list[bytes] = []
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                received.append(await receive_exactly(s, len(payload)))

            nursery.start_soon(read)
            await c.send_all(payload)
        assert received == [payload]


@pytest.mark.parametrize(("server", "client"), [(lean, stock), (stock, lean)])
async def test_interoperates_with_trio_ssl_stream(
        creds: dict[str, pki.CredentialPaths], server: Wrap, client: Wrap) -> None:
    async with tls_pair(creds, server=server, client=client) as (s, c):
        for i in range(20):
            await c.send_all(b"x%d" % i)
            assert await receive_exactly(s, len(b"x%d" % i)) == b"x%d" % i
            await s.send_all(b"y" * 1000)
            assert await receive_exactly(c, 1000) == b"y" * 1000


async def test_close_notify_is_eof_and_an_abrupt_close_is_broken(
        creds: dict[str, pki.CredentialPaths]) -> None:
    async with tls_pair(creds, client=stock) as (s, c):
        await c.aclose()  # trio.SSLStream sends close_notify
        assert await s.receive_some() == b""
    async with tls_pair(creds) as (s, c):
        await c.aclose()  # TlsStream just closes the socket
        with pytest.raises(trio.BrokenResourceError):
            await s.receive_some()


async def test_records_that_arrived_together_are_returned_together(
        creds: dict[str, pki.CredentialPaths]) -> None:
    """One `receive_some` hands over every whole record the socket read brought (the
    transport steps a read's messages in one pass); a close_notify behind them still ends
    the stream, at the next call."""
    async with tls_pair(creds, client=stock) as (s, c):
        for part in (b"a", b"bb", b"ccc"):  # three records (loopback: all in by now)
            await c.send_all(part)
        await c.aclose()  # and a close_notify
        assert await s.receive_some() == b"abbccc"
        assert await s.receive_some() == b""
    async with tls_pair(creds, client=stock) as (s, c):
        for part in (b"a", b"bb", b"ccc"):
            await c.send_all(part)
        assert await s.receive_some(3) == b"abb"  # at most max_bytes
        assert await s.receive_some() == b"ccc"


async def test_a_client_without_a_certificate_is_refused(
        creds: dict[str, pki.CredentialPaths]) -> None:
    anonymous = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                           cafile=str(creds["n1"].ca_certificate))
    anonymous.check_hostname = False
    accepted, tcp = await tcp_pair()
    s = TlsStream(accepted, pki.peer_server_context(creds["n1"]), server_side=True)
    c = TlsStream(tcp, anonymous)
    refused: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        async def serve() -> None:
            try:
                await s.do_handshake()
            except trio.BrokenResourceError as exc:
                refused.append(exc)

        nursery.start_soon(serve)
        await c.do_handshake()  # TLS 1.3: the client finishes before the server judges it
        with pytest.raises(trio.BrokenResourceError) as caught:
            await c.receive_some()  # ... and learns of the refusal here (the alert)
    assert isinstance(caught.value.__cause__, ssl.SSLError)
    assert len(refused) == 1
    assert isinstance(refused[0].__cause__, ssl.SSLError)
    assert "certificate" in str(refused[0])
    await s.aclose()
    await c.aclose()


async def test_a_reader_of_a_busy_stream_still_lets_other_tasks_run(
        creds: dict[str, pki.CredentialPaths]) -> None:
    async with tls_pair(creds) as (s, c):
        await c.send_all(b"z" * 100_000)
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await trio.lowlevel.checkpoint()
            start = ticks
            for _ in range(4 * YIELD_EVERY):  # 10-byte reads from buffered plaintext
                assert len(await s.receive_some(10)) == 10
            assert ticks - start >= 3  # at least one checkpoint per YIELD_EVERY reads
            done = True


async def test_concurrent_senders_take_turns_and_a_second_receiver_is_misuse(
        creds: dict[str, pki.CredentialPaths]) -> None:
    async with tls_pair(creds) as (s, c):
        blocks = [bytes([i]) * 300_000 for i in range(1, 4)]  # each waits for buffer room
        received: list[bytes] = []
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                received.append(await receive_exactly(s, sum(map(len, blocks))))

            nursery.start_soon(read)
            for block in blocks:
                nursery.start_soon(c.send_all, block)
        data = received[0]
        # Each block arrives contiguous (no interleaving), in some order.
        assert sorted(data[i:i + 300_000] for i in range(0, len(data), 300_000)) == blocks

        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await s.receive_some()
            nursery.cancel_scope.cancel()


async def test_try_send_writes_at_once_or_keeps_the_rest_in_order_for_send_all(
        creds: dict[str, pki.CredentialPaths]) -> None:
    async with tls_pair(creds) as (s, c):
        assert c.try_send(b"direct")  # room in the socket: written from this task
        assert not c.backlogged
        assert await receive_exactly(s, 6) == b"direct"
        big = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket buffers take
        assert c.try_send(big)
        assert c.backlogged
        assert not c.try_send(b"later")  # refused: it would overtake the backlog
        received: list[bytes] = []
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                received.append(await receive_exactly(s, len(big) + 5))

            nursery.start_soon(read)
            await c.send_all(b"")  # writes the backlog ...
            assert not c.backlogged
            await c.send_all(b"after")  # ... and then what follows it
        assert received == [big + b"after"]


async def test_try_send_refuses_before_the_handshake_and_while_a_send_is_blocked(
        creds: dict[str, pki.CredentialPaths]) -> None:
    accepted, tcp = await tcp_pair()
    fresh = TlsStream(tcp, pki.peer_client_context(creds["n2"]))
    assert not fresh.try_send(b"x")  # no handshake yet
    await trio.aclose_forcefully(fresh)
    await trio.aclose_forcefully(accepted)
    async with tls_pair(creds) as (_s, c), trio.open_nursery() as nursery:
        nursery.start_soon(c.send_all, b"y" * (8 * 1024 * 1024))  # blocks: nobody reads
        await trio.testing.wait_all_tasks_blocked()
        assert not c.try_send(b"z")
        nursery.cancel_scope.cancel()

"""The client port's resource limits, over real TLS sockets: connections beyond the cap are
shed while existing ones keep working; idle handshakes are shed oldest-first; handshakes start
at a bounded rate; half-sent large frames stay within the port's buffer budget (the attacks:
30 connections with 16 MiB frame buffers cost ~500 MB; 1,100 idle connections exhausted the
descriptor limit; 2,000 handshakes starved a leader's event loop)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio
from runtime_helpers import HOST, RawClient, wait_for
from test_client_port import RecordingSink, frame

from phalanx.net.client_protocol import ClientReply
from phalanx.net.framing import FREE_BYTES, encode_frame
from phalanx.ops import pki
from phalanx.ops.node_config import Address
from phalanx.runtime.client_port import ClientPort

MIB = 1 << 20


async def serve(tmp_path: Path, nursery: trio.Nursery, **limits: object
                ) -> tuple[ClientPort, Address, pki.CredentialPaths]:
    """Run a port; returns it, its address and the credentials of client ``c``."""
    ca = pki.create_ca()
    pki.write_ca(ca, tmp_path / "ca")
    paths = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
    client = pki.write_credentials(pki.issue_client_cert(ca, "c"), tmp_path / "clients")
    sink = RecordingSink()
    port = ClientPort(sink, ssl_context=pki.client_server_context(paths), node_id="n1",
                      **limits)  # type: ignore[arg-type]
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    await nursery.start(port.serve, listeners)
    return port, Address(host=HOST, port=int(listeners[0].socket.getsockname()[1])), client


async def works(client: RawClient, n: int) -> None:
    await client.send_raw(frame(n))
    reply = await client.receive()
    assert isinstance(reply, ClientReply)
    assert reply.request_no == n


async def test_connections_over_the_cap_are_shed_and_existing_ones_keep_working(
        tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, nursery, max_connections=4,
                                        handshake_rate=None)
        clients = [await RawClient.connect(address, ca) for _ in range(4)]
        for _ in range(3):
            with pytest.raises((trio.BrokenResourceError, OSError)):  # closed before TLS
                await RawClient.connect(address, ca)
        assert port.gate.stats.shed_full >= 3
        assert port.gate.stats.open == 4
        for n, client in enumerate(clients, 1):
            await works(client, n)
        await clients[0].aclose()
        await wait_for(lambda: port.gate.stats.open == 3)
        late = await RawClient.connect(address, ca)  # room again
        await works(late, 10)
        nursery.cancel_scope.cancel()


async def test_idle_unauthenticated_sockets_are_shed_oldest_first(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, nursery, max_handshakes=3,
                                        handshake_rate=None)
        idle = [await trio.open_tcp_stream(address.host, address.port) for _ in range(6)]
        await wait_for(lambda: port.gate.stats.shed_pending == 3)
        assert port.gate.stats.pending == 3
        client = await RawClient.connect(address, ca)  # sheds one more idle socket
        await works(client, 1)
        assert port.gate.stats.shed_pending == 4
        assert port.stats.connections_accepted == 1
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_handshakes_start_at_a_bounded_rate(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, nursery, handshake_rate=4.0,
                                        handshake_burst=2)
        clients: list[RawClient] = []

        async def connect() -> None:
            clients.append(await RawClient.connect(address, ca))

        start = trio.current_time()
        async with trio.open_nursery() as flood:
            for _ in range(6):
                flood.start_soon(connect)
        # 2 from the burst, then one per 1/4 s: at least 1 s for the other 4.
        assert trio.current_time() - start >= 0.9
        assert port.gate.stats.rate_waits >= 4
        for n, client in enumerate(clients, 1):
            await works(client, n)
        nursery.cancel_scope.cancel()


async def test_half_sent_large_frames_stay_within_the_buffer_budget(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, nursery, max_frame_size=4 * MIB,
                                        buffer_budget=4 * MIB, handshake_rate=None)
        half = encode_frame(b"x" * (4 * MIB - 64))[: 2 * MIB]
        attackers = [await RawClient.connect(address, ca) for _ in range(12)]
        for attacker in attackers:
            with contextlib.suppress(trio.BrokenResourceError):
                await attacker.send_raw(half)
        # Each holds 2 MiB, 128 KiB of it free: two fit the 4 MiB budget, ten are closed.
        await wait_for(lambda: port.stats.budget_closes == 10
                       and port.budget.used == 2 * (2 * MIB - FREE_BYTES))
        assert port.budget.peak <= 4 * MIB
        # Small requests need no budget: a new client is served at once.
        client = await RawClient.connect(address, ca)
        await works(client, 1)
        # Oversized frames (beyond the derived request limit) close their connection.
        big = await RawClient.connect(address, ca)
        await big.send_raw((4 * MIB + 1).to_bytes(4, "big"))
        with pytest.raises(EOFError):
            await big.receive()
        assert port.stats.oversized_frames == 1
        nursery.cancel_scope.cancel()

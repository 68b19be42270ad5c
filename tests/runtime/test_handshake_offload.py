"""The client port under a handshake flood, over real TLS sockets: its TLS handshake crypto
runs off the event loop, and failed handshakes are counted one by one but not logged so.

The attack (bench/attack_handshakes.py): 2,000 sockets handshaking with the leader's client
port. Each server handshake step costs ~0.5-2 ms of crypto (key exchange and signature; the
client certificate's chain), and a scheduler batch ran every handshake whose peer bytes had
arrived: traced batches of 50-100 ms on a loaded 2-core box, heartbeats late, leadership
lost. The crypto now runs in a worker thread (OpenSSL releases the GIL), so the event loop
thread never does it: here the server's ClientHello callback, which OpenSSL calls from
inside the handshake step, records the thread it ran on. The same flood logged one INFO line
per failed handshake (~150 a second, ~2 GB a day on the node's disk).
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
import time
from pathlib import Path

import pytest
import trio
from runtime_helpers import HOST, RawClient, wait_for
from test_client_port import RecordingSink, frame

from phalanx.net.client_protocol import ClientReply
from phalanx.ops import pki
from phalanx.ops.node_config import Address
from phalanx.runtime.client_port import LOG_LINES_PER_SECOND, ClientPort


async def test_handshake_steps_run_outside_the_event_loop_thread(tmp_path: Path) -> None:
    ca = pki.create_ca()
    pki.write_ca(ca, tmp_path / "ca")
    paths = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
    client = pki.write_credentials(pki.issue_client_cert(ca, "c"), tmp_path / "clients")
    context = pki.client_server_context(paths)
    threads: list[int] = []

    def on_client_hello(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        threads.append(threading.get_ident())

    context.sni_callback = on_client_hello  # type: ignore[assignment]
    sink = RecordingSink()
    port = ClientPort(sink, ssl_context=context, node_id="n1")
    sink.port = port
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host=HOST)
        await nursery.start(port.serve, listeners)
        address = Address(host=HOST, port=int(listeners[0].socket.getsockname()[1]))
        clients = [await RawClient.connect(address, client) for _ in range(3)]
        for n, c in enumerate(clients, 1):  # and the connections work as before
            await c.send_raw(frame(n))
            reply = await c.receive()
            assert isinstance(reply, ClientReply)
            assert reply.request_no == n
            await c.aclose()
        nursery.cancel_scope.cancel()
    assert len(threads) == 3
    assert threading.get_ident() not in threads


async def test_failed_handshakes_are_counted_but_logged_a_few_a_second(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca = pki.create_ca()
    ca_paths = pki.write_ca(ca, tmp_path / "ca")
    paths = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
    sink = RecordingSink()
    port = ClientPort(sink, ssl_context=pki.client_server_context(paths), node_id="n1",
                      handshake_rate=None)
    sink.port = port
    attempts = 40
    with caplog.at_level(logging.INFO, logger="phalanx.runtime.client_port"):
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host=HOST)
            await nursery.start(port.serve, listeners)
            address = Address(host=HOST, port=int(listeners[0].socket.getsockname()[1]))
            start = time.monotonic()
            for _ in range(attempts):  # no client certificate: each handshake fails
                try:
                    c = await RawClient.connect(address, ca_paths.certificate)
                    await c.receive()
                except (EOFError, OSError, trio.BrokenResourceError):
                    pass
            await wait_for(lambda: port.stats.handshake_failures >= attempts)
            elapsed = time.monotonic() - start
            nursery.cancel_scope.cancel()
    lines = [r for r in caplog.records if "handshake" in r.getMessage()]
    assert port.stats.handshake_failures == attempts
    assert len(lines) <= LOG_LINES_PER_SECOND * (math.ceil(elapsed) + 1) < attempts

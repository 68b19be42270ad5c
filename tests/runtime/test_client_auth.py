"""Client authentication and authorization on the client port (`phalanx.runtime.client_auth`).

The attacks these reproduce, on the real port over real TLS:
- a client with no certificate, holding only the public CA certificate, used to get full
  read and write access (client certificates were optional);
- a client could send calls under any session id, writing into (or answering from) another
  client's session, and subscribe to another client's answers;
- there were no roles: every certificate could write.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from runtime_helpers import HOST, RawClient, wait_for
from test_client_port import RecordingSink, frame
from test_client_subscriptions import SubscribingSink

from phalanx.net import client_protocol
from phalanx.net.client_protocol import (
    ClientHello,
    ClientHelloReply,
    ClientReply,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.ops import pki
from phalanx.ops.node_config import Address
from phalanx.runtime.client_port import ClientPort

client_protocol.register()


class Port:
    """A client port (node n1) and credentials of every kind, under one CA."""

    def __init__(self, tmp_path: Path) -> None:
        ca = pki.create_ca()
        self.ca = pki.write_ca(ca, tmp_path / "ca").certificate
        self.node = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
        self.other_node = pki.write_credentials(pki.issue_node_cert(ca, "n2"), tmp_path / "n2")
        clients = tmp_path / "clients"
        self.alice = pki.write_credentials(pki.issue_client_cert(ca, "alice"), clients)
        self.reader = pki.write_credentials(
            pki.issue_client_cert(ca, "reader", role="read-only"), clients)
        self.port: ClientPort | None = None
        self.address: Address | None = None

    async def serve(self, sink: RecordingSink, nursery: trio.Nursery, *,
                    secure: bool = True) -> ClientPort:
        context = pki.client_server_context(self.node, require_client_cert=secure)
        self.port = ClientPort(sink, ssl_context=context, node_id="n1",
                               require_client_auth=secure)
        sink.port = self.port
        listeners = await trio.open_tcp_listeners(0, host=HOST)
        await nursery.start(self.port.serve, listeners)
        self.address = Address(host=HOST, port=int(listeners[0].socket.getsockname()[1]))
        return self.port

    async def connect(self, who: Path | pki.CredentialPaths) -> RawClient:
        assert self.address is not None
        return await RawClient.connect(self.address, who)


async def refused(p: Port, who: Path | pki.CredentialPaths, data: bytes) -> None:
    """Connect as `who` and send `data`; the port must close the connection unanswered."""
    client = await p.connect(who)
    await exchange(client, data, 1)


async def exchange(client: RawClient, data: bytes, count: int) -> list[object]:
    await client.send_raw(data)
    with trio.fail_after(10):
        return [await client.receive() for _ in range(count)]


async def test_a_client_without_a_certificate_is_refused_at_the_handshake(
        tmp_path: Path) -> None:
    p, sink = Port(tmp_path), RecordingSink()
    async with trio.open_nursery() as nursery:
        port = await p.serve(sink, nursery)
        # Before: the handshake succeeded and this write was applied.
        with pytest.raises((EOFError, trio.BrokenResourceError)):
            await refused(p, p.ca, frame(1, "alice"))
        await wait_for(lambda: port.stats.handshake_failures == 1)
        assert sink.items == []
        assert port.stats.connections_accepted == 0
        nursery.cancel_scope.cancel()


async def test_a_node_certificate_is_not_a_client(tmp_path: Path) -> None:
    p, sink = Port(tmp_path), RecordingSink()
    async with trio.open_nursery() as nursery:
        port = await p.serve(sink, nursery)
        with pytest.raises((EOFError, trio.BrokenResourceError)):
            await refused(p, p.other_node, frame(1, "n2"))
        assert sink.items == []
        assert port.stats.unauthenticated == 1
        nursery.cancel_scope.cancel()


async def test_a_client_may_use_only_its_own_sessions(tmp_path: Path) -> None:
    p, sink = Port(tmp_path), RecordingSink()
    async with trio.open_nursery() as nursery:
        port = await p.serve(sink, nursery)
        alice = await p.connect(p.alice)
        # Before: "bob" and "alicex" went to the driver like alice's own sessions.
        spoofed = [frame(1, "bob"), frame(2, "bob#0"), frame(3, "alicex"), frame(4, "")]
        own = [frame(5, "alice"), frame(6, "alice#3"), frame(7, "alice/0f3a#1")]
        replies = await exchange(alice, b"".join(spoofed + own), 7)
        status = {r.request_no: r.status for r in replies if isinstance(r, ClientReply)}
        assert status == {1: ReplyStatus.FORBIDDEN, 2: ReplyStatus.FORBIDDEN,
                          3: ReplyStatus.FORBIDDEN, 4: ReplyStatus.FORBIDDEN,
                          5: ReplyStatus.OK, 6: ReplyStatus.OK, 7: ReplyStatus.OK}
        bob = next(r for r in replies if isinstance(r, ClientReply) and r.request_no == 1)
        assert bob.message.startswith("session 'bob' does not belong to client 'alice'")
        assert [c for item in sink.items for c in item] == ["call5", "call6", "call7"]
        assert port.stats.forbidden_calls == 4
        await alice.aclose()
        nursery.cancel_scope.cancel()


async def test_a_client_may_subscribe_only_to_its_own_answers(tmp_path: Path) -> None:
    p, sink = Port(tmp_path), SubscribingSink()
    async with trio.open_nursery() as nursery:
        port = await p.serve(sink, nursery)
        alice = await p.connect(p.alice)
        await alice.send(ClientHello(client_id="bob"))
        assert await alice.receive() == ClientHelloReply(client_id="bob", subscribed=False)
        await alice.send(ClientHello(client_id="alice/1"))
        assert await alice.receive() == ClientHelloReply(client_id="alice/1", subscribed=True)
        assert [c for c, _ in sink.subscribed] == ["alice/1"]
        assert port.stats.forbidden_subscriptions == 1
        await alice.aclose()
        nursery.cancel_scope.cancel()


async def test_a_read_only_client_reads_but_cannot_write(tmp_path: Path) -> None:
    p, sink = Port(tmp_path), RecordingSink()
    async with trio.open_nursery() as nursery:
        port = await p.serve(sink, nursery)
        reader = await p.connect(p.reader)
        data = (frame(1, "reader/x") + frame(2, "reader/x", read_only=True)
                + frame(3, "reader/x#0"))
        replies = await exchange(reader, data, 3)
        got = {r.request_no: r for r in replies if isinstance(r, ClientReply)}
        assert got[1].status is ReplyStatus.FORBIDDEN is got[3].status
        assert got[1].message == ("writes need role read-write; client 'reader' has role "
                                  "read-only")
        assert got[2].status is ReplyStatus.OK
        assert [c for item in sink.items for c in item] == ["call2"]
        # Status is for everyone.
        await reader.send(StatusCall(nonce=4))
        assert isinstance(await reader.receive(), StatusReply)
        assert port.stats.forbidden_calls == 2
        await reader.aclose()
        nursery.cancel_scope.cancel()


async def test_the_insecure_mode_lets_anyone_in(tmp_path: Path) -> None:
    p, sink = Port(tmp_path), RecordingSink()
    async with trio.open_nursery() as nursery:
        await p.serve(sink, nursery, secure=False)
        anonymous = await p.connect(p.ca)
        (reply,) = await exchange(anonymous, frame(1, "anyone"), 1)
        assert isinstance(reply, ClientReply)
        assert reply.status is ReplyStatus.OK
        await anonymous.aclose()
        nursery.cancel_scope.cancel()


def test_a_secured_port_needs_a_context_that_requires_certificates(tmp_path: Path) -> None:
    p = Port(tmp_path)
    optional = pki.client_server_context(p.node, require_client_cert=False)
    with pytest.raises(ValueError, match="CERT_REQUIRED"):
        ClientPort(RecordingSink(), ssl_context=optional, node_id="n1")

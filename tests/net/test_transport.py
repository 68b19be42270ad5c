"""Tests for phalanx.net.transport over real loopback TCP + mutual TLS (pytest-trio).

Synchronisation is by events, never by sleeps: a test waits for a delivered message or for the
transport's log record of what it did (`LogWaiter`). `trio.fail_after` guards only against a
hang; nothing asserts on elapsed time.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from phalanx import pki
from phalanx.consensus.types import (
    ClientRequest,
    Entry,
    EntryKind,
    LocalProtocolError,
    Message,
    NodeId,
)
from phalanx.net import wire
from phalanx.net.codec import DecodeError, EncodeError
from phalanx.net.framing import encode_frame
from phalanx.net.transport import (
    SEND_BATCH_BYTES,
    WELCOME,
    Backoff,
    PeerAddress,
    Transport,
    open_peer_transport,
)

HOST = "127.0.0.1"
GUARD = 15  # seconds: a hang guard only
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
MAX_FRAME = 4096


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def decode(data: bytes) -> object:
    result: object = json.loads(data)
    return result


# --------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pki.CredentialPaths]:
    root = tmp_path_factory.mktemp("cluster")
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    out = {
        name: pki.write_credentials(pki.issue_node_cert(ca, name), root / "nodes")
        for name in ("n1", "n2", "n3", "n9")
    }
    out["alice"] = pki.write_credentials(pki.issue_client_cert(ca, "alice"), root / "clients")
    foreign = pki.write_credentials(pki.issue_node_cert(pki.create_ca(), "n1"), root / "foreign")
    out["foreign-n1"] = pki.CredentialPaths(
        certificate=foreign.certificate,
        private_key=foreign.private_key,
        ca_certificate=out["n1"].ca_certificate,
    )
    return out


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


@pytest.fixture
def logs() -> Iterator[LogWaiter]:
    logger = logging.getLogger("phalanx.net.transport")
    waiter = LogWaiter()
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(waiter)
    try:
        yield waiter
    finally:
        logger.removeHandler(waiter)
        logger.setLevel(old_level)


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


# --------------------------------------------------------------------------------------------
# Exchange


async def test_two_nodes_exchange_authenticated_messages_in_order(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers) as t2:
        for i in range(50):
            assert t1.send_nowait(N2, {"i": i})
        await t2.send(N1, "hello")
        assert [await receive(t2) for _ in range(50)] == [(N1, {"i": i}) for i in range(50)]
        assert await receive(t1) == (N2, "hello")
        s1, s2 = t1.statistics(), t2.statistics()
    assert s1.frames_out == 50
    assert s2.frames_in == 50
    assert s2.bytes_in >= sum(len(encode_frame(encode({"i": i}))) for i in range(50))
    assert s1.outbound_established == 1
    assert s2.connections_accepted == 1
    assert s2.connections_refused == 0
    assert s1.queued_frames == 0


async def test_connected_peers_is_link_state_not_traffic(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    # No message is ever sent: every node is still connected to every other (links are
    # dialled eagerly), and a node that goes away drops out of its peers' lists.
    l1, l2, l3 = await listen(), await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2), N3: address(l3)}

    async def until(predicate: Callable[[], bool]) -> None:
        with trio.fail_after(GUARD):
            while not predicate():  # noqa: ASYNC110  (state of other tasks, no event)
                await trio.sleep(0.005)

    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers) as t2:
        async with node(creds, N3, l3, peers) as t3:
            await until(lambda: t1.connected_peers() == (N2, N3)
                        and t2.connected_peers() == (N1, N3)
                        and t3.connected_peers() == (N1, N2))
            assert t1.statistics().frames_out == 0
        await until(lambda: t1.connected_peers() == (N2,) and t2.connected_peers() == (N1,))


async def test_inbound_channel_ends_when_the_transport_closes(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1 = await listen()
    async with node(creds, N1, l1, {N2: PeerAddress(host=HOST, port=1)}) as t1:
        pass
    with pytest.raises(trio.EndOfChannel):
        t1.inbound.receive_nowait()


# --------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("who", "reason"),
    [
        (None, "TLS handshake failed"),
        ("foreign-n1", "TLS handshake failed"),
        ("alice", "certificate names no phalanx node"),
        ("n9", "node 'n9' is not in the configured peer set"),
    ],
)
async def test_unauthenticated_or_unknown_peer_is_refused_while_others_are_served(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter, who: str | None, reason: str
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers) as t2:
        t1.send_nowait(N2, "before")
        assert await receive(t2) == (N1, "before")
        async with raw_peer(creds, who, peers[N2]) as intruder:
            # The intruder is never welcomed: it sees the connection end (EOF or TLS alert).
            assert await read_until_closed(intruder) == b""
            (message,) = await logs.wait_for("refused peer connection")
            assert reason in message
            t1.send_nowait(N2, "after")
            assert await receive(t2) == (N1, "after")
        stats = t2.statistics()
    assert stats.connections_refused == 1
    assert stats.connections_accepted == 1
    assert stats.frames_in == 2


async def test_dialer_refuses_a_server_that_names_another_node(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter
) -> None:
    l1, l3 = await listen(), await listen()
    # n1 believes n2 lives where n3 actually listens.
    async with (
        node(creds, N1, l1, {N1: address(l1), N2: address(l3)}) as t1,
        node(creds, N3, l3, {N1: address(l1), N3: address(l3)}) as t3,
    ):
        assert t1.send_nowait(N2, "for n2 only")
        (message,) = await logs.wait_for("refused link")
        assert "is 'n3', expected 'n2'" in message
        s1, s3 = t1.statistics(), t3.statistics()
    assert s1.outbound_refused >= 1
    assert s1.outbound_established == 0
    assert s1.queued_frames == 1  # never written into the wrong node's connection
    assert s3.frames_in == 0


async def test_newer_connection_from_the_same_peer_replaces_the_older(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter
) -> None:
    l2 = await listen()
    peers = {N2: address(l2), N3: PeerAddress(host=HOST, port=1)}
    async with node(creds, N2, l2, peers) as t2:
        async with raw_peer(creds, "n3", peers[N2]) as first:
            await welcomed(first)
            async with raw_peer(creds, "n3", peers[N2]) as second:
                await welcomed(second)
                assert await read_until_closed(first) == b""
                await second.send_all(encode_frame(encode("via second")))
                assert await receive(t2) == (N3, "via second")
        assert t2.statistics().connections_replaced == 1


# --------------------------------------------------------------------------------------------
# Malformed and oversized frames


@pytest.mark.parametrize(
    ("payload", "counter", "log"),
    [
        (encode_frame(b"\xffnot json"), "malformed_frames", "malformed frame"),
        (struct.pack(">I", MAX_FRAME + 1), "oversized_frames", "exceeds max_frame_size"),
        (b"\x00\x00\x00\x09trunc", "malformed_frames", "incomplete frame"),
    ],
    ids=["undecodable", "oversized", "truncated"],
)
async def test_bad_frame_closes_only_that_connection(
    creds: dict[str, pki.CredentialPaths],
    logs: LogWaiter,
    payload: bytes,
    counter: str,
    log: str,
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2), N3: PeerAddress(host=HOST, port=1)}
    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers) as t2:
        async with raw_peer(creds, "n3", peers[N2]) as bad:
            await welcomed(bad)
            await bad.send_all(encode_frame(encode("valid first")))
            assert await receive(t2) == (N3, "valid first")
            await bad.send_all(payload)
            if log == "incomplete frame":
                await bad.aclose()  # a clean TLS close_notify in the middle of a frame
            # Meanwhile the legitimate peer is served.
            t1.send_nowait(N2, "legit")
            assert await receive(t2) == (N1, "legit")
            if log != "incomplete frame":
                assert await read_until_closed(bad) == b""
            (message,) = await logs.wait_for(log)
            assert "closing connection from n3" in message
        t1.send_nowait(N2, "still served")
        assert await receive(t2) == (N1, "still served")
        stats = t2.statistics()
    assert getattr(stats, counter) == 1
    assert stats.frames_in == 3
    assert stats.connections_accepted == 2


# --------------------------------------------------------------------------------------------
# Reconnect and backpressure


async def test_link_reconnects_after_the_listener_restarts(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    async with node(creds, N1, l1, peers) as t1:
        async with node(creds, N2, l2, peers) as t2:
            t1.send_nowait(N2, "first life")
            assert await receive(t2) == (N1, "first life")
        await logs.wait_for("link to n2 closed")
        # Queued while n2 is down; delivered once it is back on the same port.
        assert t1.send_nowait(N2, "second life")
        await logs.wait_for("dial n2")  # at least one failed redial
        async with node(creds, N2, await listen(peers[N2].port), peers) as t2_again:
            assert await receive(t2_again) == (N1, "second life")
        stats = t1.statistics()
    assert stats.outbound_established == 2
    assert stats.dial_failures >= 1
    assert stats.frames_lost == 0


@pytest.mark.parametrize("hold_sends", [False, True])
async def test_a_down_link_queues_only_a_few_frames_then_delivers_them(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter, hold_sends: bool
) -> None:
    # A long partition must not pile up a backlog of stale messages for the peer: while its
    # link is down only `down_queue_capacity` frames are kept (the oldest), the rest refused.
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    port2 = peers[N2].port
    for listener in l2:
        await listener.aclose()  # n2 is down
    async with node(creds, N1, l1, peers, down_queue_capacity=5,
                    hold_sends=hold_sends) as t1:
        await logs.wait_for("dial n2")
        accepted = [t1.send_nowait(N2, i) for i in range(50)]
        t1.flush()  # (holding: frames for a down link are queued at once, never held)
        assert accepted == [True] * 5 + [False] * 45
        stats = t1.statistics()
        assert stats.down_drops == 45
        assert stats.queue_full_drops == 0
        async with node(creds, N2, await listen(port2), peers) as t2:
            assert [await receive(t2) for _ in range(5)] == [(N1, i) for i in range(5)]
            await logs.wait_for("link to n2 at")
            # Once linked, the full queue capacity applies again.
            assert all(t1.send_nowait(N2, i) for i in range(5, 20))
            t1.flush()
            assert [await receive(t2) for _ in range(15)] == [(N1, i) for i in range(5, 20)]


async def test_full_send_queue_refuses_newest_and_send_waits(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    port2 = peers[N2].port
    for listener in l2:
        await listener.aclose()  # n2 is down: its queue at n1 fills up
    async with node(creds, N1, l1, peers, send_queue_capacity=3) as t1:
        assert [t1.send_nowait(N2, i) for i in range(5)] == [True, True, True, False, False]
        stats = t1.statistics()
        assert stats.queue_full_drops == 2
        assert stats.queued_frames == 3
        sent = trio.Event()

        async def blocked_send() -> None:
            await t1.send(N2, "waited")
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked_send)
            await trio.testing.wait_all_tasks_blocked()
            assert not sent.is_set()
            async with node(creds, N2, await listen(port2), peers) as t2:
                got = [await receive(t2) for _ in range(4)]
                await sent.wait()
        # The oldest three kept their order; the refused newest never arrive.
        assert got == [(N1, 0), (N1, 1), (N1, 2), (N1, "waited")]


# --------------------------------------------------------------------------------------------
# Misuse and configuration


async def test_misuse_raises_local_errors(creds: dict[str, pki.CredentialPaths]) -> None:
    l1 = await listen()
    async with node(creds, N1, l1, {N2: PeerAddress(host=HOST, port=1)}) as t1:
        with pytest.raises(LocalProtocolError, match="not a configured peer"):
            t1.send_nowait(N3, "x")
        with pytest.raises(ValueError, match="exceeds max_frame_size"):
            t1.send_nowait(N2, "x" * MAX_FRAME)
        assert t1.statistics().queued_frames == 0


def test_configuration_is_validated(creds: dict[str, pki.CredentialPaths]) -> None:
    base: dict[str, Any] = {
        "node_id": N1,
        "peers": {N2: PeerAddress(host=HOST, port=1)},
        "server_context": pki.peer_server_context(creds["n1"]),
        "client_context": pki.peer_client_context(creds["n1"]),
        "encode": encode,
        "decode": decode,
        "decode_error": ValueError,
        "rng": random.Random(0),
    }
    with pytest.raises(ValueError, match="must not contain this node"):
        Transport(**{**base, "peers": {N1: PeerAddress(host=HOST, port=1)}})
    lax = pki.client_server_context(creds["n1"])  # client certs optional: not for peers
    with pytest.raises(ValueError, match="CERT_REQUIRED"):
        Transport(**{**base, "server_context": lax})
    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError, match="CERT_REQUIRED"):
        Transport(**{**base, "client_context": unverified})
    with pytest.raises(ValueError, match="port"):
        PeerAddress(host=HOST, port=0)


@given(
    base=st.floats(min_value=1e-4, max_value=1.0),
    factor=st.floats(min_value=1.0, max_value=100.0),
    multiplier=st.floats(min_value=1.0, max_value=4.0),
    attempt=st.integers(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_is_jittered_exponential_and_capped(
    base: float, factor: float, multiplier: float, attempt: int, seed: int
) -> None:
    backoff = Backoff(base=base, cap=base * factor, multiplier=multiplier)
    envelope = backoff.envelope(attempt)
    assert backoff.base <= envelope <= backoff.cap
    assert envelope <= backoff.envelope(attempt + 1)
    assert envelope == pytest.approx(min(backoff.cap, base * multiplier**attempt))
    delay = backoff.delay(attempt, random.Random(seed))
    assert envelope / 2 <= delay <= envelope
    assert delay == backoff.delay(attempt, random.Random(seed))  # rng is the only randomness


def test_backoff_validates_its_parameters() -> None:
    with pytest.raises(ValueError, match="base"):
        Backoff(base=0)
    with pytest.raises(ValueError, match="base"):
        Backoff(base=2, cap=1)
    with pytest.raises(ValueError, match="multiplier"):
        Backoff(multiplier=0.5)



# --------------------------------------------------------------------------------------------
# With the project's codec (phalanx.net.wire)


async def test_wire_codec_messages_cross_the_transport_and_bad_ones_are_dropped(
    creds: dict[str, pki.CredentialPaths], logs: LogWaiter
) -> None:
    codec: dict[str, Any] = {
        "encode": wire.encode,
        "decode": wire.decode,
        "decode_error": DecodeError,
    }
    entry = Entry(
        index=3,
        term=2,
        kind=EntryKind.COMMAND,
        requests=(ClientRequest(client_id="c1", request_no=7, command=b"put x 1"),),
    )
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2), N3: PeerAddress(host=HOST, port=1)}
    async with node(creds, N1, l1, peers, **codec) as t1, node(creds, N2, l2, peers, **codec) as t2:
        assert t1.send_nowait(N2, entry)
        assert await receive(t2) == (N1, entry)
        with pytest.raises(EncodeError):
            t1.send_nowait(N2, object())  # our misuse surfaces at the call site
        async with raw_peer(creds, "n3", peers[N2]) as bad:
            await welcomed(bad)
            await bad.send_all(encode_frame(b"\x92\xcd\x03\xe7\x90"))  # unknown type id 999
            assert await read_until_closed(bad) == b""
        (message,) = await logs.wait_for("malformed frame")
        assert "closing connection from n3" in message
        t1.send_nowait(N2, entry)
        assert await receive(t2) == (N1, entry)
        assert t2.statistics().malformed_frames == 1


# --------------------------------------------------------------------------------------------
# Direct delivery and encode-once


async def test_deliver_hands_messages_to_the_consumer_in_order_instead_of_inbound(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    got: list[tuple[NodeId, object]] = []
    all_in = trio.Event()

    async def deliver(src: NodeId, message: object) -> None:
        got.append((src, message))
        if len(got) == 30:
            all_in.set()

    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers,
                                                      deliver=deliver) as t2:
        for i in range(30):
            assert t1.send_nowait(N2, {"i": i})
        with trio.fail_after(GUARD):
            await all_in.wait()
        assert got == [(N1, {"i": i}) for i in range(30)]
        with pytest.raises(trio.WouldBlock):
            t2.inbound.receive_nowait()
        with pytest.raises(LocalProtocolError):
            t2.set_deliver(deliver)  # already running: could reorder a link's messages


@dataclass(frozen=True, slots=True, kw_only=True)
class _Note(Message):
    entries: tuple[Entry, ...]


def test_an_equal_protocol_message_to_several_peers_is_encoded_once(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    encoded: list[object] = []

    def counting(message: object) -> bytes:
        encoded.append(message)
        return repr(message).encode()

    peers = {N2: PeerAddress(host=HOST, port=1), N3: PeerAddress(host=HOST, port=2)}
    t = Transport(node_id=N1, peers=peers, server_context=pki.peer_server_context(creds[N1]),
                  client_context=pki.peer_client_context(creds[N1]), encode=counting,
                  decode=decode, decode_error=ValueError, rng=random.Random(1))
    request = ClientRequest(client_id="c", request_no=1, command=b"x")

    def note(index: int) -> _Note:
        return _Note(entries=(Entry(index=index, term=1, kind=EntryKind.COMMAND,
                                    requests=(request,)),))

    # Equal but distinct objects (as a core builds one per follower): one encoding.
    assert t.send_nowait(N2, note(1))
    assert t.send_nowait(N3, note(1))
    assert encoded == [note(1)]
    assert t.send_nowait(N2, note(2))  # a different message is encoded again
    assert len(encoded) == 2
    mutable = {"k": 1}  # not a protocol message: never reused (it could change)
    assert t.send_nowait(N3, mutable)
    mutable["k"] = 2
    assert t.send_nowait(N3, mutable)
    assert len(encoded) == 4
    n2 = [t._queues[N2][1].receive_nowait() for _ in range(2)]
    n3 = [t._queues[N3][1].receive_nowait() for _ in range(3)]
    assert n2[0] == n3[0] == encode_frame(repr(note(1)).encode())
    assert n3[1:] == [encode_frame(b"{'k': 1}"), encode_frame(b"{'k': 2}")]


async def settled(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(GUARD):
        while not predicate():  # noqa: ASYNC110  (state of other tasks, no event)
            await trio.sleep(0.005)


async def test_frames_are_written_directly_when_nothing_waits_and_stay_in_order_when_large(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    big = 1 << 20
    async with node(creds, N1, l1, peers, max_frame_size=big) as t1, \
            node(creds, N2, l2, peers, max_frame_size=big) as t2:
        assert t1.send_nowait(N2, "first")  # may queue: the link may still be coming up
        assert await receive(t2) == (N1, "first")
        await settled(lambda: N2 in t1.connected_peers())
        before = t1.statistics().direct_writes
        assert t1.send_nowait(N2, "small")
        assert t1.statistics().direct_writes == before + 1  # written in this very call
        assert not t1.has_backlog()
        assert await receive(t2) == (N1, "small")
        # Large frames: the socket takes part of the first, the rest waits in the backlog
        # and the later frames queue behind it; all arrive whole and in order.
        payloads = [str(i) * 300_000 for i in range(10)]
        for payload in payloads:
            assert t1.send_nowait(N2, payload)
        assert t1.has_backlog()
        assert [await receive(t2) for _ in payloads] == [(N1, p) for p in payloads]
        await settled(lambda: not t1.has_backlog())
        stats = t1.statistics()
    assert stats.frames_out == 12
    assert stats.queued_frames == 0


async def test_held_frames_leave_in_one_write_per_peer_at_flush(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2, l3 = await listen(), await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2), N3: address(l3)}
    big = 1 << 20
    async with node(creds, N1, l1, peers, hold_sends=True, max_frame_size=big) as t1, \
            node(creds, N2, l2, peers, max_frame_size=big) as t2, \
            node(creds, N3, l3, peers, max_frame_size=big) as t3:
        assert t1.send_nowait(N2, "hello")  # the link may still be coming up: queued
        assert t1.send_nowait(N3, "hello")
        t1.flush()
        assert await receive(t2) == (N1, "hello")
        assert await receive(t3) == (N1, "hello")
        await settled(lambda: set(t1.connected_peers()) == {N2, N3} and not t1.has_backlog())
        before = t1.statistics()
        for i in range(5):
            assert t1.send_nowait(N2, i)
            assert t1.send_nowait(N3, -i)
        held = t1.statistics()
        assert held.direct_write_calls == before.direct_write_calls  # nothing written yet
        assert held.frames_out == before.frames_out
        assert t1.has_backlog()  # held frames count as not yet written
        t1.flush()
        after = t1.statistics()
        assert after.direct_write_calls == before.direct_write_calls + 2  # one per peer
        assert after.direct_writes == before.direct_writes + 10
        assert after.frames_out == before.frames_out + 10
        t1.flush()  # nothing held: nothing written
        assert t1.statistics().direct_write_calls == after.direct_write_calls
        assert [await receive(t2) for _ in range(5)] == [(N1, i) for i in range(5)]
        assert [await receive(t3) for _ in range(5)] == [(N1, -i) for i in range(5)]
        # A peer's held frames are written once they reach SEND_BATCH_BYTES, flush or not.
        await settled(lambda: not t1.has_backlog())
        half = "x" * (SEND_BATCH_BYTES // 2)
        calls = t1.statistics().direct_write_calls
        assert t1.send_nowait(N2, half)
        assert t1.statistics().direct_write_calls == calls
        assert t1.send_nowait(N2, half + "y")
        assert t1.statistics().direct_write_calls == calls + 1
        assert [await receive(t2) for _ in range(2)] == [(N1, half), (N1, half + "y")]

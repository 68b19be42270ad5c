"""Tests for phalanx.net.transport over real loopback TCP + mutual TLS (pytest-trio).

Synchronisation is by events, never by sleeps: a test waits for a delivered message or for the
transport's log record of what it did (`LogWaiter`). `trio.fail_after` guards only against a
hang; nothing asserts on elapsed time.
"""

from __future__ import annotations

import random
import ssl
import struct
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from transport_fakes import (
    GUARD,
    HOST,
    MAX_FRAME,
    N1,
    N2,
    N3,
    LogWaiter,
    address,
    decode,
    encode,
    listen,
    node,
    raw_peer,
    read_until_closed,
    receive,
    welcomed,
)

from phalanx.consensus.types import (
    LocalProtocolError,
)
from phalanx.net.framing import encode_frame
from phalanx.net.transport import (
    Backoff,
    PeerAddress,
    Transport,
)
from phalanx.ops import pki

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
    lax = pki.client_server_context(creds["n1"], require_client_cert=False)  # not for peers
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

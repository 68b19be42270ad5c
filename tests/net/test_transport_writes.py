"""Tests for phalanx.net.transport: how frames leave (the project's codec across the link,
delivery to a consumer, one encoding for several peers, direct writes, frames held for one
write per peer at `flush`), over real loopback TCP + mutual TLS (pytest-trio).

Synchronisation is by events, never by sleeps; `trio.fail_after` guards only against a hang.
"""


from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from transport_fakes import (
    GUARD,
    HOST,
    N1,
    N2,
    N3,
    LogWaiter,
    address,
    decode,
    listen,
    node,
    raw_peer,
    read_until_closed,
    receive,
    welcomed,
)

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
    PeerAddress,
    Transport,
)
from phalanx.ops import pki

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


async def test_after_read_follows_the_messages_of_each_read(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    """`after_read` runs once the frames of one read were delivered, before the reading
    task waits again: frames written in one record come in one read, then one call."""
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    events: list[object] = []
    ended = trio.Event()

    async def deliver(src: NodeId, message: object) -> None:
        events.append(message)

    def after_read() -> None:
        events.append("end")
        if len(events) >= 6:
            ended.set()

    async with node(creds, N1, l1, peers, hold_sends=True) as t1, \
            node(creds, N2, l2, peers, deliver=deliver, after_read=after_read):
        await settled(lambda: t1.connected_peers() == (N2,))
        for i in range(5):
            assert t1.send_nowait(N2, i)
        t1.flush()  # one write, one TLS record
        with trio.fail_after(GUARD):
            await ended.wait()
        assert events == [0, 1, 2, 3, 4, "end"]


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

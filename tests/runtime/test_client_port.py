"""The client port hands the calls of one read to the driver as one batch, in order.

Why it matters: the driver steps everything that reaches it in one pass together, and the
writes of a pass become one proposal (one entry, one AppendEntries, one fsync per node). A
port that handed calls over one by one let the core loop run between them, so 64 pipelined
writes on one connection became 64 proposals (issue #4: 755 -> ~2,000+ writes/s at 64
clients once batched). These tests run the real port over real TLS with a recording sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from runtime_helpers import HOST, RawClient, wait_for

from phalanx.consensus.types import ClientRequest
from phalanx.net import wire
from phalanx.net.client_protocol import (
    ClientCall,
    ClientReply,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.net.framing import encode_frame
from phalanx.ops import pki
from phalanx.ops.node_config import Address
from phalanx.runtime.client_port import ClientPort


class RecordingSink:
    """Records what the port hands over (a batch of calls, or a status request) and answers
    every call at once unless `hold` is set."""

    def __init__(self) -> None:
        self.items: list[tuple[str, ...]] = []
        self.hold = False
        self.held: list[tuple[ClientCall, object]] = []
        self.port: ClientPort | None = None

    async def calls(self, calls: Sequence[ClientCall], target: object) -> None:
        if not calls:
            return
        self.items.append(tuple(f"call{c.request.request_no}" for c in calls))
        for c in calls:
            if self.hold:
                self.held.append((c, target))
            else:
                self._answer(c, target)

    def _answer(self, c: ClientCall, target: object) -> None:
        target.deliver(ClientReply(  # type: ignore[attr-defined]
            client_id=c.request.client_id, request_no=c.request.request_no,
            status=ReplyStatus.OK, replica="n1", result=b"ok"))

    def release(self) -> None:
        held, self.held, self.hold = self.held, [], False
        for c, target in held:
            self._answer(c, target)

    async def request_status(self, nonce: int, target: object) -> None:
        self.items.append((f"status{nonce}",))
        target.deliver(StatusReply(  # type: ignore[attr-defined]
            nonce=nonce, node="n1", protocol="raft", role="leader", term=1, leader="n1",
            commit_index=0, applied_index=0, last_checkpoint=0, peers=()))

    def disconnected(self, target: object) -> None:
        pass


def frame(n: int, client_id: str = "c", *, read_only: bool = False) -> bytes:
    request = ClientRequest(client_id=client_id, request_no=n, command=b"x",
                            read_only=read_only)
    return encode_frame(wire.encode(ClientCall(request=request)))


async def serve(tmp_path: Path, sink: RecordingSink, nursery: trio.Nursery, *,
                max_in_flight: int = 1024) -> tuple[Address, pki.CredentialPaths]:
    """Run a port; returns its address and the credentials of client ``c`` (read-write)."""
    ca = pki.create_ca()
    pki.write_ca(ca, tmp_path / "ca")
    paths = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
    client = pki.write_credentials(pki.issue_client_cert(ca, "c"), tmp_path / "clients")
    port = ClientPort(sink, ssl_context=pki.client_server_context(paths), node_id="n1",
                      max_in_flight=max_in_flight)
    sink.port = port
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    await nursery.start(port.serve, listeners)
    address = Address(host=HOST, port=int(listeners[0].socket.getsockname()[1]))
    return address, client


async def test_calls_of_one_read_reach_the_driver_as_one_batch_in_order(tmp_path: Path) -> None:
    sink = RecordingSink()
    async with trio.open_nursery() as nursery:
        address, ca = await serve(tmp_path, sink, nursery)
        client = await RawClient.connect(address, ca)
        status = encode_frame(wire.encode(StatusCall(nonce=9)))
        # One write: five calls, a status call, two more calls.
        await client.send_raw(b"".join([*map(frame, range(1, 6)), status, frame(6), frame(7)]))
        replies = [await client.receive() for _ in range(8)]
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert sink.items == [("call1", "call2", "call3", "call4", "call5"), ("status9",),
                          ("call6", "call7")]
    assert sorted(r.request_no for r in replies if isinstance(r, ClientReply)) == list(
        range(1, 8))


async def test_a_full_connection_hands_over_what_it_holds_then_waits(tmp_path: Path) -> None:
    # max_in_flight=2: of four calls in one read, two are handed over; the port stops
    # reading until they are answered, then hands over the rest.
    sink = RecordingSink()
    sink.hold = True
    async with trio.open_nursery() as nursery:
        address, ca = await serve(tmp_path, sink, nursery, max_in_flight=2)
        client = await RawClient.connect(address, ca)
        await client.send_raw(b"".join(map(frame, range(1, 5))))
        await wait_for(lambda: sink.items == [("call1", "call2")])
        sink.release()
        replies = [await client.receive() for _ in range(4)]
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert sink.items[0] == ("call1", "call2")
    assert [n for batch in sink.items for n in batch] == ["call1", "call2", "call3", "call4"]
    assert len(replies) == 4


async def test_replies_are_written_from_the_answering_task_when_nothing_is_queued(
        tmp_path: Path) -> None:
    sink = RecordingSink()
    async with trio.open_nursery() as nursery:
        address, ca = await serve(tmp_path, sink, nursery)
        client = await RawClient.connect(address, ca)
        for n in range(1, 4):  # one call at a time: each reply goes out directly
            await client.send_raw(frame(n))
            reply = await client.receive()
            assert isinstance(reply, ClientReply)
            assert reply.request_no == n
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert sink.port is not None
    assert sink.port.stats.direct_replies == 3
    assert not sink.port.has_backlog()


async def test_batched_replies_wait_for_flush_and_leave_in_one_write(tmp_path: Path) -> None:
    sink = RecordingSink()
    sink.hold = True
    async with trio.open_nursery() as nursery:
        address, ca = await serve(tmp_path, sink, nursery)
        assert sink.port is not None
        sink.port.batch_replies = True
        client = await RawClient.connect(address, ca)
        await client.send_raw(b"".join(map(frame, range(1, 5))))
        await wait_for(lambda: len(sink.held) == 4)
        sink.release()  # answered as a driver pass would: nothing is written yet ...
        assert sink.port.has_backlog()
        before = sink.port.stats.bytes_out
        assert before == 0
        sink.port.flush()  # ... until the end of the pass: one write for the four
        assert not sink.port.has_backlog()
        assert sink.port.stats.direct_replies == 4
        replies = [await client.receive() for _ in range(4)]
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert [r.request_no for r in replies if isinstance(r, ClientReply)] == [1, 2, 3, 4]


async def test_a_reply_too_large_to_send_closes_only_its_connection(tmp_path: Path) -> None:
    class HugeSink(RecordingSink):
        def _answer(self, c: ClientCall, target: object) -> None:
            result = b"x" * 2048 if c.request.request_no == 1 else b"ok"
            target.deliver(ClientReply(  # type: ignore[attr-defined]
                client_id=c.request.client_id, request_no=c.request.request_no,
                status=ReplyStatus.OK, replica="n1", result=result))

    sink = HugeSink()
    async with trio.open_nursery() as nursery:
        address, ca = await serve(tmp_path, sink, nursery)
        assert sink.port is not None
        sink.port.max_reply_size = 1024
        doomed = await RawClient.connect(address, ca)
        await doomed.send_raw(frame(1))
        with trio.fail_after(10), pytest.raises(EOFError):
            await doomed.receive()
        other = await RawClient.connect(address, ca)
        await other.send_raw(frame(2))
        reply = await other.receive()
        assert isinstance(reply, ClientReply)
        assert reply.result == b"ok"
        await other.aclose()
        await doomed.aclose()
        nursery.cancel_scope.cancel()

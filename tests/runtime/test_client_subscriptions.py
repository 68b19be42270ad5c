"""Unasked answers (PBFT): `ClientWaiters` subscriptions and the client port's `ClientHello`.

Why it matters: a PBFT client sends a request to the primary alone; the backups execute it
from the primary's pre-prepare and must still answer the client (it needs f+1 matching
answers), on the connection the client subscribed with `ClientHello`. An answer must go to
the waiters if any, else to the subscriber, never to both; a closed connection leaves no
subscription behind; unasked answers must not free call slots (flow control) and are
bounded per connection.
"""

from __future__ import annotations

from pathlib import Path

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_helpers import HOST, RawClient, wait_for
from test_client_port import RecordingSink, frame

from phalanx.consensus.types import NodeId
from phalanx.net.client_protocol import (
    ClientHello,
    ClientHelloReply,
    ClientReply,
    ReplyStatus,
    StatusReply,
)
from phalanx.ops import pki
from phalanx.ops.node_config import Address
from phalanx.runtime.client_port import ClientPort
from phalanx.runtime.waiters import ClientWaiters


class Counters:
    replies = 0
    redirects = 0
    retries = 0


class Target:
    def __init__(self, name: str) -> None:
        self.name = name
        self.got: list[ClientReply | StatusReply] = []

    def deliver(self, reply: ClientReply | StatusReply) -> None:
        self.got.append(reply)


def waiters() -> ClientWaiters:
    return ClientWaiters(NodeId("n2"), Counters())


def test_an_unwaited_answer_goes_to_the_subscriber_of_the_client_or_its_lane() -> None:
    w, sub = waiters(), Target("sub")
    w.subscribe("me", sub)
    w.answer("me#3", 7, ReplyStatus.OK, result=b"r")
    w.answer("me", 8, ReplyStatus.ERROR, message="bad")
    w.answer("other", 9, ReplyStatus.OK, result=b"x")  # not subscribed: nobody
    w.answer("mex", 10, ReplyStatus.OK, result=b"x")  # a different client id
    assert [(r.client_id, r.request_no, r.status, r.replica) for r in sub.got
            if isinstance(r, ClientReply)] == [("me#3", 7, ReplyStatus.OK, "n2"),
                                                ("me", 8, ReplyStatus.ERROR, "n2")]


def test_waiters_take_the_answer_and_the_subscriber_gets_no_copy() -> None:
    w, sub, asked = waiters(), Target("sub"), Target("asked")
    w.subscribe("me", sub)
    w.add(("me#0", 1), asked)
    w.answer("me#0", 1, ReplyStatus.OK, result=b"r")
    assert len(asked.got) == 1
    assert sub.got == []


def test_only_results_are_sent_unasked() -> None:
    w, sub = waiters(), Target("sub")
    w.subscribe("me", sub)
    w.answer("me", 1, ReplyStatus.RETRY, message="view change")
    w.answer("me", 2, ReplyStatus.REDIRECT, leader_hint="n1")
    assert sub.got == []


def test_the_newest_subscription_wins_and_forget_drops_only_its_own() -> None:
    w, old, new = waiters(), Target("old"), Target("new")
    w.subscribe("me", old)
    w.subscribe("me", new)
    w.forget(old)
    w.answer("me", 1, ReplyStatus.OK)
    assert old.got == []
    assert len(new.got) == 1
    w.forget(new)
    w.answer("me", 2, ReplyStatus.OK)
    assert len(new.got) == 1
    assert w.subscriber("me") is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["sub", "add", "answer", "forget"]),
                          st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", "x#1"]),
                          st.integers(1, 3)), max_size=40))
def test_answers_follow_a_model_and_forget_leaves_nothing(
        ops: list[tuple[str, str, str, int]]) -> None:
    w = waiters()
    targets = {n: Target(n) for n in "abc"}
    subs: dict[str, str] = {}
    waiting: dict[tuple[str, int], list[str]] = {}
    expected: dict[str, int] = dict.fromkeys("abc", 0)
    for op, t, client, n in ops:
        if op == "sub" and "#" not in client:
            w.subscribe(client, targets[t])
            subs[client] = t
        elif op == "add":
            w.add((client, n), targets[t])
            waiting.setdefault((client, n), []).append(t)
        elif op == "answer":
            w.answer(client, n, ReplyStatus.OK)
            got = waiting.pop((client, n), [])
            if not got and client.partition("#")[0] in subs:
                got = [subs[client.partition("#")[0]]]
            for name in got:
                expected[name] += 1
        elif op == "forget":
            w.forget(targets[t])
            subs = {c: s for c, s in subs.items() if s != t}
            waiting = {k: [x for x in v if x != t] for k, v in waiting.items()}
            waiting = {k: v for k, v in waiting.items() if v}
    assert {n: len(t.got) for n, t in targets.items()} == expected
    for t in targets.values():
        w.forget(t)
    assert len(w) == 0
    assert all(w.subscriber(c) is None for c in ("x", "y"))


class SubscribingSink(RecordingSink):
    def __init__(self) -> None:
        super().__init__()
        self.subscribed: list[tuple[str, object]] = []

    def subscribe(self, client_id: str, target: object) -> None:
        self.subscribed.append((client_id, target))


async def serve(tmp_path: Path, sink: RecordingSink, nursery: trio.Nursery, *,
                max_in_flight: int = 1024,
                batch_replies: bool = False) -> tuple[ClientPort, Address, pki.CredentialPaths]:
    """Run a port; returns it, its address and the credentials of client ``me``."""
    ca = pki.create_ca()
    pki.write_ca(ca, tmp_path / "ca")
    paths = pki.write_credentials(pki.issue_node_cert(ca, "n1"), tmp_path / "n1")
    client = pki.write_credentials(pki.issue_client_cert(ca, "me"), tmp_path / "clients")
    port = ClientPort(sink, ssl_context=pki.client_server_context(paths), node_id="n1",
                      max_in_flight=max_in_flight, batch_replies=batch_replies)
    sink.port = port
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    await nursery.start(port.serve, listeners)
    address = Address(host=HOST, port=int(listeners[0].socket.getsockname()[1]))
    return port, address, client


def unasked(n: int) -> ClientReply:
    return ClientReply(client_id="me#0", request_no=n, status=ReplyStatus.OK, replica="n1",
                       result=b"r")


async def test_hello_subscribes_when_the_sink_can_route_unasked_answers(tmp_path: Path) -> None:
    sink = SubscribingSink()
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, sink, nursery)
        client = await RawClient.connect(address, ca)
        await client.send(ClientHello(client_id="me"))
        assert await client.receive() == ClientHelloReply(client_id="me", subscribed=True)
        await client.send(ClientHello(client_id="me#1"))  # a lane: its client's subscription
        assert await client.receive() == ClientHelloReply(client_id="me#1", subscribed=False)
        assert [c for c, _ in sink.subscribed] == ["me"]
        assert port.stats.subscriptions == 1
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_hello_is_refused_by_a_sink_without_subscriptions(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, RecordingSink(), nursery)
        client = await RawClient.connect(address, ca)
        await client.send(ClientHello(client_id="me"))
        assert await client.receive() == ClientHelloReply(client_id="me", subscribed=False)
        assert port.stats.subscriptions == 0
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_unasked_answers_hold_no_call_slot_and_are_bounded(tmp_path: Path) -> None:
    # max_in_flight=2: two unasked answers may wait unwritten, a third is dropped; once
    # written, neither has freed (or taken) a call slot: two calls still fit.
    sink = SubscribingSink()
    async with trio.open_nursery() as nursery:
        port, address, ca = await serve(tmp_path, sink, nursery, max_in_flight=2,
                                        batch_replies=True)
        client = await RawClient.connect(address, ca)
        await client.send(ClientHello(client_id="me"))
        assert await client.receive() == ClientHelloReply(client_id="me", subscribed=True)
        (_, conn), = sink.subscribed
        for n in (1, 2, 3):
            conn.deliver(unasked(n))  # type: ignore[attr-defined]
        assert port.stats.unasked_dropped == 1
        port.flush()
        got = [await client.receive(), await client.receive()]
        assert [r.request_no for r in got if isinstance(r, ClientReply)] == [1, 2]
        assert conn.slots.value == 2  # type: ignore[attr-defined]
        assert conn.unasked == 0  # type: ignore[attr-defined]
        sink.hold = True
        await client.send_raw(frame(5, "me") + frame(6, "me") + frame(7, "me"))
        await wait_for(lambda: len(sink.held) == 2)  # the third waits for a slot
        sink.release()
        port.flush()
        await wait_for(lambda: len(sink.held) == 0 and sink.items[-1] == ("call7",))
        await client.aclose()
        nursery.cancel_scope.cancel()

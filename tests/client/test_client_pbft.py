"""PBFT mode of phalanx.client.Client against fake nodes (real loopback TLS, pytest-trio).

What is pinned here (Castro-Liskov §4.1): a result needs f+1 matching answers from distinct
replicas (by certificate); a request goes to the primary alone only when f+1 replicas name
that primary and enough backups subscribed to answer it unasked; a retransmission (the
primary silent past `attempt_timeout`, or its connection lost) goes to every replica, with
the same request number. No test asserts on elapsed time: `trio.fail_after` only guards
against hangs, and short timeouts only make the unhappy paths quick.
"""

from __future__ import annotations

import pytest
import trio
from client_fakes import (
    Action,
    Behaviour,
    Certs,
    Drop,
    FakeNode,
    KvBackend,
    Silent,
    cluster,
    make_certs,
    reply,
    serve_kv,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.client.async_client import Client, ClientTimeout, RequestRejected
from phalanx.client.bft_calls import choose_primary
from phalanx.client.connection import NodeSlot
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus

NAMES = ("n1", "n2", "n3", "n4")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), NAMES)


# --------------------------------------------------------------------------------------------
# f+1 matching replies from distinct replicas


async def test_pbft_accepts_f_plus_one_matching_and_outvotes_a_liar(certs: Certs) -> None:
    backends = {n: KvBackend() for n in NAMES}

    async def honest(node: FakeNode, call: ClientCall) -> Action:
        node.backend = backends[node.node_id]
        return await serve_kv(node, call)

    async def liar(node: FakeNode, call: ClientCall) -> Action:
        # Lies about the result and claims to be n1, twice: neither may count.
        return reply(node, call, ReplyStatus.OK, result=b"\x00forged", replica="n1")

    async def down(node: FakeNode, call: ClientCall) -> Action:
        return Drop()

    behaviours = {"n1": honest, "n2": liar, "n3": honest, "n4": down}
    async with cluster(certs, behaviours, protocol="pbft") as (client, nodes):
        await client.put("k", b"v")
        assert await client.get("k") == b"v"
    for name in NAMES:
        assert len(set(nodes[name].request_ids())) <= 2  # one put, one get


async def test_pbft_without_f_plus_one_matching_times_out(certs: Certs) -> None:
    async def honest(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.OK, result=b"honest")

    async def liar(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.OK, result=b"forged", replica="n1")

    async def silent(node: FakeNode, call: ClientCall) -> Action:
        return Silent()

    behaviours = {"n1": honest, "n2": liar, "n3": silent, "n4": silent}
    async with cluster(certs, behaviours, protocol="pbft", timeout=0.4,
                       attempt_timeout=0.1) as (client, nodes):
        with pytest.raises(ClientTimeout):
            await client.call(b"cmd")
        # Retransmissions to every replica reuse the request number.
        assert len(nodes["n1"].received) >= 2
        assert len(set(nodes["n1"].request_ids())) == 1


async def test_pbft_f_plus_one_errors_reject(certs: Certs) -> None:
    async def refuse(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.ERROR, message="malformed")

    async def liar(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.OK, result=b"forged")

    async def silent(node: FakeNode, call: ClientCall) -> Action:
        return Silent()

    behaviours = {"n1": refuse, "n2": liar, "n3": refuse, "n4": silent}
    async with cluster(certs, behaviours, protocol="pbft") as (client, _):
        with pytest.raises(RequestRejected, match="malformed"):
            await client.call(b"cmd")


# --------------------------------------------------------------------------------------------
# The primary alone, subscriptions, retransmission to all


def replicated(backend: KvBackend, nodes: dict[str, FakeNode]) -> Behaviour:
    """A primary over `backend` that, like a PBFT primary's pre-prepare, makes every
    subscribed backup answer the request unasked (with the same result)."""

    async def primary(node: FakeNode, call: ClientCall) -> Action:
        answer = await serve_kv(node, call)
        if isinstance(answer, ClientReply):
            for other in nodes.values():
                if other is not node:
                    await other.push(reply(other, call, answer.status, result=answer.result,
                                           message=answer.message))
        return answer

    return primary


async def warm_up(client: Client, nodes: dict[str, FakeNode]) -> None:
    """The first call goes to every replica and probes who is primary; wait until every
    node named it and every connection is subscribed (as far as the nodes allow)."""
    await client.put("warm", b"up")
    slots = client._pool.slots
    # Polls the client's own state: there is no event to wait on.
    for _ in range(2000):
        if all(s.primary_claim == nodes[n].primary and s.subscribed == nodes[n].subscribable
               for n, s in slots.items()):
            break
        await trio.sleep(0.005)
    else:
        raise AssertionError("the probes and hellos were never answered")
    for node in nodes.values():
        node.received.clear()
    assert client.statistics().primary_only == 0


async def test_pbft_sends_to_the_primary_alone_once_backups_subscribe(certs: Certs) -> None:
    backend = KvBackend()
    nodes: dict[str, FakeNode] = {}
    primary = replicated(backend, nodes)

    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        return await (primary if node.node_id == "n1" else serve_kv)(node, call)

    async with cluster(certs, dict.fromkeys(NAMES, behaviour), backend, protocol="pbft",
                       client_id="me") as (client, started):
        nodes.update(started)
        for node in nodes.values():
            node.primary, node.subscribable = "n1", True
        await warm_up(client, nodes)
        for i in range(5):
            await client.put(f"k{i}", str(i).encode())
        assert [await client.get(f"k{i}") for i in range(5)] == [str(i).encode()
                                                                  for i in range(5)]
        assert client.statistics().primary_only == 10
        assert client.statistics().retries == 0
    assert len(nodes["n1"].received) == 10
    for name in ("n2", "n3", "n4"):
        assert nodes[name].received == []
        assert nodes[name].hellos == ["me"]
    assert len(backend.applied) == 6  # warm-up + 5 puts, each once


async def test_pbft_stale_reads_go_to_every_replica(certs: Certs) -> None:
    # Each replica answers a STALE read from its own state: the primary alone would give
    # one answer, never f+1.
    backend = KvBackend()
    async with cluster(certs, dict.fromkeys(NAMES, serve_kv), backend,
                       protocol="pbft") as (client, nodes):
        for node in nodes.values():
            node.primary, node.subscribable = "n1", True
        await warm_up(client, nodes)
        assert await client.get("warm", stale=True) == b"up"
        assert client.statistics().primary_only == 0
        assert client.statistics().retries == 0
    for node in nodes.values():
        assert len(node.received) == 1


async def test_pbft_broadcasts_when_nodes_do_not_subscribe(certs: Certs) -> None:
    backend = KvBackend()
    async with cluster(certs, dict.fromkeys(NAMES, serve_kv), backend,
                       protocol="pbft") as (client, nodes):
        for node in nodes.values():
            node.primary = "n1"  # named by all, but nobody answers unasked
        await warm_up(client, nodes)
        await client.put("k", b"v")
        assert client.statistics().primary_only == 0
    for node in nodes.values():
        assert len(node.received) == 1


async def test_pbft_one_claim_is_not_enough_to_trust_a_primary(certs: Certs) -> None:
    # A single (possibly Byzantine) replica naming itself primary must not capture requests.
    backend = KvBackend()
    async with cluster(certs, dict.fromkeys(NAMES, serve_kv), backend,
                       protocol="pbft") as (client, nodes):
        for node in nodes.values():
            node.subscribable = True
        nodes["n2"].primary = "n2"
        await warm_up(client, nodes)
        await client.put("k", b"v")
        assert client.statistics().primary_only == 0
    for node in nodes.values():
        assert len(node.received) == 1


async def test_pbft_silent_primary_is_bypassed_by_a_broadcast(certs: Certs) -> None:
    # A primary that ignores requests: the retransmission reaches every backup (whose
    # view-change timers would then run) and they answer with the same request number.
    backend = KvBackend()
    silent = {"on": False}

    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        if node.node_id == "n1" and silent["on"]:
            return Silent()
        return await serve_kv(node, call)

    async with cluster(certs, dict.fromkeys(NAMES, behaviour), backend, protocol="pbft",
                       attempt_timeout=0.2) as (client, nodes):
        for node in nodes.values():
            node.primary, node.subscribable = "n1", True
        await warm_up(client, nodes)
        silent["on"] = True
        await client.put("k", b"v")
        stats = client.statistics()
        assert stats.primary_only == 1
        assert stats.retries == 1
    assert len(nodes["n1"].received) == 2  # the attempt alone, then the retransmission
    for name in ("n2", "n3", "n4"):
        assert len(nodes[name].received) == 1
    assert {i for n in nodes.values() for i in n.request_ids()} == {
        nodes["n1"].request_ids()[0]}
    assert len(backend.applied) == 2  # warm-up + the put, once


async def test_pbft_lost_primary_connection_retransmits_at_once(certs: Certs) -> None:
    # The primary drops the connection: the call goes to every replica right away, not
    # after attempt_timeout (which here is longer than the whole deadline).
    backend = KvBackend()
    dropping = {"on": False}

    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        if node.node_id == "n1" and dropping["on"]:
            return Drop()
        return await serve_kv(node, call)

    async with cluster(certs, dict.fromkeys(NAMES, behaviour), backend, protocol="pbft",
                       attempt_timeout=0.5) as (client, nodes):
        for node in nodes.values():
            node.primary, node.subscribable = "n1", True
        await warm_up(client, nodes)
        dropping["on"] = True
        client.attempt_timeout = 30.0
        await client.put("k", b"v")
        assert client.statistics().primary_only == 1
    for name in ("n2", "n3", "n4"):
        assert len(nodes[name].received) == 1




# --------------------------------------------------------------------------------------------
# choose_primary: the rule for sending a request to the primary alone


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.booleans(), st.booleans(),
                       st.one_of(st.none(), st.integers(0, n - 1))),
             min_size=n, max_size=n))))
def test_choose_primary_needs_f_plus_one_claims_and_enough_subscribed_backups(
        case: tuple[int, list[tuple[bool, bool, int | None]]]) -> None:
    n, states = case
    order = tuple(f"n{i}" for i in range(n))
    slots = {}
    for name, (connected, subscribed, claim) in zip(order, states, strict=True):
        slot = NodeSlot(name, "127.0.0.1", 1)
        slot.connected, slot.subscribed = connected, subscribed
        slot.primary_claim = None if claim is None else order[claim]
        slots[name] = slot
    f = (n - 1) // 3
    chosen = choose_primary(slots, order, f)
    claims = {p: sum(1 for s in slots.values() if s.connected and s.primary_claim == p)
              for p in order}
    trusted = [p for p in order if claims[p] > f]
    if chosen is None:
        # Nothing qualified: no trusted claim, or the first trusted one lacks its connection
        # or enough subscribed backups.
        if trusted:
            p = trusted[0]
            ready = sum(1 for q, s in slots.items() if q != p and s.connected and s.subscribed)
            assert not slots[p].connected or ready < n - 1 - f
    else:
        assert chosen == trusted[0]
        assert slots[chosen].connected
        assert sum(1 for q, s in slots.items()
                   if q != chosen and s.connected and s.subscribed) >= n - 1 - f

"""The fault-injection proxy: forwarding, partitions that block and heal, delay under TLS,
and the partition geometry (`nemesis.cut_links`) every interpreter shares."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from phalanx.jepsen import nemesis
from phalanx.jepsen.harness.proxy import LinkProxy, ProxyNetwork
from phalanx.ops import pki


async def _echo(stream: trio.abc.Stream) -> None:
    async with stream:
        try:
            async for data in stream:
                await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _echo_server(nursery: trio.Nursery) -> int:
    listeners = await nursery.start(trio.serve_tcp, _echo, 0)
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def _proxy(nursery: trio.Nursery, target_port: int) -> LinkProxy:
    proxy = LinkProxy(src="a", dst="b", target=("127.0.0.1", target_port),
                      rng=random.Random(1))
    await nursery.start(proxy.serve)
    return proxy


async def _roundtrip(stream: trio.abc.Stream, payload: bytes) -> bytes:
    await stream.send_all(payload)
    got = b""
    while len(got) < len(payload):
        data = await stream.receive_some(65536)
        if not data:
            break
        got += data
    return got


@pytest.fixture
async def echo_proxy(nursery: trio.Nursery) -> AsyncIterator[LinkProxy]:
    port = await _echo_server(nursery)
    return await _proxy(nursery, port)


async def test_forwards_bytes_in_order_both_ways(echo_proxy: LinkProxy) -> None:
    payload = bytes(range(256)) * 1000  # larger than one chunk
    async with await trio.open_tcp_stream("127.0.0.1", echo_proxy.port) as s:
        assert await _roundtrip(s, payload) == payload
    assert echo_proxy.stats.accepted == 1
    assert echo_proxy.stats.bytes_forwarded >= 2 * len(payload)


async def test_partition_closes_live_connections_refuses_new_ones_and_heals(
    echo_proxy: LinkProxy,
) -> None:
    live = await trio.open_tcp_stream("127.0.0.1", echo_proxy.port)
    assert await _roundtrip(live, b"before") == b"before"
    echo_proxy.block()
    with trio.fail_after(5):  # the live connection is closed by the proxy
        try:
            data = await live.receive_some(10)
        except trio.BrokenResourceError:
            data = b""
    assert data == b""
    await live.aclose()
    async with await trio.open_tcp_stream("127.0.0.1", echo_proxy.port) as refused:
        with trio.fail_after(5):
            try:
                got = await _roundtrip(refused, b"during")
            except trio.BrokenResourceError:
                got = b""
        assert got == b""
    assert echo_proxy.stats.refused >= 1
    assert echo_proxy.stats.closed_by_partition == 1
    echo_proxy.unblock()
    async with await trio.open_tcp_stream("127.0.0.1", echo_proxy.port) as healed:
        assert await _roundtrip(healed, b"after") == b"after"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> pki.CredentialPaths:
    root: Path = tmp_path_factory.mktemp("proxy-tls")
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    return pki.write_credentials(pki.issue_node_cert(ca, "n1"), root / "nodes")


async def test_delay_holds_bytes_and_tls_still_works(
    nursery: trio.Nursery, tls: pki.CredentialPaths
) -> None:
    server_ctx = pki.peer_server_context(tls)
    client_ctx = pki.peer_client_context(tls)

    async def tls_echo(stream: trio.SocketStream) -> None:
        await _echo(trio.SSLStream(stream, server_ctx, server_side=True))

    listeners = await nursery.start(trio.serve_tcp, tls_echo, 0)
    proxy = await _proxy(nursery, listeners[0].socket.getsockname()[1])
    proxy.delay = 0.2
    raw = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    async with trio.SSLStream(raw, client_ctx, server_hostname="n1") as s:
        with trio.fail_after(10):
            await s.do_handshake()
            await s.send_all(b"ping")
            # Held for at least `delay` each way: nothing can be back before that.
            with trio.move_on_after(0.1):
                early = await s.receive_some(10)
                pytest.fail(f"got {early!r} before the delay elapsed")
            assert await s.receive_some(10) == b"ping"


async def test_network_routes_every_directed_link_and_blocks_exactly_the_given_ones(
    nursery: trio.Nursery,
) -> None:
    ports = {n: await _echo_server(nursery) for n in ("n1", "n2", "n3")}
    network = ProxyNetwork({n: ("127.0.0.1", p) for n, p in ports.items()},
                           rng=random.Random(3))
    await nursery.start(network.serve)
    assert sorted(network.links) == [(a, b) for a in ports for b in ports if a != b]
    network.block([("n1", "n2")])
    assert network.blocked() == (("n1", "n2"),)
    for (src, dst) in sorted(network.links):
        host, port = network.address(src, dst)
        async with await trio.open_tcp_stream(host, port) as s:
            with trio.fail_after(5):
                try:
                    got = await _roundtrip(s, b"x")
                except trio.BrokenResourceError:
                    got = b""
        assert got == (b"" if (src, dst) == ("n1", "n2") else b"x"), (src, dst)
    network.reset()
    assert network.blocked() == ()
    with pytest.raises(ValueError, match="no such links"):
        network.block([("n1", "n9")])


NODES = ("n1", "n2", "n3", "n4", "n5")


@st.composite
def partition_events(draw: st.DrawFn) -> nemesis.FaultEvent:
    kind = draw(st.sampled_from(nemesis.PARTITIONS))
    schedule = nemesis.generate_schedule(
        random.Random(draw(st.integers(0, 2**32))), nodes=NODES, faults=(kind,),
        duration_ns=3_000_000_000)
    starts = [e for e in schedule if e.action == "start"]
    return draw(st.sampled_from(starts))


@given(event=partition_events(), leader=st.sampled_from(NODES))
def test_cut_links_geometry(event: nemesis.FaultEvent, leader: str) -> None:
    cut = nemesis.cut_links(event, NODES, leader=leader)
    assert cut == sorted(set(cut))
    assert all(a != b and a in NODES and b in NODES for a, b in cut)
    kind = event.fault
    if kind in (nemesis.PARTITION_ONE, nemesis.PARTITION_HALVES, nemesis.ISOLATE_LEADER):
        assert set(cut) == {(b, a) for a, b in cut}  # symmetric
        assert cut  # something is cut
    if kind == nemesis.ISOLATE_LEADER:
        assert set(cut) == {(leader, n) for n in NODES if n != leader} | {
            (n, leader) for n in NODES if n != leader}
    if kind == nemesis.PARTITION_ASYMMETRIC:
        senders, receivers = event.groups
        assert set(cut) == {(a, b) for a in senders for b in receivers}
        assert not any((b, a) in set(cut) for a, b in cut)  # the reverse direction flows
    if kind == nemesis.PARTITION_RING:
        for n in NODES:  # each node keeps exactly its two ring neighbours, both ways
            kept_out = [b for b in NODES if b != n and (n, b) not in cut]
            assert len(kept_out) == 2


def test_cut_links_without_a_leader_cuts_nothing_and_rejects_non_partitions() -> None:
    event = nemesis.FaultEvent(at_ns=0, action="start", fault=nemesis.ISOLATE_LEADER,
                               episode=0)
    assert nemesis.cut_links(event, NODES, leader=None) == []
    kill = nemesis.FaultEvent(at_ns=0, action="start", fault=nemesis.KILL, episode=0,
                              nodes=("n1",))
    with pytest.raises(nemesis.ScheduleError):
        nemesis.cut_links(kill, NODES)

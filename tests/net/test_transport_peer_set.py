"""A running transport's peer set changes (`phalanx.net.transport_peers`) and a node's links
following its configuration (`phalanx.runtime.peer_links`), over real loopback TCP + mTLS.

Synchronisation by delivered messages and polled link state, guarded by `trio.fail_after`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
from transport_fakes import GUARD, N1, N2, N3, address, listen, node, receive

from phalanx.consensus.types import Configuration, LocalProtocolError
from phalanx.net.transport import PeerAddress
from phalanx.ops import pki
from phalanx.runtime.peer_links import PeerLinks, parse_address


async def _until(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(GUARD):
        while not predicate():  # noqa: ASYNC110  (state of other tasks, no event)
            await trio.sleep(0.005)


async def test_a_peer_added_at_run_time_is_linked_both_ways_and_removed_again(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2, l3 = await listen(), await listen(), await listen()
    # n1 and n2 start without n3; n3 knows them (a new node laid out by `cluster add-node`)
    old = {N1: address(l1), N2: address(l2)}
    async with node(creds, N1, l1, old) as t1, node(creds, N2, l2, old) as t2, \
            node(creds, N3, l3, {**old, N3: address(l3)}) as t3:
        assert not t1.knows(N3)
        with pytest.raises(LocalProtocolError):
            t1.send_nowait(N3, "too early")
        assert t1.add_peer(N3, address(l3))
        assert not t1.add_peer(N3, address(l3))  # the same address: nothing to do
        t2.add_peer(N3, address(l3))
        assert t1.send_nowait(N3, "hello")
        assert await receive(t3) == (N1, "hello")
        await t3.send(N1, "back")  # n1 accepts n3 now
        assert await receive(t1) == (N3, "back")
        await _until(lambda: N3 in t1.connected_peers() and N3 in t2.connected_peers())
        assert t1.remove_peer(N3)
        assert not t1.remove_peer(N3)
        assert not t1.knows(N3)
        await _until(lambda: N3 not in t1.connected_peers())
        with pytest.raises(LocalProtocolError):
            t1.send_nowait(N3, "gone")
        # n3's messages to n1 are refused now (its link was closed, a new one is refused)
        await _until(lambda: t1.statistics().connections_refused > 0)
        assert t1.peers_added == 1
        assert t1.peers_removed == 1
        t2.send_nowait(N1, "still here")  # the others are untouched
        assert await receive(t1) == (N2, "still here")
        assert t1.add_peer(N3, address(l3))  # and back again, with a new queue
        assert t1.send_nowait(N3, "again")
        assert await receive(t3) == (N1, "again")


async def test_peer_links_follow_the_configuration(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1, l2, l3 = await listen(), await listen(), await listen()
    a3 = address(l3)
    async with node(creds, N1, l1, {N2: address(l2)}) as t1, \
            node(creds, N3, l3, {N1: address(l1), N2: address(l2), N3: a3}) as t3:
        links = PeerLinks(N1, t1, {N2: address(l2)})
        assert not links.send(N3, "no link yet")  # dropped and counted, not raised
        assert links.unknown_peer_drops == 1
        links.sync(Configuration(voters=(N1, N2)))
        assert links.peers() == (N2,)
        links.sync(Configuration(voters=(N1, N2), learners=(N3,),
                                 addresses=f"n1=ignored:1,n3={a3.host}:{a3.port}"))
        assert links.peers() == (N2, N3)  # never itself
        assert links.send(N3, "welcome")
        assert await receive(t3) == (N1, "welcome")
        links.sync(Configuration(voters=(N1, N3), voters_outgoing=(N1, N2, N3),
                                 addresses=f"n3={a3.host}:{a3.port}"))
        assert links.peers() == (N2, N3)  # joint: n2 still a member
        links.sync(Configuration(voters=(N1, N3), addresses=f"n3={a3.host}:{a3.port}"))
        assert links.peers() == (N3,)  # n2 left: unlinked
        links.sync(Configuration(voters=(N1, N2, N3)))  # a truncated log brought it back
        assert links.peers() == (N2, N3)
        links.sync(Configuration(voters=(N1, N2), addresses="n9=no-port"))
        assert links.bad_addresses == 1


@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:7001", PeerAddress(host="127.0.0.1", port=7001)),
    ("[::1]:7001", PeerAddress(host="::1", port=7001)),
    ("host:0", None), ("host:70000", None), ("host", None), (":1", None), ("h:x", None),
])
def test_parse_address(text: str, want: PeerAddress | None) -> None:
    assert parse_address(text) == want

"""A restarted peer is redialled as soon as it connects to us, not after a grown backoff.

The dialer's backoff here is ten minutes; the hang guard is `GUARD` seconds, so the test can
only pass if the inbound connection cut the sleep short. Synchronisation is by events and
statistics, never by elapsed time.
"""

from __future__ import annotations

import trio
from transport_fakes import GUARD, HOST, N1, N2, address, listen, node, receive

from phalanx.net.transport import Backoff, PeerAddress
from phalanx.ops import pki

LONG = Backoff(base=600.0, cap=600.0)


async def test_inbound_connection_cuts_the_redial_backoff_short(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    l1 = await listen()
    down = await listen()
    port = down[0].socket.getsockname()[1]
    for listener in down:
        await listener.aclose()  # n2 is down: dials to it are refused
    peers = {N1: address(l1), N2: PeerAddress(host=HOST, port=port)}
    async with node(creds, N1, l1, peers, backoff=LONG) as t1:
        with trio.fail_after(GUARD):
            while t1.statistics().dial_failures == 0:  # noqa: ASYNC110 (no event to wait on)
                await trio.sleep(0.01)
        # n1 now sleeps 5-10 minutes before its next dial. n2 comes up and dials n1.
        l2 = await listen(port)
        async with node(creds, N2, l2, peers) as t2:
            assert t1.send_nowait(N2, {"hello": 1})
            src, message = await receive(t2)
            assert (src, message) == (N1, {"hello": 1})
            assert t1.statistics().early_redials == 1


async def test_redial_after_inbound_is_counted_once_per_sleep(
    creds: dict[str, pki.CredentialPaths],
) -> None:
    # With both up and linked, an inbound (re)connection finds no sleeping dialer: nothing
    # to cut short, nothing counted.
    l1, l2 = await listen(), await listen()
    peers = {N1: address(l1), N2: address(l2)}
    async with node(creds, N1, l1, peers) as t1, node(creds, N2, l2, peers) as t2:
        t1.send_nowait(N2, "a")
        t2.send_nowait(N1, "b")
        assert (await receive(t2))[1] == "a"
        assert (await receive(t1))[1] == "b"
        assert t1.statistics().early_redials == 0
        assert t2.statistics().early_redials == 0


"""Fault-injection TCP proxies: one per directed peer link, controlled in-process.

Owns:
    * `LinkProxy`: listens on a loopback port; node `src` dials it instead of node `dst`'s
      peer port (the harness rewrites ``peers[].peer_addr`` in `src`'s config), and every
      accepted connection is forwarded to `dst`. The transport uses one TCP connection per
      direction (`phalanx.net.transport`), so this proxy carries exactly `src`'s messages to
      `dst` (plus the acceptor's one-frame welcome and the TLS handshake going back).
    * `ProxyNetwork`: the n*(n-1) proxies of a cluster and the nemesis-facing controls:
      `block(links)` / `heal()`, `set_delay`, `set_loss`, `set_duplicate`. With twins
      (two processes of one node, `phalanx.jepsen.harness.cluster`) the links are keyed by
      source *instance* and destination node: each honest peer's link to a twinned node
      leads to the twin of its side, and a twin's links to the other side's peers are
      refused for the whole run. The peer transport keeps one inbound connection per
      certificate identity and a newer one replaces the older
      (`phalanx.net.transport`), so two twins reaching one peer would kick each other out
      in a loop; with the refused links every peer only ever sees one of them.

What each fault does to a link, and why (peer links are mutual TLS; the proxy only sees
opaque bytes and must never alter them, or TLS would simply reject the stream):
    * blocked (partition): existing connections are closed and new ones are accepted and
      closed at once, so the dialer sees refused handshakes and backs off. Heal = stop
      refusing; the dialer reconnects on its own.
    * delay: every chunk read is held until ``read time + delay`` before it is written on,
      in order, so latency grows while throughput does not collapse.
    * loss: dropping bytes inside a TLS stream breaks the stream, which is what a lossy link
      does to TCP in the end: retransmission stalls and, eventually, resets. Per chunk, with
      probability ``loss`` the direction stalls for 50..300 ms (a retransmission timeout),
      and with probability ``loss / 10`` the connection is reset.
    * duplicate: TCP deduplicates segments and TLS rejects replayed records, so a duplicated
      packet never reaches the application on a real link. Application-level duplicates
      only arise from retransmission after a reconnect; the proxy models that by resetting
      the connection with probability ``duplicate / 5`` per chunk, which forces the
      reconnect path. Message-level duplication is covered by the simulator.

Rules:
    * Bytes are forwarded unchanged and in order, or the connection is closed: never
      reordered, altered or injected.
    * Randomness comes from a per-proxy seeded `random.Random`; no global random.
    * Must not import node internals, consensus cores or storage.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import trio

CHUNK = 65536
_QUEUE = 256  # chunks held per direction while delayed


@dataclass(slots=True)
class LinkStatistics:
    """Counters of one directed link."""

    accepted: int = 0
    refused: int = 0
    closed_by_partition: int = 0
    resets: int = 0
    stalls: int = 0
    bytes_forwarded: int = 0


class LinkProxy:
    """The proxy of the directed link `src` → `dst` (see the module docstring)."""

    def __init__(self, *, src: str, dst: str, target: tuple[str, int], rng: random.Random):
        self.src = src
        self.dst = dst
        self.target = target
        self.blocked = False
        self.delay = 0.0
        """Seconds each chunk is held."""
        self.loss = 0.0
        self.duplicate = 0.0
        self.stats = LinkStatistics()
        self._rng = rng
        self._live: list[trio.CancelScope] = []
        self._listener: trio.SocketListener | None = None

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError(f"proxy {self.src}->{self.dst} is not listening yet")
        port: int = self._listener.socket.getsockname()[1]
        return port

    def block(self) -> None:
        """Refuse new connections and close the live ones."""
        self.blocked = True
        for scope in self._live:
            self.stats.closed_by_partition += 1
            scope.cancel()

    def unblock(self) -> None:
        self.blocked = False

    async def serve(
        self,
        host: str = "127.0.0.1",
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on an ephemeral port of `host` and forward until cancelled."""
        listeners = await trio.open_tcp_listeners(0, host=host)
        self._listener = listeners[0]
        async with self._listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await self._listener.accept()
                nursery.start_soon(self._handle, stream)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        async with downstream:
            if self.blocked:
                self.stats.refused += 1
                return
            try:
                upstream = await trio.open_tcp_stream(*self.target)
            except OSError:
                self.stats.refused += 1
                return
            self.stats.accepted += 1
            async with upstream:
                with trio.CancelScope() as scope:
                    self._live.append(scope)
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._pump, downstream, upstream, nursery)
                            nursery.start_soon(self._pump, upstream, downstream, nursery)
                    finally:
                        self._live.remove(scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, conn: trio.Nursery
    ) -> None:
        """Copy `source` to `sink` through a delay queue; any end or error ends the connection."""
        send, receive = trio.open_memory_channel[tuple[float, bytes]](_QUEUE)

        async def reader() -> None:
            async with send:
                stall_until = -math.inf
                while True:
                    try:
                        data = await source.receive_some(CHUNK)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        return
                    if not data:
                        return
                    now = trio.current_time()
                    if self.loss and self._rng.random() < self.loss:
                        self.stats.stalls += 1
                        stall_until = max(stall_until, now + self._rng.uniform(0.05, 0.3))
                    reset_p = self.loss / 10 + self.duplicate / 5
                    if reset_p and self._rng.random() < reset_p:
                        self.stats.resets += 1
                        return
                    await send.send((max(now + self.delay, stall_until), data))

        async def writer(inner: trio.Nursery) -> None:
            async with receive:
                async for due, data in receive:
                    await trio.sleep_until(due)
                    try:
                        await sink.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        inner.cancel_scope.cancel()
                        return
                    self.stats.bytes_forwarded += len(data)

        async with trio.open_nursery() as inner:
            inner.start_soon(reader)
            inner.start_soon(writer, inner)
        conn.cancel_scope.cancel()  # one direction ended: the connection is over


Link = tuple[str, str]


def _any(identities: Mapping[str, str], node: str) -> str:
    return min(s for s, n in identities.items() if n == node)


class ProxyNetwork:
    """Every directed peer link of a cluster, each through its own `LinkProxy`."""

    def __init__(
        self,
        targets: Mapping[str, tuple[str, int]],
        *,
        rng: random.Random,
        identities: Mapping[str, str] | None = None,
        routes: Mapping[Link, str | None] | None = None,
    ) -> None:
        """`targets`: each process instance → its real peer listen address.

        Without `identities` every instance is the node of the same name, and link
        ``(a, b)`` leads to ``b``. Twins (several instances of one node) pass `identities`
        (instance → node id) and `routes`: ``(src instance, dst node)`` → the instance that
        link reaches, or None for a link that is refused for the whole run (a twin never
        reaches the other side's peers). Links are keyed ``(src instance, dst node)``.
        """
        ids = dict(identities) if identities is not None else {t: t for t in targets}
        if set(ids) != set(targets):
            raise ValueError("identities must name exactly the instances of targets")
        self.identities = ids
        self.node_ids = tuple(sorted(set(ids.values())))
        self.links: dict[Link, LinkProxy] = {}
        self._fixed: set[Link] = set()
        for a in sorted(ids):
            for b in self.node_ids:
                if b == ids[a]:
                    continue
                to = b if routes is None else routes.get((a, b), b)
                if to is None:
                    self._fixed.add((a, b))
                elif to not in targets or ids[to] != b:
                    raise ValueError(f"link {a}->{b} routed to {to!r}, not an instance of {b}")
                self.links[(a, b)] = LinkProxy(
                    src=a, dst=b, target=targets[to if to is not None else _any(ids, b)],
                    rng=random.Random(rng.getrandbits(64)))
        for link in sorted(self._fixed):
            self.links[link].block()

    @property
    def fixed(self) -> tuple[Link, ...]:
        """Links refused for the whole run (twins' other side)."""
        return tuple(sorted(self._fixed))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every proxy; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            for link in sorted(self.links):
                await nursery.start(self.links[link].serve)
            task_status.started()

    def address(self, src: str, dst: str) -> tuple[str, int]:
        """Where `src` must dial to reach `dst`."""
        return ("127.0.0.1", self.links[(src, dst)].port)

    def block(self, links: Iterable[Link]) -> None:
        """Block exactly `links` (and heal every other link but the `fixed` ones).

        `links` are node-level ``(src node, dst node)`` pairs: a link from a twinned node
        blocks the links of every instance of it."""
        wanted: set[Link] = set(self._fixed)
        unknown = []
        for a, b in links:
            instances = [s for s in sorted(self.identities) if self.identities[s] == a]
            keys = [(s, b) for s in instances if (s, b) in self.links]
            if not keys:
                unknown.append((a, b))
            wanted.update(keys)
        if unknown:
            raise ValueError(f"no such links: {sorted(unknown)}")
        for link in sorted(self.links):
            if link in wanted:
                if not self.links[link].blocked:
                    self.links[link].block()
            else:
                self.links[link].unblock()

    def blocked(self) -> tuple[Link, ...]:
        """Links blocked by the nemesis (the `fixed` ones excluded)."""
        return tuple(sorted(k for k, p in self.links.items()
                            if p.blocked and k not in self._fixed))

    def heal(self) -> None:
        self.block(())

    def set_delay(self, seconds: float) -> None:
        for p in self.links.values():
            p.delay = seconds

    def set_loss(self, probability: float) -> None:
        for p in self.links.values():
            p.loss = probability

    def set_duplicate(self, probability: float) -> None:
        for p in self.links.values():
            p.duplicate = probability

    def reset(self) -> None:
        """Heal every fault: no partition, no delay, no loss, no duplication."""
        self.heal()
        self.set_delay(0.0)
        self.set_loss(0.0)
        self.set_duplicate(0.0)

    def statistics(self) -> dict[str, int]:
        names = [f.name for f in fields(LinkStatistics)]
        return {n: sum(getattr(p.stats, n) for p in self.links.values()) for n in names}

"""Admission of inbound connections on one listening port: how many, how many still
unauthenticated, how fast handshakes start.

Owns: `ConnectionGate` and its `GateStatistics`. The client port (`phalanx.runtime.client_port`)
and the peer transport (`phalanx.net.transport`) run every accepted socket through one.

Rules (a connection is input; shedding is counted, never raised):
- `max_connections`: sockets open on the port at once, handshaking or established. One
  accepted beyond it is closed at once, before any TLS work (`shed_full`). The node sizes it
  so that connections + its descriptor reserve fit the RLIMIT_NOFILE soft limit
  (`phalanx.runtime.descriptors`).
- `max_pending`: connections still in their TLS handshake (unauthenticated). When one more
  arrives, the OLDEST pending one is shed (`shed_pending`): a peer or client that completes
  its handshake in milliseconds still gets in while idle or slow sockets rotate out, and an
  established connection is never shed for a newcomer.
- `handshake_rate` / `handshake_burst` (optional): a token bucket on handshakes STARTED, so
  a flood of TLS handshakes costs at most that much of the event loop's CPU per second and
  peer traffic keeps its share (`rate_waits` counts handshakes that waited for a token).
  Waiting handshakes get tokens newest first, and only one of them sleeps for the next
  token: a pending set full of waiters must not wake all of them per token (that filled the
  leader's scheduler batches and cost it leadership, `bench/attack_handshakes.py`).

The listening socket itself gets a small accept backlog (`LISTEN_BACKLOG`, used by
`phalanx.runtime.node` for the client and the peer port): under a flood that outpaces the accept
loop
the kernel then drops the excess SYNs (real clients retry theirs) instead of queueing
thousands of connections whose clients have given up, which the node would later accept and
handshake one by one, long after the flood ended (`bench/attack_handshakes.py`).

Must not import: consensus, storage, apps, the codec. Runs under trio (its clock).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

LISTEN_BACKLOG = 128
"""Connections the kernel queues for `accept` on a node's port (the default, somaxconn, is
often 4,096). At the default client handshake rate (200/s) a full queue drains in ~0.6 s;
the node accepts far faster than that whenever it is not flooded."""


PEER_SLACK = 4
"""Unauthenticated connections a peer port holds beyond one per peer (`phalanx.net.transport`:
each peer may hold a connection it dialled and one it is replacing)."""


def max_peer_sockets(peer_count: int) -> int:
    """The most sockets a peer port holds open at once: two per peer plus `PEER_SLACK`."""
    return 2 * peer_count + PEER_SLACK


def max_peer_pending(peer_count: int) -> int:
    """The most peer-port connections still in their TLS handshake: one per peer plus
    `PEER_SLACK`."""
    return peer_count + PEER_SLACK


@dataclass(slots=True)
class GateStatistics:
    open: int = 0
    """Sockets open on the port now (handshaking or established)."""
    pending: int = 0
    """Of those, still in their TLS handshake."""
    peak_open: int = 0
    admitted: int = 0
    shed_full: int = 0
    """Sockets closed at once: `max_connections` were open."""
    shed_pending: int = 0
    """Handshakes cut short to make room for a newer one (`max_pending`)."""
    rate_waits: int = 0
    """Handshakes that waited for the rate limit's token."""


class ConnectionGate:
    """See the module docstring. Single trio loop; nothing is locked."""

    def __init__(self, *, max_connections: int, max_pending: int,
                 handshake_rate: float | None = None, handshake_burst: int = 1) -> None:
        if max_connections < 1 or max_pending < 1:
            raise ValueError(f"max_connections ({max_connections}) and max_pending "
                             f"({max_pending}) must be >= 1")
        if handshake_rate is not None and (handshake_rate <= 0 or handshake_burst < 1):
            raise ValueError(f"need handshake_rate > 0 and handshake_burst >= 1, got "
                             f"{handshake_rate} and {handshake_burst}")
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.handshake_rate = handshake_rate
        self.handshake_burst = handshake_burst
        self.stats = GateStatistics()
        self._pending: dict[int, trio.CancelScope] = {}
        """Handshakes in progress, oldest first (insertion order)."""
        self._serial = 0
        self._tokens = float(handshake_burst)
        self._refilled: float | None = None
        self._waiters: list[_Waiter] = []
        """Handshakes waiting for a token, oldest first."""
        self._timer: _Waiter | None = None
        """The waiter sleeping until the next token (it hands the token out)."""

    def try_open(self) -> bool:
        """Count a newly accepted socket; False (counted in `shed_full`) when the port is
        full: the caller closes it at once and must not call `closed`."""
        st = self.stats
        if st.open >= self.max_connections:
            st.shed_full += 1
            return False
        st.open += 1
        st.admitted += 1
        if st.open > st.peak_open:
            st.peak_open = st.open
        return True

    def closed(self) -> None:
        """A socket `try_open` admitted is closed."""
        self.stats.open -= 1

    @contextmanager
    def handshaking(self) -> Iterator[trio.CancelScope]:
        """The scope to run one connection's handshake in (rate wait included). A newer
        arrival over `max_pending` cancels it: check ``scope.cancelled_caught``."""
        st = self.stats
        if len(self._pending) >= self.max_pending:
            oldest = next(iter(self._pending))
            self._pending.pop(oldest).cancel()
            st.shed_pending += 1
        self._serial += 1
        key = self._serial
        with trio.CancelScope() as scope:
            self._pending[key] = scope
            st.pending = len(self._pending)
            try:
                yield scope
            finally:
                self._pending.pop(key, None)
                st.pending = len(self._pending)

    async def wait_turn(self) -> None:
        """Wait for the rate limit's token (no-op without a rate).

        Waiting handshakes get the tokens NEWEST first (as the pending set sheds the oldest:
        under a flood the newest arrival is the one with a chance to finish), and only one
        of them (the timer) sleeps until the next token and hands it out: the others stay
        parked, so a full pending set costs a wakeup or two per token, not one per waiter."""
        rate = self.handshake_rate
        if rate is None:
            return
        if not self._waiters and self._take(rate):
            await trio.lowlevel.checkpoint()
            return
        self.stats.rate_waits += 1
        me = _Waiter()
        self._waiters.append(me)
        try:
            while True:
                if self._timer is None:
                    self._timer = me
                    try:
                        while True:  # sleep until a token is there (a timer's job)
                            if self._take(rate):
                                break
                            await trio.sleep(max((1 - self._tokens) / rate, 1e-4))
                        newest = self._waiters.pop()  # the token is the newest waiter's
                        if newest is me:
                            return
                        newest.granted = True
                        newest.event.set()
                    finally:
                        self._timer = None
                else:
                    me.event = trio.Event()
                    await me.event.wait()
                    if me.granted:
                        return
        finally:
            if me in self._waiters:
                self._waiters.remove(me)
            if self._timer is None and self._waiters:
                self._waiters[-1].event.set()  # the newest takes over the timer

    def _take(self, rate: float) -> bool:
        """Refill the bucket; take a token if there is one."""
        now = trio.current_time()
        if self._refilled is not None:
            self._tokens = min(float(self.handshake_burst),
                               self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class _Waiter:
    """One handshake waiting for a token (compared by identity)."""

    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.granted = False


def unlimited() -> ConnectionGate:
    """A gate that never sheds (tests and embedders that bound nothing)."""
    return ConnectionGate(max_connections=2**31, max_pending=2**31,
                          handshake_rate=None, handshake_burst=1)


__all__ = ["LISTEN_BACKLOG", "ConnectionGate", "GateStatistics", "unlimited"]

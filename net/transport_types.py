"""The transport's plain records: where peers listen, how a dialer backs off, what it counts.

Owns: `PeerAddress`, `Backoff` (jittered exponential reconnect delays, a pure function of the
attempt number and an injected rng), `TransportStatistics` (a snapshot) and
`TransportCounters` (the live counters behind it). `phalanx.net.transport` re-exports them.
Must not import: trio, sockets, TLS, the codec; nothing here does I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerAddress:
    """Where a peer's listener can be reached."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Jittered exponential backoff ("equal jitter").

    The envelope for attempt ``k`` is ``e = min(cap, base * multiplier**k)``; the delay is
    uniform in ``[e/2, e]``, so it is never zero (no hot reconnect loop) and retries from many
    nodes spread out instead of arriving in lock-step.
    """

    base: float = 0.05
    cap: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"need 0 < base <= cap, got base={self.base} cap={self.cap}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def envelope(self, attempt: int) -> float:
        """The upper bound of the delay before retry number `attempt` (0-based)."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        bound = self.base
        for _ in range(attempt):
            bound *= self.multiplier
            if bound >= self.cap:
                return self.cap
        return min(bound, self.cap)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The delay before retry number `attempt`, drawn from `rng`."""
        envelope = self.envelope(attempt)
        return envelope / 2 + rng.uniform(0, envelope / 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportStatistics:
    """A snapshot of a transport's counters (monotonic, except `queued_frames`)."""

    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    connections_accepted: int
    connections_refused: int
    """Inbound connections refused: failed TLS handshake or unacceptable identity."""
    connections_replaced: int
    """Inbound connections closed because the same peer connected again."""
    outbound_established: int
    outbound_refused: int
    """Dials whose server named the wrong node id (or none)."""
    dial_failures: int
    """Dials that failed for any reason, including `outbound_refused` ones."""
    malformed_frames: int
    oversized_frames: int
    queue_full_drops: int
    frames_lost: int
    """Frames dequeued into a connection that broke before they were written."""
    queued_frames: int
    """Frames currently waiting in all send queues."""
    early_redials: int = 0
    """Reconnect sleeps cut short by an inbound connection from that peer (it restarted)."""
    direct_writes: int = 0
    """Frames `send_nowait` wrote from the caller's task (no queue, no link task hop)."""
    direct_write_calls: int = 0
    """TLS writes those direct frames took: one per frame, or one per peer per `flush` with
    `hold_sends` (`direct_writes / direct_write_calls` frames per write)."""
    down_drops: int = 0
    """Frames refused because the peer's link was down and `down_queue_capacity` were queued."""
    connections_shed: int = 0
    """Inbound sockets closed by the port's limits (`Transport.gate`): over the socket cap,
    or an unauthenticated handshake shed for a newer one."""


class TransportCounters:
    """The live counters behind `TransportStatistics` (mutated by the transport only)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "connections_accepted",
        "connections_refused",
        "connections_replaced",
        "dial_failures",
        "direct_write_calls",
        "direct_writes",
        "down_drops",
        "early_redials",
        "frames_in",
        "frames_lost",
        "frames_out",
        "malformed_frames",
        "outbound_established",
        "outbound_refused",
        "oversized_frames",
        "queue_full_drops",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    bytes_in: int
    bytes_out: int
    connections_accepted: int
    connections_refused: int
    connections_replaced: int
    direct_write_calls: int
    direct_writes: int
    dial_failures: int
    down_drops: int
    early_redials: int
    frames_in: int
    frames_lost: int
    frames_out: int
    malformed_frames: int
    outbound_established: int
    outbound_refused: int
    oversized_frames: int
    queue_full_drops: int

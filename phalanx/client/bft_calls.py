"""The PBFT call path of the client library: `PbftCalls`, a mixin of `phalanx.client.Client`.

Owns: how a PBFT request is sent and its answer accepted (Castro-Liskov §4.1), and
`choose_primary`, the pure rule for sending a request to the primary alone.

- Answers: a result is accepted once f+1 distinct replicas (by certificate, not by what
  they claim) return the same (status, result) (`pbft.client.ReplyCollector`).
- The primary alone: every connection starts with a `ClientHello` (the pool sends it),
  which subscribes it to this client's answers; replicas are probed for their status on
  first use, after a retransmission and every `PRIMARY_REFRESH` seconds. A request goes to
  the primary ALONE when `choose_primary` names one; the backups execute it from the
  primary's pre-prepare and answer it unasked (`phalanx.runtime.waiters`).
- Retransmission: when that attempt gets no f+1 matching answers within `attempt_timeout`,
  or the primary's connection fails, the request goes to every replica at once (same
  bytes, same request number); a backup that gets a request it has not seen ordered
  relays it to the primary and starts its view-change timer, so a primary that ignores
  requests is replaced. Later attempts go to every replica, after a jittered backoff.
- A wrong primary guess costs time (the guessed backup relays the request after
  `forward_ticks`, or the attempt times out), never safety: acceptance needs f+1 matching
  answers however the request was sent.

Must not import: consensus cores (except the pure `pbft.client.ReplyCollector` and
`quorum`), storage, the runtime. Not deterministic (the real clock), never pickles.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping

import trio

from phalanx.client.connection import (
    CallTimer,
    ClientStatistics,
    ConnectionPool,
    NodeSlot,
    PendingCall,
)
from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientReply, ReplyStatus, StatusCall
from phalanx.net.framing import encode_frame

PRIMARY_REFRESH = 2.0
"""Seconds between a PBFT client's status probes of every replica (who is primary), besides
the probes on first use and after a retransmission."""


def choose_primary(
    slots: Mapping[str, NodeSlot], order: tuple[str, ...], faults: int
) -> str | None:
    """The replica a request may be sent to alone, or None (send it to every replica).

    That is the first replica in `order` that more than `faults` connected replicas name as
    primary in their newest status answer, if its own connection is up and at least
    ``len(order) - 1 - faults`` of the other replicas are connected and subscribed (so the
    f+1 answers can come even if f of them are faulty). One replica's word (a Byzantine one
    naming itself) is never enough.
    """
    claims: dict[str, int] = {}
    for slot in slots.values():
        if slot.connected and slot.primary_claim is not None:
            claims[slot.primary_claim] = claims.get(slot.primary_claim, 0) + 1
    primary = next((p for p in order if claims.get(p, 0) > faults), None)
    if primary is None or not slots[primary].connected:
        return None
    subscribed = sum(1 for node, slot in slots.items()
                     if node != primary and slot.connected and slot.subscribed)
    if subscribed < len(order) - 1 - faults:
        return None
    return primary


class PbftCalls:
    """PBFT calls for `phalanx.client.Client`, which provides the state declared here."""

    attempt_timeout: float
    _slots: dict[str, NodeSlot]
    _order: tuple[str, ...]
    _faults: int
    _pool: ConnectionPool
    _timer: CallTimer
    _stats: ClientStatistics
    _primary_probed: float
    _next_nonce: int
    _check_open: Callable[[], None]
    _timed_out: Callable[[PendingCall[ClientReply], str | None], ClientTimeout]
    _back_off: Callable[[PendingCall[ClientReply], int, float, str | None], Awaitable[None]]

    async def _call_all(
        self, call: PendingCall[ClientReply], frame: bytes, deadline: float, *, alone: bool
    ) -> bytes:
        # Ref: Castro-Liskov §4.1 — the client sends to the primary, waits for f+1 replies
        # with the same result from distinct replicas (the replica is who the certificate
        # says, not the reply), and broadcasts to every replica on a retransmission.
        # Imported here: the package `phalanx.consensus.pbft` loads the whole PBFT core,
        # which a client of a Raft cluster (`phalanx kv`) has no use for.
        from phalanx.consensus.pbft.client import ReplyCollector

        collector = ReplyCollector(tuple(NodeId(n) for n in self._order))
        primary = self._primary_alone() if alone else None
        attempt = 0
        last_error: str | None = None
        while True:
            self._check_open()
            if trio.current_time() >= deadline:
                raise self._timed_out(call, last_error)
            if primary is not None:
                self._stats.primary_only += 1
                self._pool.send(primary, call, frame)
                for node, slot in self._slots.items():
                    if node != primary and slot.connected and slot.subscribed:
                        self._pool.register(node, call)
            else:
                for node in self._order:
                    self._pool.send(node, call, frame)
            until = min(deadline, trio.current_time() + self.attempt_timeout)
            while True:
                item = await call.next_before(until, self._timer)
                if item is None:
                    break
                node, reply = item
                if reply is None:
                    last_error = f"connection to {node} lost"
                    if node == primary:
                        break  # retransmit to every replica at once
                    continue
                if reply.status not in (ReplyStatus.OK, ReplyStatus.ERROR,
                                        ReplyStatus.FORBIDDEN):
                    last_error = f"{node}: {reply.status.name} {reply.message}"
                    continue
                decided = collector.add(NodeId(node), bytes([reply.status]) + reply.result)
                if decided is None:
                    continue
                if decided[0] == ReplyStatus.ERROR:
                    raise RequestRejected(reply.message or "rejected", replica=node)
                if decided[0] == ReplyStatus.FORBIDDEN:  # f+1 replicas agree: no effect
                    raise Forbidden(f"forbidden by {collector.needed} replicas: "
                                    f"{reply.message}", replica=node)
                return decided[1:]
            self._check_open()
            self._stats.retries += 1
            last_error = last_error or f"fewer than {collector.needed} matching replies"
            self._primary_probed = -math.inf  # who is primary now? (a view change, maybe)
            if primary is not None:
                primary = None  # the retransmission goes to every replica, at once
                continue
            await self._back_off(call, attempt, deadline, last_error)
            attempt += 1

    def _primary_alone(self) -> str | None:
        """The replica a PBFT request may be sent to alone (`choose_primary`), or None to
        send it to all. Probes every replica (dialling those not connected) when the last
        probe is `PRIMARY_REFRESH` old, or was reset by a retransmission."""
        now = trio.current_time()
        if now - self._primary_probed >= PRIMARY_REFRESH:
            self._primary_probed = now
            self._probe_all()
        return choose_primary(self._slots, self._order, self._faults)

    def _probe_all(self) -> None:
        """Ask every replica for its status (its answer sets the slot's `primary_claim`)."""
        now = trio.current_time()
        for slot in self._slots.values():
            if slot.probe_nonce is not None and now - slot.probe_sent < self.attempt_timeout:
                continue  # one unanswered probe at a time per connection
            slot.probe_nonce = self._next_nonce
            self._next_nonce += 1
            slot.probe_sent = now
            self._stats.probes += 1
            self._pool.queue(slot, encode_frame(wire.encode(StatusCall(nonce=slot.probe_nonce))))


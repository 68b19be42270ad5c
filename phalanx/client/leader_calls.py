"""The leader call path of the client library (Raft-style protocols): `LeaderCalls`, a
mixin of `phalanx.client.Client`.

Owns: one call's attempts at the node believed to lead, following redirects (bounded: no
ping-pong), rotating to the next node when an attempt ends without progress, and the patient
wait on a node that is alive (it answers, or a status probe it has not answered yet is
recent): such a node is waited for up to the deadline, never abandoned while it may still
answer (the module docstring of `phalanx.client.async_client`). An OK reply from any node is
accepted (a late answer to an earlier attempt is as good); ERROR and FORBIDDEN end the call.

Must not import: consensus cores, storage, the runtime. Not deterministic (the real clock).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import trio

from phalanx.client.connection import (
    CallTimer,
    ClientStatistics,
    ConnectionPool,
    NodeSlot,
    PendingCall,
)
from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected
from phalanx.net import wire
from phalanx.net.client_protocol import ClientReply, ReplyStatus, StatusCall
from phalanx.net.framing import encode_frame

UNAVAILABLE = " is unavailable: "
"""Joins a node and its storage-unavailable message in an attempt's reason (the timeout
error reads it back)."""


class LeaderCalls:
    """Leader calls for `phalanx.client.Client`, which provides the state declared here."""

    attempt_timeout: float
    _slots: dict[str, NodeSlot]
    _order: tuple[str, ...]
    _leader: str
    _pool: ConnectionPool
    _timer: CallTimer
    _stats: ClientStatistics
    _next_nonce: int
    _check_open: Callable[[], None]
    _timed_out: Callable[[PendingCall[ClientReply], str | None], ClientTimeout]
    _back_off: Callable[[PendingCall[ClientReply], int, float, str | None], Awaitable[None]]

    async def _attempt(
        self, call: PendingCall[ClientReply], target: str, until: float, deadline: float, *,
        learn_leader: bool,
    ) -> tuple[bool, bytes, str | None, str]:
        """Wait for the attempt at `target` to end, until `until`.

        Returns ``(True, result, None, "")`` on OK (from any node: a late answer to an
        earlier attempt is as good), ``(False, b"", hint, why)`` to follow a redirect to
        `hint`, or ``(False, b"", None, why)`` to move on to another node. When `until`
        passes while the node is alive (see the module docstring) the wait goes on, up to
        `deadline`.
        """
        while True:
            outcome = await self._await_reply(call, target, until, learn_leader=learn_leader)
            if outcome is not None:
                return outcome
            if until >= deadline:
                break
            wait = self._alive_until(call, target)
            if wait is None:
                break
            self._stats.patient_waits += 1
            until = min(deadline, wait)
        return False, b"", None, f"no reply from {target} within {self.attempt_timeout}s"

    def _alive_until(self, call: PendingCall[ClientReply], target: str) -> float | None:
        """How long a call still pending on `target` keeps waiting for it, or None to move on.

        Alive means: the call is still registered on the live connection, the newest status
        probe did not find the node a non-leader, and the node sent something within
        `attempt_timeout` or a probe sent less than `attempt_timeout` ago is unanswered. A
        probe is sent here (at most one per connection per `attempt_timeout`) whenever the
        last one is older than that, so a node that answers other calls but no longer leads
        (it lost this call) is still found out.
        """
        slot = self._slots[target]
        if not slot.connected or slot.calls.get(call.request_no) is not call:
            return None
        now = trio.current_time()
        if slot.leads is False and now - slot.probe_answered < 2 * self.attempt_timeout:
            return None  # it told us recently that it does not lead
        if slot.probe_nonce is None and now - slot.probe_sent >= self.attempt_timeout:
            slot.probe_nonce = self._next_nonce
            self._next_nonce += 1
            slot.probe_sent = now
            slot.leads = None
            self._stats.probes += 1
            self._pool.queue(slot, encode_frame(wire.encode(StatusCall(nonce=slot.probe_nonce))))
        alive = max(slot.last_heard, slot.probe_sent if slot.probe_nonce is not None else -math.inf)
        if now - alive < self.attempt_timeout:
            return alive + self.attempt_timeout
        return None

    async def _await_reply(
        self, call: PendingCall[ClientReply], target: str, until: float, *, learn_leader: bool
    ) -> tuple[bool, bytes, str | None, str] | None:
        """One wait of `_attempt`: its outcome, or None when `until` passed first."""
        while True:
            item = await call.next_before(until, self._timer)
            if item is None:
                return None
            node, reply = item
            if reply is None:
                if node == target:
                    return False, b"", None, f"connection to {node} lost"
                continue
            if reply.status is ReplyStatus.OK:
                if learn_leader:
                    self._leader = node
                return True, reply.result, None, ""
            if reply.status is ReplyStatus.ERROR:
                raise RequestRejected(reply.message or "rejected", replica=node)
            if reply.status is ReplyStatus.FORBIDDEN:
                raise Forbidden(f"forbidden by {node}: {reply.message}", replica=node)
            if node != target:
                continue  # a stale REDIRECT/RETRY from an earlier attempt
            if reply.status is ReplyStatus.UNAVAILABLE:  # its disk: try the others
                return False, b"", None, f"{node}{UNAVAILABLE}{reply.message}"
            if reply.status is ReplyStatus.REDIRECT:
                self._stats.redirects += 1
                hint = reply.leader_hint
                return False, b"", hint, f"{node} redirected to {hint}"
            if reply.leader_hint == node:  # the leader itself: busy, try it again later
                return False, b"", node, f"{node} asked to retry: {reply.message}"
            return False, b"", None, f"{node} asked to retry: {reply.message}"

    async def _call_leader(
        self, call: PendingCall[ClientReply], frame: bytes, deadline: float, *, learn_leader: bool
    ) -> bytes:
        target = self._leader
        failures = 0  # attempts that ended without progress: drives the backoff
        redirects = 0  # redirects followed in a row without a backoff (bounded: no ping-pong)
        last_error: str | None = None
        while True:
            self._check_open()
            if trio.current_time() >= deadline:
                raise self._timed_out(call, last_error)
            self._pool.send(target, call, frame)
            until = min(deadline, trio.current_time() + self.attempt_timeout)
            ok, result, hint, why = await self._attempt(call, target, until, deadline,
                                                        learn_leader=learn_leader)
            if ok:
                return result
            if last_error is None or trio.current_time() < deadline:
                last_error = why  # (an attempt cut short by the deadline says nothing new)
            self._check_open()
            self._stats.retries += 1
            if (hint is not None and hint in self._slots and hint != target
                    and redirects < len(self._order)):
                redirects += 1
                self._leader = target = hint
                continue
            redirects = 0
            if hint == target:  # the leader asked us to come back later (overloaded)
                await self._back_off(call, failures, deadline, last_error)
                failures += 1
                continue
            target = self._order[(self._order.index(target) + 1) % len(self._order)]
            self._leader = target
            await self._back_off(call, failures, deadline, last_error)
            failures += 1

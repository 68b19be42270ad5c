"""The ``membership`` nemesis on real node processes (``phalanx jepsen run --nemesis
membership``): nodes added, promoted and removed while the workload runs.

Owns: `RealMembership`. `apply` turns each `membership` episode
(`phalanx.jepsen.nemesis.membership_schedule`: replace, grow, learner) into changes queued
for `run`, a task that carries them out one at a time through the admin operations
(`phalanx.client.admin_calls`, the cluster's admin certificate: what `phalanx member` does),
retrying while a change is refused (no leader yet, one in progress, a learner that has not
caught up) or unanswered, and checking each one took effect with ``list``.

Rules:
    * The cluster was laid out with its spare nodes up front (`open_real_cluster(spares=)`):
      every node config names them (through the proxies), so no address goes with the
      change (the links keep the proxied addresses); the spares run from the start, as
      learners of their own bootstrap configuration, outside the membership.
    * `RealCluster.outside` is kept in step: a spare leaves it when added, a removed node
      joins it and `RealCluster.retired` (it is SIGKILLed once its removal took effect and
      never restarted, as an operator stops a removed node), so recovery waits only for
      members.
    * A change seen done at the leader may still be lost (its entry uncommitted when the
      leader fell): `settle`, after the heal, sets `RealCluster.outside` from the
      membership then in force (removed nodes stay outside: they were stopped).
    * A replace removes a voter drawn when the removal starts, only while the voters
      outnumber the bootstrap's (the promotion happened): the voter count never drops below
      it. Nothing is proposed after `stop` (the heal).
    * Every change is recorded in the history as a ``membership`` nemesis op.

Must not import the runtime or consensus cores. Real time; not deterministic.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from collections.abc import Callable
from typing import Final

import trio

from phalanx.client import admin_calls
from phalanx.client.errors import ClientError, RequestRejected
from phalanx.jepsen import nemesis
from phalanx.jepsen.harness.cluster import RealCluster
from phalanx.ops.admin_messages import AdminReply

RETRY_SECONDS: Final = 0.3
MAX_RETRY_SECONDS: Final = 3.0
"""Attempts back off (doubling) while nothing happens: each is a few TLS handshakes with
the nodes, which a cluster without a leader should not spend its CPU on."""
CALL_SECONDS: Final = 5.0
_VICTIM = nemesis.MEMBERSHIP_VICTIM


class RealMembership:
    """Membership changes on `cluster` (see the module docstring)."""

    def __init__(self, cluster: RealCluster, *, bootstrap: int,
                 record: Callable[[str, str], None], rng: random.Random) -> None:
        self.cluster = cluster
        self._bootstrap = bootstrap
        self._record = record
        self._rng = rng
        self._ops: deque[tuple[str, str]] = deque()
        self._wake = trio.Event()
        self._stopped = False
        self.done = 0
        self._last_note = ""

    def apply(self, event: nemesis.FaultEvent) -> str:
        self._ops.extend(nemesis.membership_steps(event))
        self._wake.set()
        return "queued: " + ", ".join(f"{op} {node}" for op, node in self._ops)

    def stopped(self) -> bool:
        """Whether `stop` was called (checked after each await: it may come meanwhile)."""
        return self._stopped

    def stop(self) -> None:
        """The heal: nothing more is proposed."""
        self._stopped = True
        self._ops.clear()
        self._wake.set()

    async def settle(self, within: float) -> str:
        """After the heal: `RealCluster.outside` from the leader's membership (a change
        seen done may have been lost with an uncommitted entry since): every node it does
        not list, and the removed ones. Leaves it as it was if no leader answers within
        `within` seconds (recovery then says so)."""
        cluster = self.cluster
        with trio.move_on_after(within):
            while True:
                with contextlib.suppress(ClientError, OSError):
                    reply = await admin_calls.member_list(cluster.config,
                                                          seconds=CALL_SECONDS)
                    if reply.leader == reply.node and not reply.voters_outgoing:
                        members = set(reply.members) - cluster.retired
                        cluster.outside = set(cluster.nodes) - members
                        note = (f"members {','.join(sorted(members))}; outside "
                                f"{','.join(sorted(cluster.outside)) or '-'}")
                        self._record("membership", note)
                        return note
                await trio.sleep(RETRY_SECONDS)
        return "no leader's membership"

    async def run(self) -> None:
        """Carry out queued changes until `stop` (or cancelled)."""
        delay = RETRY_SECONDS
        while not self._stopped:
            if not self._ops:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            op, node = self._ops[0]
            try:
                finished = await self._step(op, node)
            except (ClientError, OSError) as e:  # refused or no answer: try again
                self._note(f"{op} {node}: "
                           + ("refused" if isinstance(e, RequestRejected) else "no answer")
                           + f" ({e})")
                finished = False
            if self.stopped():  # the heal came during the attempt (the queue is gone)
                return
            if finished:
                self._ops.popleft()
                delay = RETRY_SECONDS
            else:
                await trio.sleep(delay)
                delay = min(MAX_RETRY_SECONDS, delay * 2)

    def _note(self, text: str) -> None:
        """Record why an attempt did nothing, once per reason in a row."""
        if text != self._last_note:
            self._last_note = text
            self._record("membership", text)

    async def _step(self, op: str, node: str) -> bool:
        """One attempt at the first queued change; whether it is done."""
        cluster = self.cluster
        reply = await admin_calls.member_list(cluster.config, seconds=CALL_SECONDS)
        if self.stopped() or reply.voters_outgoing or reply.leader != reply.node:
            self._note(f"{op} {node}: waiting ("
                       + ("a change in flight" if reply.voters_outgoing else
                          f"no leader's view: {reply.node} knows {reply.leader or 'none'}")
                       + ")")
            return False
        if node == _VICTIM:
            voters = sorted(v for v in reply.voters if v not in cluster.retired)
            if len(voters) <= self._bootstrap:
                self._record("membership", "replace: no removal (the promotion did not "
                             "happen)")
                return True
            node = self._rng.choice(voters)
            self._ops[0] = (op, node)
        if _done(op, node, reply):
            self._finish(op, node, reply)
            return True
        if op == "promote" and node not in reply.members:
            self._ops.appendleft(("add-learner", node))  # the learner entry was lost
            return False
        await admin_calls.admin_call(cluster.config, op, node, seconds=CALL_SECONDS)
        self._record("membership", f"{op} {node} proposed")
        return False

    def _finish(self, op: str, node: str, reply: AdminReply) -> None:
        cluster = self.cluster
        self.done += 1
        note = ""
        if op == "add-learner":
            cluster.outside.discard(node)
        elif op == "remove":
            cluster.outside.add(node)
            cluster.retired.add(node)
            if cluster.procs.running(node):
                cluster.procs.kill(node)
            cluster.paused.discard(node)
            note = f"; {node} stopped for good"
        self._record("membership", f"{op} {node} done: voters {','.join(reply.voters)}"
                     f" learners {','.join(reply.learners) or '-'}{note}")


def _done(op: str, node: str, reply: AdminReply) -> bool:
    if op == "add-learner":
        return node in reply.members
    if op == "promote":
        return node in reply.voters
    return node not in reply.members

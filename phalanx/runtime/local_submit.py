"""Node services' commands to their own node's consensus (`ServiceContext.submit`).

Owns: `LocalSubmitter`: a bounded queue of application commands that node services submit
(synchronously, from their steps) and one trio task that hands each to the node's driver as
a write of a local client session (``service/<node>/<random hex>``, request numbers 1, 2,
...), exactly as the client port would, but without a socket.

Invariants: `submit` never blocks (False, counted, when the queue is full); replies are
counted and otherwise ignored: a service learns the outcome from the replicated state (a
follower refusing a write, a lost proposal or a leader change are normal, and the service
resubmits whatever the state does not show yet). The session id is fresh per process, so a
restart never reuses a request number the replicated session table already holds.
"""

from __future__ import annotations

import random
from typing import Protocol

import trio

from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus, StatusReply

QUEUE = 256
"""Commands waiting for the driver before `submit` refuses."""


class _Driver(Protocol):
    async def call(self, call: ClientCall, target: object) -> None: ...


class LocalSubmitter:
    """See the module docstring."""

    def __init__(self, node_id: str, rng: random.Random, *, capacity: int = QUEUE) -> None:
        self.client_id = f"service/{node_id}/{rng.getrandbits(64):016x}"
        self._send, self._receive = trio.open_memory_channel[bytes](capacity)
        self._next = 0
        self.submitted = 0
        self.refused = 0
        self.replies: dict[str, int] = {}
        """Replies by status name (OK, NOT_LEADER, ...), for tests and debugging."""

    def submit(self, command: bytes) -> bool:
        try:
            self._send.send_nowait(command)
        except trio.WouldBlock:
            self.refused += 1
            return False
        self.submitted += 1
        return True

    def deliver(self, reply: ClientReply | StatusReply) -> None:
        """The driver's answer (a `ReplyTarget`): counted only."""
        status = reply.status if isinstance(reply, ClientReply) else ReplyStatus.OK
        self.replies[status.name] = self.replies.get(status.name, 0) + 1

    async def run(self, driver: _Driver, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hand queued commands to `driver` until cancelled."""
        task_status.started()
        async for command in self._receive:
            self._next += 1
            await driver.call(ClientCall(request=ClientRequest(
                client_id=self.client_id, request_no=self._next, command=command)), self)

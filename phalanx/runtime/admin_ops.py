"""Admin operations on the client port (`phalanx.ops.admin_messages`): membership changes and
leadership transfer, answered by the node's runtime.

Owns: `AdminOps.answer`, which checks the caller's role (admin), reports the membership the
core knows (a core whose status has a ``config`` `Configuration`, and a ``progress`` per peer
with ``match=N``), and turns a change into the core's own input through its protocol's
`ProtocolNode.admin_input(op, node, status)` hook (Raft: `ProposeConfChange`,
`TransferLeadership`). A protocol without the hook has static membership: every change is
answered ERROR saying so (PBFT: docs/OPERATIONS.md).

Rules: a change goes to the leader only (others answer REDIRECT with the leader they know);
the core validates it (one change at a time, learners promoted only once caught up, ...)
and a refusal is answered ERROR with the core's reason. OK means proposed: the change takes
effect when its configuration entries commit (`list` shows it), like any entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import trio

from phalanx.consensus.core import CoreStatus
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops.admin_messages import ADMIN_OPS, AdminCall, AdminReply
from phalanx.ops.ops_messages import OpsCall, OpsReply, refusal
from phalanx.runtime.client_auth import ADMIN, Principal
from phalanx.runtime.driver import Driver
from phalanx.runtime.operator_ops import OperatorOps

FENCE_SECONDS: Final = 2.0
"""How long to wait for the core to step a proposal (it normally takes one loop pass)."""

_MATCH = re.compile(r"match=(\d+)")


def membership_reply(call: AdminCall, status: CoreStatus, node: str, *,
                     status_code: ReplyStatus = ReplyStatus.OK,
                     message: str = "") -> AdminReply:
    """`status`'s membership as an `AdminReply` (empty fields for a core that keeps none)."""
    config = getattr(status, "config", None)
    progress: dict[str, str] = dict(getattr(status, "progress", {}) or {})
    voters = tuple(map(str, getattr(config, "voters", ())))
    outgoing = tuple(map(str, getattr(config, "voters_outgoing", ())))
    learners = tuple(map(str, getattr(config, "learners", ())))
    members = tuple(sorted({*voters, *outgoing, *learners}))
    matched = tuple(int(m.group(1)) if (m := _MATCH.search(progress.get(p, ""))) else
                    (status.commit_index if p == node else 0) for p in members)
    return AdminReply(nonce=call.nonce, status=status_code, message=message, node=node,
                      leader=str(status.leader or ""), term=status.term,
                      commit_index=status.commit_index, voters=voters,
                      voters_outgoing=outgoing, learners=learners, members=members,
                      matched=matched)


class AdminOps:
    """Answers `AdminCall`s for one node (see the module docstring)."""

    def __init__(self, driver: Driver, node_id: str, protocol_node: object,
                 protocol: str, *, operator: OperatorOps | None = None) -> None:
        self._operator = operator
        self._driver = driver
        self._node = node_id
        self._protocol = protocol
        self._admin_input: Callable[..., Any] | None = getattr(
            protocol_node, "admin_input", None)

    async def answer_ops(self, call: OpsCall, principal: Principal | None) -> OpsReply:
        """Backups and certificate reloads: `phalanx.runtime.operator_ops`."""
        if self._operator is None:
            return refusal(call, self._node, "this node answers no operator calls")
        return await self._operator.answer(call, principal)

    async def answer(self, call: AdminCall, principal: Principal | None) -> AdminReply:
        status = self._driver.status()

        def reply(code: ReplyStatus, message: str = "") -> AdminReply:
            return membership_reply(call, self._driver.status(), self._node,
                                    status_code=code, message=message)

        if principal is not None and not principal.may(ADMIN):
            return reply(ReplyStatus.FORBIDDEN, f"admin operations need role {ADMIN} (this "
                         f"client's certificate has {principal.role})")
        if call.op not in ADMIN_OPS:
            return reply(ReplyStatus.ERROR, f"unknown admin operation {call.op!r} (one of "
                         f"{', '.join(ADMIN_OPS)})")
        if call.op == "list":
            return reply(ReplyStatus.OK)
        if self._admin_input is None:
            return reply(ReplyStatus.ERROR, f"protocol {self._protocol} has static "
                         "membership: no membership changes or leadership transfer")
        if status.leader is None or str(status.leader) != self._node:
            return reply(ReplyStatus.REDIRECT, "not the leader" + (
                f"; ask {status.leader}" if status.leader is not None else
                " (no leader known yet)"))
        made = (self._admin_input(call.op, call.node, status, address=call.address)
                if call.address else self._admin_input(call.op, call.node, status))
        if isinstance(made, str):
            return reply(ReplyStatus.ERROR, made)
        await self._driver.control(made)
        if call.op == "transfer":
            return reply(ReplyStatus.OK, "transfer started")
        # A status request queued behind the proposal is answered once the core has
        # stepped it (one channel, in order): the core's verdict on it is then in status().
        fence = _Fence()
        await self._driver.request_status(0, fence)
        with trio.move_on_after(FENCE_SECONDS):
            await fence.done.wait()
        # the core itself (the driver's copy is refreshed per tick); same trio thread, and
        # the core is stepped synchronously, so it is never read mid-step
        refused = getattr(self._driver.core.status(), "conf_change_error", None)
        if refused:
            return reply(ReplyStatus.ERROR, str(refused))
        return reply(ReplyStatus.OK, "proposed")


class _Fence:
    """A reply target that only notes that the driver reached it."""

    def __init__(self) -> None:
        self.done = trio.Event()

    def deliver(self, reply: object) -> None:
        self.done.set()

"""Client-port operations of node services: `ServiceCall` and `ServiceReply`.

Owns: the two generic wire types (ids 561, 562 in the runtime range of `phalanx.net.wire`)
that carry a service's own request and reply types (`ServiceSpec.client_messages`) over the
node's authenticated client port. The port checks the caller's role against
`NodeService.needed_role` before the service sees the request.

Semantics: one `ServiceCall(nonce, service, request)` is answered by exactly one
`ServiceReply` with the same nonce on the same connection. `status` is a
`phalanx.net.client_protocol.ReplyStatus`: OK (`result` holds the service's reply), ERROR
(no such service on this node, or a request it does not serve: `message` says which),
FORBIDDEN (the client's role is too weak: `message` names the role needed).

Rules: pure data, frozen slotted keyword-only dataclasses; `register()` is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message
from phalanx.net import wire
from phalanx.net.client_protocol import ReplyStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceCall(Message):
    """A client's operation on service `service` of the node it is sent to."""

    nonce: int
    service: str
    request: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceReply(Message):
    """The answer to the `ServiceCall` with the same `nonce`."""

    nonce: int
    status: ReplyStatus
    message: str = ""
    result: Message | None = None


SERVICE_CALL_MESSAGES: dict[int, type] = {561: ServiceCall, 562: ServiceReply}


def register() -> None:
    """Register `ServiceCall`/`ServiceReply` with the project codec (idempotent)."""
    wire.register_all(SERVICE_CALL_MESSAGES)

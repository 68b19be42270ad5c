"""The client protocol: what a client and a node say to each other over a client connection.

One TLS connection (mutually authenticated: the client presents a cluster-CA client
certificate, whose name owns its session ids and whose role limits its calls,
`phalanx.runtime.client_auth`; only a node in the insecure mode lets clients without one in)
carries frames
(`phalanx.net.framing`) of codec-encoded messages (type ids 500-599 in `phalanx.net.wire`).
A client may pipeline: it sends any number of `ClientCall`s and matches each `ClientReply`
by (client_id, request_no); replies may come back in any order.

Semantics:
- `ClientCall.request` is a `ClientRequest`; a retry of the same operation (after a timeout,
  a redirect or a lost connection) reuses the SAME (client_id, request_no), so the replica
  layer's session table applies it at most once and answers the retry with the cached result.
- `ReplyStatus.OK`: the command was applied (or the query served) and `result` holds the
  application's encoded result.
- `ReplyStatus.REDIRECT`: this node cannot serve the request (not the leader); `leader_hint`
  names the node to try, when known. The request was certainly not appended here.
- `ReplyStatus.RETRY`: transient (election in progress, overloaded); try again, same ids.
- `ReplyStatus.ERROR`: the request itself is invalid (`message` says why); retrying will not help.
- `ReplyStatus.FORBIDDEN`: the connection's certificate has no role that allows this call
  (`message` says which role it needs); nothing was appended.
- `ReplyStatus.UNAVAILABLE`: the node's storage cannot take writes now (disk full, broken
  storage; `message` says why); nothing was appended here. Another node, or the same one
  later, may succeed.
- `ReadConsistency.LINEARIZABLE` (default) reads go through the core (Raft ReadIndex, PBFT
  ordering); `STALE` reads are served from the contacted node's applied state, which may be
  behind.
- PBFT clients accept a result once f+1 replicas return the same (status, result);
  `ClientReply.replica` says who answered. A PBFT client sends a call to the primary only
  (Castro-Liskov §4.1) when enough backups accepted its `ClientHello`, and to every replica
  otherwise and on a retransmission.
- `ClientHello` subscribes the connection to the answers for one client: a node that
  executes a request of session `client_id`, or of one of its lanes ``client_id#k``, and
  has no call of it waiting, answers it on the newest subscribed connection (a PBFT backup
  executes requests it only saw in a pre-prepare). `ClientHelloReply.subscribed` says
  whether the node supports it; a client must not rely on unasked answers otherwise.
- `StatusCall` / `StatusReply` serve `phalanx status`.

Rules: pure data, no I/O; frozen slotted keyword-only dataclasses; registered through
`register()` (idempotent).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from phalanx.consensus._raw_init import raw_init
from phalanx.consensus.types import ClientRequest, Message
from phalanx.net import wire


class ReplyStatus(enum.IntEnum):
    OK = 0
    REDIRECT = 1
    RETRY = 2
    ERROR = 3
    FORBIDDEN = 4
    UNAVAILABLE = 5
    ABORTED = 6
    """A definite failure (`phalanx.consensus.core.Abort`): the request will never be applied
    by any correct replica (the leaderless core: dropped, or refused by enough nodes past its
    deadline). f+1 matching ABORTED replies make a client record the operation as failed."""


class ReadConsistency(enum.IntEnum):
    LINEARIZABLE = 0
    STALE = 1


@raw_init  # built once per call by the client
@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCall(Message):
    """A client's request to a node."""

    request: ClientRequest
    consistency: ReadConsistency = ReadConsistency.LINEARIZABLE


@raw_init  # built once per answer by the node
@dataclass(frozen=True, slots=True, kw_only=True)
class ClientReply(Message):
    """A node's answer to one `ClientCall`."""

    client_id: str
    request_no: int
    status: ReplyStatus
    replica: str
    result: bytes = b""
    leader_hint: str | None = None
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusCall(Message):
    """Ask a node for its `StatusReply`; `nonce` is echoed back."""

    nonce: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReply(Message):
    """A node's view of itself, for operators (`phalanx status`)."""

    nonce: int
    node: str
    protocol: str
    role: str
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    last_checkpoint: int
    peers: tuple[str, ...]
    connected_peers: tuple[str, ...] = ()
    dropped_messages: int = 0
    client_auth: str = "required"
    """The node's `[client] auth` mode: ``none`` means it serves anyone (insecure)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientHello(Message):
    """Subscribe this connection to the answers for `client_id` and its lanes (see above)."""

    client_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientHelloReply(Message):
    """A node's answer to `ClientHello`: whether answers will come unasked."""

    client_id: str
    subscribed: bool


CLIENT_MESSAGES: dict[int, type] = {
    500: ClientCall,
    501: ClientReply,
    502: StatusCall,
    503: StatusReply,
    504: ClientHello,
    505: ClientHelloReply,
}


def register() -> None:
    """Register the client protocol in the default registry (safe to call repeatedly)."""
    wire.register_all(CLIENT_MESSAGES)

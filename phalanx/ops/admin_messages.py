"""Client-port admin operations (issue 21, item 2): `AdminCall` and `AdminReply`.

Owns: the two wire types, ids 710 and 711 (the client-admin range 710-719 of
`phalanx.net.wire`; 712-719 are free), and the operation names `ADMIN_OPS`.

Semantics: one `AdminCall(nonce, op, node)` is answered by exactly one `AdminReply` with the
same nonce. `op` is one of:
    * ``list``: the membership as this node's core sees it (no change);
    * ``add-learner``: add `node` as a non-voting learner (it receives the log);
    * ``promote``: make learner `node` a voter, once it has caught up (joint consensus);
    * ``remove``: remove voter or learner `node` (joint consensus for a voter);
    * ``transfer``: hand leadership to voter `node` (Raft §3.10).
The status is a `phalanx.net.client_protocol.ReplyStatus`: OK (a change was proposed or a
transfer started: watch ``list`` for its effect), REDIRECT (this node does not lead;
`leader` names the one it knows), ERROR (refused: `message` says why, e.g. "learner n4 has
not caught up"; nothing happened), FORBIDDEN (needs the admin role). Every reply carries
the membership the node knows: `voters`, `voters_outgoing` (non-empty while a change is
joint), `learners`, `leader`, `term`, `commit_index`, and per member the highest log index
the leader knows it holds (`matched`, parallel to `members`; only a leader knows them).

Rules: pure data, frozen slotted keyword-only dataclasses; `register()` is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from phalanx.consensus.types import Message, omit_default_repr
from phalanx.net import wire
from phalanx.net.client_protocol import ReplyStatus

ADMIN_OPS: Final = ("list", "add-learner", "promote", "remove", "transfer")
CHANGE_OPS: Final = ("add-learner", "promote", "remove")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminCall(Message):
    """An admin operation (needs the admin role); `node` is "" for ``list``."""

    nonce: int
    op: str
    node: str = ""
    address: str = field(default="", metadata={"wire_optional": True})
    """For ``add-learner``: the new node's peer address ``host:port``, recorded in the
    configuration so running nodes link to it (no restart); "" keeps the links as they are
    (and the encoding: left off the wire)."""

    __repr__ = omit_default_repr


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminReply(Message):
    """The answer to the `AdminCall` with the same nonce (see the module docstring)."""

    nonce: int
    status: ReplyStatus
    message: str = ""
    node: str = ""
    """The node that answered."""
    leader: str = ""
    term: int = 0
    commit_index: int = 0
    voters: tuple[str, ...] = ()
    voters_outgoing: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    matched: tuple[int, ...] = ()


ADMIN_MESSAGES: dict[int, type] = {710: AdminCall, 711: AdminReply}


def register() -> None:
    """Register the admin operations in the default registry (safe to call repeatedly)."""
    wire.register_all(ADMIN_MESSAGES)

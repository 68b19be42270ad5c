"""Who may do what on the client port: client principals, session ownership and roles.

Owns: `Principal` (the authenticated client behind one connection), `principal_from_peercert`,
`owns_client_id` and `refusal` (the per-request check). The client port
(`phalanx.runtime.client_port`) calls them; the driver never sees a refused call.

Rules:
- A client is its certificate: ``urn:phalanx:client:<name>`` names it and an optional
  ``urn:phalanx:role:<role>`` gives its role (`phalanx.ops.pki`). Roles live in the certificate,
  not in a table in the node configs, so every node of a cluster answers a call the same way
  (a PBFT client needs f+1 matching answers), and issuing a client needs only the CA, no
  config change on every node. The cost: a role can only be taken back by rotating the CA.
- Roles, weakest first: ``read-only`` (reads, linearizable or stale, and status),
  ``read-write`` (also writes), ``admin`` (also operator operations: none exist yet beyond
  status, which every role may ask for; membership changes will need it).
- A client owns session id ``<name>`` and every id below it: ``<name>/...`` and
  ``<name>#...`` (the client library uses ``<name>/<uuid>`` and lanes ``...#<k>``), so no
  client can write into, or read the answers of, another client's sessions.
- A node certificate is not a client: it gets no principal (the port closes the connection).
- Pure functions, no I/O; client input is normal input (a refusal is a value, never raised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.consensus.types import ClientRequest
from phalanx.ops.pki import CLIENT_ROLES, identity_from_peercert

READ_ONLY, READ_WRITE, ADMIN = CLIENT_ROLES
MAX_SHOWN_ID = 80
"""A refusal quotes at most this many characters of the session id it refuses."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """The authenticated client of one connection."""

    name: str
    role: str

    def may(self, needed: str) -> bool:
        """Whether this principal's role includes `needed` (roles are ordered)."""
        return CLIENT_ROLES.index(self.role) >= CLIENT_ROLES.index(needed)


def principal_from_peercert(peercert: dict[str, Any] | None) -> Principal | None:
    """The client a verified certificate names, or None (no certificate, a node's
    certificate, no or an ambiguous phalanx identity, an unknown role)."""
    identity = identity_from_peercert(peercert)
    if identity is None or identity.kind != "client" or identity.role is None:
        return None
    return Principal(name=identity.name, role=identity.role)


def owns_client_id(name: str, client_id: str) -> bool:
    """Whether client `name` owns session id `client_id` (see the module docstring)."""
    return client_id == name or (
        client_id.startswith(name) and client_id[len(name):len(name) + 1] in ("/", "#"))


def needed_role(request: ClientRequest) -> str:
    """The weakest role that may send `request`. A read-only request is only ever answered
    from the state machine's query path, which cannot change state, so a write disguised as
    a read is refused by the application, not applied."""
    return READ_ONLY if request.read_only else READ_WRITE


def refusal(principal: Principal, request: ClientRequest) -> str | None:
    """Why `principal` may not send `request` (the FORBIDDEN reply's message), or None."""
    if not owns_client_id(principal.name, request.client_id):
        shown = request.client_id[:MAX_SHOWN_ID]  # the id is the client's: keep replies small
        return (f"session {shown!r} does not belong to client "
                f"{principal.name!r} (use ids {principal.name!r}, "
                f"'{principal.name}/...' or '{principal.name}#...')")
    needed = needed_role(request)
    if not principal.may(needed):
        return (f"{'writes need' if needed == READ_WRITE else 'this call needs'} role "
                f"{needed}; client {principal.name!r} has role {principal.role}")
    return None

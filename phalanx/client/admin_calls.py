"""Admin operations from a client (`phalanx.ops.admin_messages`): the membership of a Raft
cluster and its leader, changed through joint consensus.

Owns: `admin_call` (one operation, following REDIRECTs to the leader), the helpers
`member_list`, `member_add` (as a learner), `member_promote`, `member_remove`,
`leader_transfer`, and `wait_for` (poll the membership until a condition holds). Each call
dials its own short TLS connection with the cluster's admin certificate
(``DIR/clients/admin.pem``, role admin: `phalanx.runtime.client_auth`): these are operator
operations, a few per minute, so they do not share `phalanx.Client`'s pool.

Errors: ERROR answers raise `RequestRejected` (the change was refused: nothing happened),
FORBIDDEN `Forbidden`; no answer from any node before the deadline raises `ClientTimeout`
(a change MAY have been proposed: `member_list` tells).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import trio

from phalanx.client.errors import ClientError, ClientTimeout, Forbidden, RequestRejected
from phalanx.client.one_shot import ask_once
from phalanx.net import client_protocol
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import admin_messages, pki
from phalanx.ops.admin_messages import AdminCall, AdminReply
from phalanx.ops.node_config import ClusterConfig, PeerConfig

ADMIN_NAME = "admin"
"""The client certificate `cluster init` issues with the admin role (DIR/clients/admin.pem)."""
_MAX_HOPS = 4


def admin_context(cluster: ClusterConfig, name: str = ADMIN_NAME) -> ssl.SSLContext:
    """A TLS client context with ``DIR/clients/<name>.pem`` (an admin-role certificate)."""
    clients = cluster.directory / "clients"
    return pki.client_context(cluster.ca, certificate=Path(clients / f"{name}.pem"),
                              private_key=Path(clients / f"{name}.key"),
                              check_hostname=False)


async def _ask(node: PeerConfig, context: ssl.SSLContext, call: AdminCall) -> AdminReply:
    def accept(reply: object) -> AdminReply | None:
        return reply if isinstance(reply, AdminReply) and reply.nonce == call.nonce else None

    return await ask_once(node, context, call, accept)


async def admin_call(cluster: ClusterConfig, op: str, node: str = "", *,
                     seconds: float = 5.0, name: str = ADMIN_NAME,
                     prefer_leader: bool = True, address: str = "") -> AdminReply:
    """Run admin operation `op` on `node` (see `phalanx.ops.admin_messages`): asks the nodes
    in turn, following REDIRECTs. For ``list`` with `prefer_leader`, the leader's answer (it
    alone knows how far each member has caught up, and a removed node's view is stale);
    when no node leads, the answer with the highest term and commit index. Returns the OK
    reply."""
    client_protocol.register()
    admin_messages.register()
    context = admin_context(cluster, name)
    peers = {n.id: n for n in cluster.nodes}
    order = list(peers)
    last: str = "no node answered"
    best: AdminReply | None = None
    with trio.move_on_after(seconds):
        while True:
            for first in order:
                target, hops = first, 0
                while hops < _MAX_HOPS:
                    hops += 1
                    call = AdminCall(nonce=hops, op=op, node=node, address=address)
                    try:
                        reply = await _ask(peers[target], context, call)
                    except (OSError, ssl.SSLError, trio.BrokenResourceError,
                            ClientError) as e:
                        last = f"{target}: {e}"
                        break
                    if reply.status == ReplyStatus.FORBIDDEN:
                        raise Forbidden(f"{target}: {reply.message}", replica=target)
                    if reply.status == ReplyStatus.ERROR:
                        raise RequestRejected(f"{target}: {reply.message}", replica=target)
                    leader = reply.leader if reply.leader in peers else ""
                    if reply.status == ReplyStatus.REDIRECT:
                        last = f"{target}: {reply.message}"
                        if not leader or leader == target:
                            break
                        target = leader
                        continue
                    if op == "list" and prefer_leader and reply.leader != reply.node:
                        # not the leader's view (a removed or partitioned node may know
                        # none): go to the leader it names, else keep the best and go on
                        if best is None or (reply.term, reply.commit_index) > (
                                best.term, best.commit_index):
                            best = reply
                        if leader and leader != target and hops < _MAX_HOPS:
                            target = leader
                            continue
                        break
                    return reply
            if best is not None:
                return best
            await trio.sleep(0.2)  # every node down or leaderless: try again
    raise ClientTimeout(f"admin {op}: no answer within {seconds:g} s", last_error=last)


async def member_list(cluster: ClusterConfig, *, seconds: float = 5.0,
                      name: str = ADMIN_NAME) -> AdminReply:
    """The membership, from the leader when one answers."""
    return await admin_call(cluster, "list", seconds=seconds, name=name)


async def member_add(cluster: ClusterConfig, node: str, *, seconds: float = 5.0,
                     name: str = ADMIN_NAME) -> AdminReply:
    """Add `node` as a learner (it must run: `phalanx cluster add-node` makes its config).
    Its peer address (from `cluster`, where `cluster add-node` wrote it) goes with the
    change, so the running nodes link to it without a restart."""
    known = {n.id: n for n in cluster.nodes}.get(node)
    address = "" if known is None else f"{known.peer_addr.host}:{known.peer_addr.port}"
    return await admin_call(cluster, "add-learner", node, seconds=seconds, name=name,
                            address=address)


async def member_promote(cluster: ClusterConfig, node: str, *, seconds: float = 5.0,
                         name: str = ADMIN_NAME) -> AdminReply:
    """Make learner `node` a voter (refused until it has caught up)."""
    return await admin_call(cluster, "promote", node, seconds=seconds, name=name)


async def member_remove(cluster: ClusterConfig, node: str, *, seconds: float = 5.0,
                        name: str = ADMIN_NAME) -> AdminReply:
    return await admin_call(cluster, "remove", node, seconds=seconds, name=name)


async def leader_transfer(cluster: ClusterConfig, node: str, *, seconds: float = 5.0,
                          name: str = ADMIN_NAME) -> AdminReply:
    return await admin_call(cluster, "transfer", node, seconds=seconds, name=name)


async def wait_for(cluster: ClusterConfig, condition: Callable[[AdminReply], bool], *,
                   seconds: float = 30.0, name: str = ADMIN_NAME) -> AdminReply:
    """Poll ``list`` until `condition(reply)` holds; the reply. Raises `ClientTimeout`."""
    last: AdminReply | None = None
    with trio.move_on_after(seconds):
        while True:
            try:
                last = await admin_call(cluster, "list", seconds=min(5.0, seconds), name=name)
            except ClientTimeout:
                last = None
            if last is not None and condition(last):
                return last
            await trio.sleep(0.2)
    raise ClientTimeout(f"the membership did not reach the expected state within {seconds:g} s",
                        last_error=str(last))

"""Operator calls from a client (`phalanx.ops.ops_messages`): ask one node for a backup
checkpoint, or to reload its certificates.

Owns: `backup_call`, `backup_read` (a piece of the backup's data) and `reload_call`. Each
dials its own short TLS connection (`phalanx.client.one_shot.ask_once`) with the cluster's
admin certificate (like `phalanx.client.admin_calls`).

Errors: ERROR answers raise `RequestRejected`, FORBIDDEN `Forbidden`; no answer before the
deadline raises `ClientTimeout` (with the last error seen).
"""

from __future__ import annotations

import ssl

import trio

from phalanx.client.admin_calls import ADMIN_NAME, admin_context
from phalanx.client.errors import ClientError, ClientTimeout, Forbidden, RequestRejected
from phalanx.client.one_shot import ask_once
from phalanx.net import client_protocol
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import ops_messages
from phalanx.ops.node_config import ClusterConfig
from phalanx.ops.ops_messages import (
    MAX_BACKUP_CHUNK,
    BackupCall,
    BackupReply,
    ReloadCall,
    ReloadReply,
)


async def _call(cluster: ClusterConfig, node: str, call: BackupCall | ReloadCall,
                seconds: float, name: str) -> BackupReply | ReloadReply:
    client_protocol.register()
    ops_messages.register()
    peers = {n.id: n for n in cluster.nodes}
    if node not in peers:
        raise ClientError(f"no node {node!r} in {cluster.directory} (nodes: "
                          f"{', '.join(peers)})")
    context = admin_context(cluster, name)
    want: type[BackupReply] | type[ReloadReply] = (
        BackupReply if isinstance(call, BackupCall) else ReloadReply)

    def accept(reply: object) -> BackupReply | ReloadReply | None:
        if isinstance(reply, (BackupReply, ReloadReply)) and isinstance(reply, want) \
                and reply.nonce == call.nonce:
            return reply
        return None

    last = "no answer"
    with trio.move_on_after(seconds):
        while True:
            reply: BackupReply | ReloadReply
            try:
                reply = await ask_once(peers[node], context, call, accept)
            except (OSError, ssl.SSLError, trio.BrokenResourceError, ClientError) as e:
                last = f"{node}: {e}"
                await trio.sleep(0.2)
                continue
            if reply.status == ReplyStatus.FORBIDDEN:
                raise Forbidden(f"{node}: {reply.message}", replica=node)
            if reply.status != ReplyStatus.OK:
                raise RequestRejected(f"{node}: {reply.message}", replica=node)
            return reply
    raise ClientTimeout(f"{type(call).__name__}: no answer within {seconds:g} s",
                        last_error=last)


async def backup_call(cluster: ClusterConfig, node: str, *, min_index: int = 0,
                      seconds: float = 30.0, name: str = ADMIN_NAME) -> BackupReply:
    """Ask `node` to write a backup checkpoint at an applied index >= `min_index`."""
    reply = await _call(cluster, node, BackupCall(nonce=1, min_index=min_index), seconds, name)
    assert isinstance(reply, BackupReply)
    return reply


async def backup_read(cluster: ClusterConfig, node: str, *, index: int, offset: int,
                      length: int = MAX_BACKUP_CHUNK, seconds: float = 30.0,
                      name: str = ADMIN_NAME) -> BackupReply:
    """Read `length` bytes (at most `MAX_BACKUP_CHUNK`) at `offset` of backup `index`'s
    data from `node` (the reply's `chunk`; shorter at the end)."""
    call = BackupCall(nonce=2, index=index, offset=offset, length=length)
    reply = await _call(cluster, node, call, seconds, name)
    assert isinstance(reply, BackupReply)
    return reply


async def reload_call(cluster: ClusterConfig, node: str, *, seconds: float = 10.0,
                      name: str = ADMIN_NAME) -> ReloadReply:
    """Ask `node` to load its certificate, key and CA bundle files again."""
    reply = await _call(cluster, node, ReloadCall(nonce=1), seconds, name)
    assert isinstance(reply, ReloadReply)
    return reply

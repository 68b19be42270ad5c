"""Client-port operations on a node's services (`phalanx.services.messages.ServiceCall`).

Owns: `call_service` (one operation on one node) and `call_every_node` (the same operation
on every node of a cluster, concurrently). Each call dials its own short TLS connection with
the cluster's client certificate: these are operator operations (`phalanx gossip`, the
gossip demo), a few per second, so they do not share `phalanx.Client`'s pool.

Errors: a node's ERROR answer raises `RequestRejected`, FORBIDDEN `Forbidden` (both: nothing
happened); no answer before the deadline raises `ClientTimeout` (a publish MAY have happened).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import trio

from phalanx.client.errors import ClientError, ClientTimeout, Forbidden, RequestRejected
from phalanx.client.one_shot import ask_once
from phalanx.consensus.types import Message
from phalanx.net import client_protocol, wire
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig, PeerConfig
from phalanx.services import get as get_service
from phalanx.services.messages import ServiceCall, ServiceReply
from phalanx.services.messages import register as register_service_calls


def _context(cluster: ClusterConfig) -> ssl.SSLContext:
    return pki.client_context(cluster.ca, certificate=cluster.client_cert,
                              private_key=cluster.client_key, check_hostname=False)


def _register(service: str) -> None:
    client_protocol.register()
    register_service_calls()
    spec = get_service(service)
    if spec.client_messages is not None:
        wire.register_all(spec.client_messages.load())


async def _call(node: PeerConfig, context: ssl.SSLContext, call: ServiceCall) -> Message:
    def accept(reply: object) -> ServiceReply | None:
        return reply if isinstance(reply, ServiceReply) and reply.nonce == call.nonce else None

    return _result(node.id, await ask_once(node, context, call, accept))


def _result(node: str, reply: ServiceReply) -> Message:
    status = client_protocol.ReplyStatus
    if reply.status == status.OK and reply.result is not None:
        return reply.result
    if reply.status == status.FORBIDDEN:
        raise Forbidden(f"{node}: {reply.message}", replica=node)
    raise RequestRejected(f"{node}: {reply.message or reply.status.name}", replica=node)


async def call_service(cluster: ClusterConfig, node: str, service: str, request: Message, *,
                       seconds: float = 5.0, nonce: int = 1) -> Message:
    """Send `request` to service `service` of `node`; its reply (see the module errors)."""
    _register(service)
    peers = {n.id: n for n in cluster.nodes}
    if node not in peers:
        raise ValueError(f"no node {node!r} in the cluster (nodes: {', '.join(peers)})")
    context = _context(cluster)
    call = ServiceCall(nonce=nonce, service=service, request=request)
    with trio.move_on_after(seconds):
        try:
            return await _call(peers[node], context, call)
        except (OSError, ssl.SSLError, trio.BrokenResourceError) as e:
            raise ClientTimeout(f"{node}: no answer", last_error=str(e) or repr(e)) from None
    raise ClientTimeout(f"{node}: no answer within {seconds:g} s")


async def call_every_node(cluster: ClusterConfig, service: str, request: Message, *,
                          seconds: float = 5.0) -> Mapping[str, Message | ClientError]:
    """`call_service` on every node concurrently: node -> reply, or the error it raised."""
    out: dict[str, Message | ClientError] = {}

    async def one(node: str) -> None:
        try:
            out[node] = await call_service(cluster, node, service, request, seconds=seconds)
        except ClientError as e:
            out[node] = e

    async with trio.open_nursery() as nursery:
        for n in cluster.nodes:
            nursery.start_soon(one, n.id)
    return {n.id: out[n.id] for n in cluster.nodes}

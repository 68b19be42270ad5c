"""A small blocking one-shot client for command-line tools: one call, stdlib sockets.

Owns: `quick_call(cluster, command, ...)` (one application command or read, its result),
`supports(cluster)`, `client_identity(path)` (the client name a certificate file names)
and `tls_context(cluster)`. `phalanx kv` and `phalanx call` use it so that a call costs
what it does: the standard library (socket, ssl, threading), the codec (`net.wire`), the
framing and the client protocol's messages; no trio, no `cryptography`, no async client.

What it promises is `phalanx.Client`'s for one call (`phalanx.client.errors`): the result
once the cluster applied (or served) it; `RequestRejected`/`Forbidden`: certainly no effect;
`ClusterUnreachable` at once when every node refused the connection (nothing was sent);
`ClientTimeout`/`StorageUnavailable` at the deadline: it may or may not have taken effect.
Retries reuse the call's (client_id, request_no), so the replicas apply it at most once.

Strategies (the protocol's `CallStrategy`): LEADER (Raft): one node at a time, following
REDIRECT hints, the next node after a connection failure or RETRY; MATCHING_REPLIES (PBFT):
a connection to every replica (a thread each) subscribed first (`ClientHello`, so a backup
that executes the call before the call reaches it still answers), then the call to all at
once (resent every second), the result once f+1 replicas answered the same (status,
result, message). ENDORSEMENT (signed transactions) is not
here: `supports` says False and the caller uses `phalanx.Client`.

Each server must present a cluster-CA certificate naming the node dialled (as
`phalanx.client.connection` checks); TLS settings are `phalanx.ops.pki.client_context`'s
(TLS 1.3, strict X.509), duplicated here because that module imports `cryptography`
(tests/client/test_quick_client.py holds them equal). Not deterministic: real sockets and
the real clock.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from phalanx.client.errors import (
    ClientError,
    ClientTimeout,
    ClusterUnreachable,
    Forbidden,
    RequestRejected,
    StorageUnavailable,
)
from phalanx.consensus.types import ClientRequest
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import (
    ClientCall,
    ClientHello,
    ClientHelloReply,
    ClientReply,
    ReadConsistency,
    ReplyStatus,
)
from phalanx.net.framing import FrameDecoder, FrameError, encode_frame
from phalanx.protocols import CallStrategy
from phalanx.protocols import get as protocol_spec

if TYPE_CHECKING:
    from phalanx.ops.node_config import ClusterConfig, PeerConfig

NODE_URN_PREFIX: Final = "urn:phalanx:node:"
CLIENT_URN_PREFIX: Final = "urn:phalanx:client:"
"""`phalanx.ops.pki`'s (a test holds them equal)."""
BACKOFF_S: Final = 0.05
ATTEMPT_S: Final = 1.0
"""How long one node may take to answer before the next is tried (the same ids)."""
RESEND_S: Final = 1.0
_RECEIVE: Final = 64 * 1024


def supports(cluster: ClusterConfig) -> bool:
    """Whether `quick_call` can call this cluster (not for signed transactions)."""
    return protocol_spec(cluster.protocol).call_strategy is not CallStrategy.ENDORSEMENT


def client_identity(path: Path) -> str | None:
    """The client name the PEM certificate at `path` names (its ``urn:phalanx:client:``
    URI), or None. Read with the standard library's certificate decoder (the dict
    `getpeercert` gives); raises OSError/ValueError for a file it cannot read."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:  # pragma: no cover - another Python: the full parser
        from phalanx.ops import pki

        identity = pki.identity_from_certificate(path)
        return identity.name if identity is not None and identity.kind == "client" else None
    try:
        decoded = decode(str(path))
    except ssl.SSLError as e:
        raise ValueError(f"not a PEM certificate: {e}") from None
    return _uri_name(decoded, CLIENT_URN_PREFIX)


def _uri_name(decoded: dict[str, Any] | None, prefix: str) -> str | None:
    found = [value[len(prefix):] for kind, value in (decoded or {}).get("subjectAltName", ())
             if kind == "URI" and isinstance(value, str) and value.startswith(prefix)]
    return found[0] if len(found) == 1 else None


def tls_context(cluster: ClusterConfig) -> ssl.SSLContext:
    """`pki.client_context(cluster.ca, certificate=..., private_key=..., check_hostname=
    False)`: the node id is checked on the certificate instead of the host name."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=cluster.ca)
    context.load_cert_chain(cluster.client_cert, cluster.client_key)
    return context


class _Refused(Exception):
    """Nothing listens at the node's client port."""


class _Garbled(ValueError):
    """A node sent a frame the codec refused (a peer's bytes are input: that node is out
    for this attempt, the call goes on elsewhere)."""


class _Link:
    """One TLS connection to one node's client port (blocking, with the call's deadline)."""

    def __init__(self, node: PeerConfig, context: ssl.SSLContext, deadline: float) -> None:
        self.node = node.id
        timeout = max(0.001, deadline - time.monotonic())
        try:
            raw = socket.create_connection((node.client_addr.host, node.client_addr.port),
                                           timeout=timeout)
        except ConnectionRefusedError:
            raise _Refused(node.id) from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock = context.wrap_socket(raw)
        except BaseException:
            raw.close()
            raise
        if _uri_name(self.sock.getpeercert(), NODE_URN_PREFIX) != node.id:
            self.sock.close()
            raise OSError(f"{node.id}'s certificate does not name node {node.id}")
        self.decoder = FrameDecoder()

    def send(self, call: ClientCall) -> None:
        self.sock.sendall(encode_frame(wire.encode(call)))

    def reply(self, request: ClientRequest, deadline: float) -> ClientReply:
        """The next reply to `request`. Raises OSError (incl. timeout) or FrameError."""
        while True:
            while (frame := self.decoder.next_frame()) is not None:
                message = self._decode(frame)
                if (isinstance(message, ClientReply) and message.client_id == request.client_id
                        and message.request_no == request.request_no):
                    return message
            self._receive(deadline)

    def subscribe(self, client_id: str, deadline: float) -> None:
        """`ClientHello`: this node answers our requests it executes, asked or not (a PBFT
        backup that executes the call before the call itself reaches it)."""
        self.sock.sendall(encode_frame(wire.encode(ClientHello(client_id=client_id))))
        while True:
            while (frame := self.decoder.next_frame()) is not None:
                if isinstance(self._decode(frame), ClientHelloReply):
                    return
            self._receive(deadline)

    def _decode(self, frame: bytes) -> object:
        try:
            return wire.decode(frame)
        except Exception as e:  # the codec's DecodeError (not re-exported by net.wire)
            raise _Garbled(f"{self.node} sent an undecodable frame: {e}") from None

    def _receive(self, deadline: float) -> None:
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        data = self.sock.recv(_RECEIVE)
        if not data:
            raise OSError(f"{self.node} closed the connection")
        self.decoder.feed(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def quick_call(cluster: ClusterConfig, command: bytes, *, read_only: bool = False,
               consistency: ReadConsistency = ReadConsistency.LINEARIZABLE,
               timeout: float = 5.0) -> bytes:
    """Submit one command (or read) and return its result (see the module docstring)."""
    client_protocol.register()
    spec = protocol_spec(cluster.protocol)
    name = client_identity(cluster.client_cert)
    if name is None:
        raise RequestRejected(f"{cluster.client_cert} names no phalanx client")
    # (`<name>/<32 hex>` as `pki.new_client_id`; os.urandom: `uuid` imports `platform`)
    request = ClientRequest(client_id=f"{name}/{os.urandom(16).hex()}", request_no=1,
                            command=command, read_only=read_only)
    call = ClientCall(request=request, consistency=consistency)
    context = tls_context(cluster)
    deadline = time.monotonic() + timeout
    if spec.call_strategy is CallStrategy.LEADER:
        return _leader_call(cluster, context, call, deadline, timeout)
    if spec.call_strategy is CallStrategy.MATCHING_REPLIES:
        return _matching_call(cluster, context, call, deadline, timeout,
                              need=spec.max_faults(len(cluster.nodes)) + 1)
    raise ValueError(f"protocol {cluster.protocol}: use phalanx.Client (signed transactions)")


def _unreachable(cluster: ClusterConfig) -> ClusterUnreachable:
    """`phalanx.Client`'s words for it (`fail_fast`)."""
    refusals = ", ".join(f"{n.id} ({n.client_addr.host}:{n.client_addr.port})"
                         for n in cluster.nodes)
    return ClusterUnreachable(f"connection refused by every node: {refusals}; nothing was "
                              "sent, so the call had no effect (is the cluster running?)")


def _final(reply: ClientReply, by: str) -> bytes | None:
    """The result of a final reply; raises for a refusal (`by`: who refused, worded as the
    async client words it); None for REDIRECT/RETRY/UNAVAILABLE."""
    if reply.status is ReplyStatus.OK:
        return reply.result
    if reply.status is ReplyStatus.ERROR:
        raise RequestRejected(reply.message or "refused", replica=reply.replica)
    if reply.status is ReplyStatus.FORBIDDEN:
        raise Forbidden(f"forbidden by {by}: {reply.message or 'forbidden'}",
                        replica=reply.replica)
    return None


def _leader_call(cluster: ClusterConfig, context: ssl.SSLContext, call: ClientCall,
                 deadline: float, timeout: float) -> bytes:
    nodes = {n.id: n for n in cluster.nodes}
    order = [n.id for n in cluster.nodes]
    target = order[0]
    links: dict[str, _Link] = {}
    refused: set[str] = set()
    reached = unavailable = False
    last = "no node answered"
    try:
        while time.monotonic() < deadline:
            link = links.get(target)
            try:
                if link is None:
                    link = links[target] = _Link(nodes[target], context, deadline)
                    reached = True
                link.send(call)
                reply = link.reply(call.request, min(deadline, time.monotonic() + ATTEMPT_S))
            except _Refused:
                refused.add(target)
                if not reached and len(refused) == len(order):
                    raise _unreachable(cluster) from None
                last = f"{target} refused the connection"
                target = order[(order.index(target) + 1) % len(order)]
                continue
            except (OSError, FrameError, ValueError) as e:  # incl. timeouts, bad frames
                dropped = links.pop(target, None)
                if dropped is not None:
                    dropped.close()
                last = f"{target}: {e or type(e).__name__}"
                target = order[(order.index(target) + 1) % len(order)]
                time.sleep(min(BACKOFF_S, max(0.0, deadline - time.monotonic())))
                continue
            result = _final(reply, target)
            if result is not None:
                return result
            unavailable = reply.status is ReplyStatus.UNAVAILABLE
            last = f"{target}: {reply.status.name.lower()} {reply.message}".strip()
            hint = reply.leader_hint
            if reply.status is ReplyStatus.REDIRECT and hint in nodes and hint != target:
                target = hint
                continue
            target = order[(order.index(target) + 1) % len(order)]
            time.sleep(min(BACKOFF_S, max(0.0, deadline - time.monotonic())))
    finally:
        for link in links.values():
            link.close()
    if unavailable:
        raise StorageUnavailable(f"no answer within {timeout:g}s", last_error=last)
    raise ClientTimeout(f"no answer within {timeout:g}s", last_error=last)


def _matching_call(cluster: ClusterConfig, context: ssl.SSLContext, call: ClientCall,
                   deadline: float, timeout: float, *, need: int) -> bytes:
    """Every replica at once; the result f+1 (`need`) replicas agree on."""
    import queue  # (a thread per replica: only this strategy needs them)
    import threading

    answers: queue.Queue[tuple[str, ClientReply | Exception]] = queue.Queue()
    stop = threading.Event()

    connected = threading.Semaphore(0)
    go = threading.Event()
    client_id = call.request.client_id

    def ask(node: PeerConfig) -> None:
        try:
            link = _Link(node, context, deadline)
        except Exception as e:  # refused, unreachable, a bad certificate: this node is out
            answers.put((node.id, e))
            connected.release()
            return
        try:
            try:
                link.subscribe(client_id, min(deadline, time.monotonic() + RESEND_S))
            finally:
                connected.release()
            go.wait(max(0.0, deadline - time.monotonic()))
            while not stop.is_set() and time.monotonic() < deadline:
                link.send(call)  # (again after RESEND_S: a retransmission, same ids)
                try:
                    reply = link.reply(call.request, min(deadline, time.monotonic() + RESEND_S))
                except TimeoutError:
                    continue
                answers.put((node.id, reply))
                if reply.status is not ReplyStatus.RETRY:
                    return
                time.sleep(BACKOFF_S)
        except Exception as e:
            answers.put((node.id, e))
        finally:
            link.close()

    for node in cluster.nodes:
        threading.Thread(target=ask, args=(node,), daemon=True).start()
    # Every replica subscribed (or out) before any sees the call: a backup that executes it
    # from the primary's pre-prepare then answers on its subscribed connection.
    for _ in cluster.nodes:
        if not connected.acquire(timeout=max(0.001, min(deadline, time.monotonic() + RESEND_S)
                                             - time.monotonic())):
            break
    go.set()
    votes: dict[tuple[ReplyStatus, bytes, str], set[str]] = {}
    refused: set[str] = set()
    failed: set[str] = set()
    last = "no replica answered"
    try:
        while len(failed) < len(cluster.nodes):
            try:
                name, answer = answers.get(timeout=max(0.001, deadline - time.monotonic()))
            except queue.Empty:
                break
            if isinstance(answer, Exception):
                failed.add(name)
                refused.update((name,) if isinstance(answer, _Refused) else ())
                last = f"{name}: {answer or type(answer).__name__}"
                if len(refused) == len(cluster.nodes):
                    raise _unreachable(cluster)
                continue
            last = f"{name}: {answer.status.name.lower()} {answer.message}".strip()
            if answer.status in (ReplyStatus.OK, ReplyStatus.ERROR, ReplyStatus.FORBIDDEN):
                key = (answer.status, answer.result, answer.message)
                voters = votes.setdefault(key, set())
                voters.add(name)
                result = _final(answer, f"{need} replicas") if len(voters) >= need else None
                if result is not None:  # (_final raised for f+1 matching refusals)
                    return result
            elif answer.status is not ReplyStatus.RETRY:  # (RETRY: its thread asks again)
                failed.add(name)
    finally:
        stop.set()
    raise ClientTimeout(f"no {need} matching replies within {timeout:g}s", last_error=last)


__all__ = ["ClientError", "client_identity", "quick_call", "supports", "tls_context"]

"""The client library: `Client`, an async (trio) handle on a phalanx cluster, and its errors.

This module owns the client side of `phalanx.net.client_protocol`: one lazily dialled TLS
connection per node, pipelining, leader discovery, retries and deadlines. The PBFT call
path comes from `phalanx.client.bft_calls.PbftCalls`, the typed KV helpers from
`phalanx.client.kv.KvHelpers` and the errors from `phalanx.client.errors` (re-exported
here). `phalanx.client.sync_client.SyncClient` wraps it for non-async programs.

Must not import: consensus cores (except the pure `quorum`), storage, the runtime
(`phalanx.runtime.node`), the CLI. Never pickles.

Connections (`phalanx.client.connection.ConnectionPool`): one lazily dialled TLS connection per
node, its node id checked against the certificate, shared by any number of concurrent calls;
when it fails, every call waiting on that node is told at once and the next send dials again.

Sessions and exactly-once. The replica layer keeps ONE session per client id: a write
(client_id, n) runs iff n exceeds the session's last number, n equal to it gets the cached
reply, and a smaller n is refused as expired. Pipelined writes under one id could therefore
refuse each other. So a `Client` writes through *lanes*: sub-sessions ``<client_id>#<k>``,
each with at most one write in flight; a lane is reused (lowest first) once its call ends.
Request numbers come from one per-client counter, so they increase on every lane and are
unique within the client (replies are matched by number, then checked against the lane id).
A retry — after a redirect, a RETRY, a lost connection or a silent node — resends the
SAME encoded frame, so the replica's session table applies the write at most once.

Outcomes (what each error promises):
- returns: the command took effect exactly once (reads: a value the read observed).
- `RequestRejected` (and its `KvCommandError`, `Forbidden`): certainly had no effect.
  `Forbidden`: the client certificate's role does not allow the call (a read-only client's
  write) or the session id is not the certificate's.
- `ClientTimeout`: the overall deadline passed; the command MAY OR MAY NOT have taken
  effect, now or later (a history checker records it as indeterminate, ``info``).
- `ClientClosed`: the client was closed; as indeterminate as a timeout.
- `StorageUnavailable` (a `ClientTimeout`): the deadline passed and the last node tried
  answered UNAVAILABLE (its storage cannot take writes: disk full); as indeterminate.
- `Forbidden` (FORBIDDEN): certainly had no effect.

How calls are made follows the protocol's `phalanx.protocols.CallStrategy`.
LEADER (Raft): requests go to the node believed to lead; REDIRECT hints are followed at once;
RETRY, failures and silent nodes rotate to the next node after a jittered backoff, except
a RETRY whose hint names the replying node itself ("I lead, but I am overloaded"), which is
resent to that same node after the backoff.

Slowness is not failure. A call waits for its node as long as the connection to it is
alive and the node is heard from: when `attempt_timeout` passes without an answer, a status
probe (at most one per connection per `attempt_timeout`) asks the node whether it still
leads, and the call keeps waiting while any frame arrived from that node within the last
`attempt_timeout` (it is answering other calls or the probe: busy, not dead). The call
moves on only when the node has been silent for `attempt_timeout` (probe unanswered) or
the probe says it no longer leads. Resending a merely slow call would add a redirect
round trip and a duplicate proposal per call, and under overload (median latency above the
attempt timeout) those retries fed the overload they came from.
MATCHING_REPLIES (PBFT; `phalanx.client.bft_calls.PbftCalls`): a request is accepted once f+1
distinct
replicas (identified by their certificates, not by what they claim) return the same status
and result (Castro-Liskov §4.1). It goes to the primary alone when f+1 replicas name it and
enough backups subscribed (`ClientHello`) to answer it unasked, and to every replica
otherwise and on a retransmission; a STALE read always goes to every replica.
ENDORSEMENT (leaderless; `phalanx.client.endorsement_calls.EndorsementCalls`): each write
and linearizable read is a `Transaction` signed with the client's key (`signer`), with an
absolute deadline and the caller's `requirements` (key -> version), sent to every node
(the same signed bytes on every retry) and decided by f+1 matching answers; f+1 matching
ABORTED answers raise `TransactionAborted` (a `RequestRejected`: certainly no effect). A
STALE read goes to one node, as a Raft call does.

Not deterministic and not run by the simulator: it uses the real clock and a private
`random.Random` for backoff jitter.
"""

from __future__ import annotations

import bisect
import math
import random
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import trio

from phalanx.client.bft_calls import PbftCalls
from phalanx.client.connection import (
    CallTimer,
    ClientStatistics,
    ConnectionPool,
    NodeAddress,
    PendingCall,
)
from phalanx.client.endorsement_calls import EndorsementCalls, wall_clock
from phalanx.client.errors import (
    ClientClosed,
    ClientError,
    ClientTimeout,
    ClusterUnreachable,
    Forbidden,
    KvCommandError,
    ProtocolViolation,
    RequestRejected,
    StorageUnavailable,
    TransactionAborted,
)
from phalanx.client.kv import KvHelpers
from phalanx.client.latency import LatencyHistogram, LatencySnapshot
from phalanx.client.leader_calls import UNAVAILABLE, LeaderCalls
from phalanx.consensus.quorum import max_byzantine_faults
from phalanx.consensus.types import ClientRequest
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import (
    ClientCall,
    ClientHello,
    ClientReply,
    ReadConsistency,
    StatusCall,
    StatusReply,
)
from phalanx.net.framing import DEFAULT_MAX_FRAME_SIZE, encode_frame
from phalanx.net.transport import Backoff
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig, ConfigError, load_cluster_config
from phalanx.protocols import DEFAULT_PROTOCOL, CallStrategy
from phalanx.protocols import get as protocol_spec

if TYPE_CHECKING:
    from phalanx.ops.signing_keys import TransactionSigner

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientStatistics",
    "ClientTimeout",
    "Forbidden",
    "KvCommandError",
    "NodeAddress",
    "ProtocolViolation",
    "RequestRejected",
    "StorageUnavailable",
    "TransactionAborted",
    "open_client",
]

client_protocol.register()

"""How a last error records an UNAVAILABLE answer (`StorageUnavailable` at the deadline)."""

class Client(EndorsementCalls, KvHelpers, PbftCalls, LeaderCalls):
    """An async handle on a phalanx cluster. Open it with `open_client` / `Client.connect`.

    Concurrency: any number of tasks may call it at once; calls are pipelined over one
    connection per node.

    Deadlines: every call ends by `timeout` seconds (the attribute; assignable) with
    `ClientTimeout`. For a shorter bound on one call, use trio's own cancel scopes
    (``with trio.fail_after(0.5): await client.put(...)``): the outcome of a cancelled write
    is as indeterminate as a timed-out one.
    """

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        ssl_context: ssl.SSLContext,
        protocol: str = DEFAULT_PROTOCOL,
        client_id: str | None = None,
        timeout: float = 5.0,
        attempt_timeout: float = 1.0,
        backoff: Backoff | None = None,
        verify_node_ids: bool = True,
        rng: random.Random | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        signer: TransactionSigner | None = None,
        endorse_all: bool = True,
        abort_grace: float = 1.0,
        wall_clock: Callable[[], float] = wall_clock,
        fail_fast: bool = False,
    ) -> None:
        spec = protocol_spec(protocol)  # UnknownProtocol (a ValueError) names the known ones
        if not (timeout > 0 and attempt_timeout > 0):
            raise ValueError("timeout and attempt_timeout must be > 0")
        self._stats = ClientStatistics()
        self._latency = LatencyHistogram()
        self.protocol = protocol
        self._matching_replies = spec.call_strategy is CallStrategy.MATCHING_REPLIES
        self.signs_transactions = spec.call_strategy is CallStrategy.ENDORSEMENT
        """Whether calls are signed transactions (ENDORSEMENT): the KV helpers then carry
        version requirements."""
        self._signer = signer
        self.endorse_all = endorse_all
        self.abort_grace = abort_grace
        self.fail_fast = fail_fast
        """Raise `ClusterUnreachable` as soon as every node refused the connection and
        nothing was sent (command-line tools); default: keep trying until the deadline (a
        cluster that is still starting)."""
        self._wall_clock = wall_clock
        self.client_id = uuid.uuid4().hex if client_id is None else client_id
        hello = None
        if self._matching_replies or self.signs_transactions:
            # subscribe: nodes answer requests they did not get from this client
            hello = encode_frame(wire.encode(ClientHello(client_id=self.client_id)))
        self._pool = ConnectionPool(nodes, ssl_context=ssl_context,
                                    verify_node_ids=verify_node_ids,
                                    dial_timeout=attempt_timeout, max_frame_size=max_frame_size,
                                    stats=self._stats, hello=hello)
        self._slots = self._pool.slots
        self._timer = CallTimer()
        """Ends the leader path's attempt waits (its task runs in `open_client`'s nursery)."""
        self._order = tuple(self._slots)
        self._faults = max_byzantine_faults(len(self._order))
        self._primary_probed = -math.inf
        self._ssl_context = ssl_context
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self._backoff = backoff or Backoff(base=0.02, cap=1.0)
        self._verify_node_ids = verify_node_ids
        self._rng = rng or random.Random()
        self._max_frame_size = max_frame_size
        self._leader: str = self._order[self._rng.randrange(len(self._order))]
        self._next_request_no = 1
        self._next_nonce = 1
        self._free_lanes: list[int] = []  # sorted: the lowest free lane is reused first
        self._lane_count = 0
        self._closed = False

    # ------------------------------------------------------------------ opening

    @staticmethod
    def connect(
        cluster: ClusterConfig | str | Path | Sequence[NodeAddress],
        **options: Unpack[ClientOptions],
    ) -> AbstractAsyncContextManager[Client]:
        """``async with Client.connect(cluster_dir) as client:`` — the same as `open_client`."""
        return open_client(cluster, **options)

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._order

    @property
    def leader(self) -> str:
        """The node this client currently sends to first (its belief about the leader)."""
        return self._leader

    def statistics(self) -> ClientStatistics:
        s = self._stats
        return ClientStatistics(
            calls=s.calls, retries=s.retries, redirects=s.redirects, timeouts=s.timeouts,
            primary_only=s.primary_only,
            patient_waits=s.patient_waits, probes=s.probes,
            connections_opened=s.connections_opened,
            connection_failures=s.connection_failures, replies_dropped=s.replies_dropped,
        )

    def latency(self) -> Mapping[tuple[str, str], LatencySnapshot]:
        """Call latencies so far by (kind, outcome): ``("write", "ok")``, ``("read",
        "error")``, ... (`phalanx.client.latency`; `LatencyCollector` exports them)."""
        return self._latency.snapshot()

    def _close(self) -> None:
        self._closed = True
        self._pool.fail_all()

    # ------------------------------------------------------------------ the core call

    async def call(
        self,
        command: bytes,
        *,
        read_only: bool = False,
        consistency: ReadConsistency = ReadConsistency.LINEARIZABLE,
        requirements: Mapping[str, bytes] | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """Submit one encoded application command and return its encoded result.

        Writes are applied exactly once if this returns, at most once otherwise. Reads
        (`read_only=True`) are linearizable unless `consistency` is `STALE`, which the
        contacted node serves from its applied state (possibly behind).

        ENDORSEMENT protocols only (`signs_transactions`): `requirements` (key -> version,
        b"" for an absent key) must hold where the transaction commits; `deadline` is its
        absolute deadline (wall clock, seconds since the Unix epoch; default now +
        `timeout`), and the call waits for its outcome until `abort_grace` after it. A
        linearizable read is a read-only transaction: give it requirements on what it reads.

        Raises:
            ClientTimeout: the deadline passed; the command may or may not have taken effect.
            RequestRejected: the cluster refused it; it had no effect.
            TransactionAborted: (ENDORSEMENT) f+1 nodes report it aborted; it had no effect.
            ClientClosed: the client was closed.
        """
        self._check_running()
        if consistency is ReadConsistency.STALE and not read_only:
            raise ValueError("STALE consistency only applies to read_only calls")
        if (requirements or deadline is not None) and not self.signs_transactions:
            raise ValueError(f"requirements and deadlines are for protocols whose clients "
                             f"sign transactions, not {self.protocol}")
        endorsed = self.signs_transactions and consistency is ReadConsistency.LINEARIZABLE
        started = trio.current_time()
        deadline_at = started + self.timeout
        lane = None if read_only else self._take_lane()
        client_id = self.client_id if lane is None else f"{self.client_id}#{lane}"
        request_no = self._new_request_no()
        expires = 0.0
        try:
            if endorsed:
                frame, expires = self._transaction_frame(
                    client_id, request_no, command, read_only=read_only,
                    requirements=requirements or {}, deadline=deadline)
            else:
                request = ClientRequest(client_id=client_id, request_no=request_no,
                                        command=command, read_only=read_only)
                # One encode per call: every retry and every replica gets these same bytes.
                frame = encode_frame(
                    wire.encode(ClientCall(request=request, consistency=consistency)),
                    max_frame_size=self._max_frame_size,
                )
        except BaseException:
            if lane is not None:
                self._release_lane(lane)
            raise
        call: PendingCall[ClientReply] = PendingCall(client_id, request_no)
        call.unsent_mark = self._pool.unsent_mark()
        self._stats.calls += 1
        outcome = "error"
        try:
            if endorsed:
                result = await self._call_endorsed(call, frame, expires)
                outcome = "ok"
                return result
            if self._matching_replies:
                # A STALE read is answered by each replica it reaches, from its own state:
                # the primary alone would give one answer, never f+1.
                alone = consistency is ReadConsistency.LINEARIZABLE
                result = await self._call_all(call, frame, deadline_at, alone=alone)
                outcome = "ok"
                return result
            # A stale read may be answered by a follower: that says nothing about the leader.
            learn = consistency is ReadConsistency.LINEARIZABLE
            result = await self._call_leader(call, frame, deadline_at, learn_leader=learn)
            outcome = "ok"
            return result
        finally:
            self._latency.observe("read" if read_only else "write", outcome,
                                  trio.current_time() - started)
            self._pool.forget(request_no)
            if lane is not None:
                self._release_lane(lane)

    def _new_request_no(self) -> int:
        request_no = self._next_request_no
        self._next_request_no += 1
        return request_no

    def _client_id(self) -> str:
        return self.client_id

    def _take_lane(self) -> int:
        if self._free_lanes:
            return self._free_lanes.pop(0)
        self._lane_count += 1
        return self._lane_count - 1

    def _release_lane(self, lane: int) -> None:
        bisect.insort(self._free_lanes, lane)

    def _timed_out(
        self, call: PendingCall[ClientReply] | PendingCall[StatusReply], last_error: str | None
    ) -> ClientTimeout:
        self._stats.timeouts += 1
        if last_error is not None and UNAVAILABLE in last_error:
            return StorageUnavailable(
                f"call {call.client_id}/{call.request_no}: {last_error.split(UNAVAILABLE)[1]} "
                f"(node {last_error.split(UNAVAILABLE)[0]}); it may or may not have taken "
                "effect", last_error=last_error)
        return ClientTimeout(
            f"call {call.client_id}/{call.request_no} timed out after {self.timeout}s; "
            "it may or may not have taken effect",
            last_error=last_error,
        )

    def _check_running(self) -> None:
        if self._closed:
            raise ClientClosed("client is closed")
        if self._pool.nursery is None:
            raise ClientClosed("use open_client(...) to run a Client")

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("client closed during the call; outcome unknown")

    async def _back_off(
        self, call: PendingCall[ClientReply], attempt: int, deadline: float, last_error: str | None
    ) -> None:
        if self.fail_fast and self._pool.nothing_sent(call):
            raise ClusterUnreachable(
                f"connection refused by every node: {self._pool.refusals()}; nothing was "
                "sent, so the call had no effect (is the cluster running?)")
        delay = self._backoff.delay(attempt, self._rng)
        if trio.current_time() + delay >= deadline:
            await trio.sleep_until(deadline)
            raise self._timed_out(call, last_error)
        await trio.sleep(delay)

    # ------------------------------------------------------------------ status

    async def status(self, node: str) -> StatusReply:
        """Ask `node` for its `StatusReply`.

        Raises:
            ClientTimeout: no reply within the timeout (node down or unreachable).
            KeyError: `node` is not one of this client's nodes.
        """
        self._check_running()
        slot = self._slots[node]
        nonce = self._next_nonce
        self._next_nonce += 1
        waiter: PendingCall[StatusReply] = PendingCall(self.client_id, nonce)
        slot.statuses[nonce] = waiter
        deadline = trio.current_time() + self.timeout
        last_error: str | None = None
        try:
            self._pool.queue(slot, encode_frame(wire.encode(StatusCall(nonce=nonce))))
            with trio.move_on_at(deadline):
                _, reply = await waiter.next()
                if reply is not None:
                    return reply
                last_error = f"connection to {node} lost"
            self._check_open()
            raise self._timed_out(waiter, last_error or f"no status from {node}")
        finally:
            slot.statuses.pop(nonce, None)

    # ------------------------------------------------------------------ typed KV helpers

    # ------------------------------------------------------------------ connections


class ClientOptions(TypedDict, total=False):
    """Keyword options of `open_client` (see `Client`)."""

    ssl_context: ssl.SSLContext
    protocol: str
    client_id: str
    timeout: float
    attempt_timeout: float
    backoff: Backoff
    verify_node_ids: bool
    rng: random.Random
    max_frame_size: int
    signer: TransactionSigner
    endorse_all: bool
    abort_grace: float
    wall_clock: Callable[[], float]
    fail_fast: bool


@asynccontextmanager
async def open_client(
    cluster: ClusterConfig | str | Path | Sequence[NodeAddress],
    **options: Unpack[ClientOptions],
) -> AsyncIterator[Client]:
    """Open a `Client`; connections are dialled lazily, on first use.

    Args:
        cluster: a cluster directory (or its ``cluster.toml``), a loaded `ClusterConfig`, or
            ``(node_id, host, port)`` triples of the nodes' client ports.
        ssl_context: required with triples; with a cluster it defaults to the cluster CA and
            the cluster's client certificate (hostname checks off: node ids are pinned).
        protocol: a registered protocol name (`phalanx.protocols.names`; ``"raft"`` by
            default with triples): its `CallStrategy` decides how calls are made; a
            cluster's own protocol by default.
        client_id: the session id. Two live clients must not share one. A secured node
            accepts only ids its client certificate owns (``<name>``, ``<name>/...``,
            ``<name>#...``; `phalanx.runtime.client_auth`): with a cluster the default is
            ``<name>/<uuid4 hex>`` for the cluster's client certificate
            (`phalanx.ops.pki.new_client_id`); with triples, pass one (default: a random uuid4
            hex, which only a node in the insecure mode accepts).
        timeout: the default deadline of each operation, in seconds.
        attempt_timeout: how long a node may stay silent (no bytes at all, and then no
            answer to a status probe) before a call waiting on it moves on (same request
            number); a node that is heard from is waited for up to the deadline. Also the
            bound on dialling a node.
        backoff: jittered exponential delays between rotations (`net.transport.Backoff`).
        verify_node_ids: check that each node's certificate names the node id it is
            listed under.
        signer: (ENDORSEMENT protocols) the client's `TransactionSigner`; with a cluster
            the default is the key ``cluster.toml`` names (``[client] signing_key``).
        endorse_all: (ENDORSEMENT) send each transaction to every node (default), or to
            f+1 of them first (every retry goes to all).
        abort_grace: (ENDORSEMENT) how long past a transaction's deadline the call waits
            for f+1 matching outcomes (abort notices come after the deadline).
        wall_clock: (ENDORSEMENT) the clock of transaction deadlines (tests).
        fail_fast: raise `ClusterUnreachable` (no effect) at once when every node refuses
            the connection and nothing was sent, instead of trying until the deadline (for
            command-line tools; a program starting its own cluster wants the default).

    Raises:
        phalanx.ops.node_config.ConfigError: the cluster directory is invalid, or its client
            certificate names no client.
    """
    if isinstance(cluster, str | Path):
        cluster = load_cluster_config(cluster)
    if isinstance(cluster, ClusterConfig):
        nodes: list[NodeAddress] = [
            (n.id, n.client_addr.host, n.client_addr.port) for n in cluster.nodes
        ]
        options.setdefault("protocol", cluster.protocol)
        if "client_id" not in options:
            try:
                options["client_id"] = pki.new_client_id(cluster.client_cert)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{cluster.client_cert}: not a usable client certificate "
                                  f"({e})") from None
        if ("signer" not in options and cluster.client_signing_key is not None
                and protocol_spec(options["protocol"]).call_strategy
                is CallStrategy.ENDORSEMENT):
            from phalanx.ops.signing_keys import SigningKeyError, TransactionSigner

            try:
                options["signer"] = TransactionSigner.from_file(cluster.client_signing_key)
            except SigningKeyError as e:
                raise ConfigError(str(e)) from None
        if "ssl_context" not in options:
            options["ssl_context"] = pki.client_context(
                cluster.ca,
                certificate=cluster.client_cert,
                private_key=cluster.client_key,
                check_hostname=False,
            )
    else:
        nodes = list(cluster)
    if "ssl_context" not in options:
        raise TypeError("open_client needs ssl_context when given node addresses")
    client = Client(nodes, **options)  # validate before anything runs
    async with trio.open_nursery() as nursery:
        client._pool.nursery = nursery
        nursery.start_soon(client._timer.run, name="client:timer")
        try:
            yield client
        finally:
            client._close()
            nursery.cancel_scope.cancel()

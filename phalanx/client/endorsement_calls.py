"""The ENDORSEMENT call path of the client library (the leaderless core, after PnyxDB):
`EndorsementCalls`, a mixin of `phalanx.client.Client`, and `MatchingReplies`, the pure
rule that decides a call from the nodes' answers.

Owns: how a signed transaction is built, sent and decided, and how a read is answered.

- A write, or a linearizable read, becomes one `Transaction` (client key name, the lane's
  session id and the request number, `deadline_ms` = the wall clock now + the call timeout
  or an explicit absolute deadline, the requirements sorted by key, the command,
  `read_only`), signed with the client's key (`phalanx.ops.signing_keys.TransactionSigner`)
  and encoded with the codec into `ClientRequest.command` (`ClientRequest.read_only` is the
  transaction's). It goes to EVERY node (or to f+1 of them when `endorse_all` is False: the
  first attempt only; a node that gets a transaction from a peer answers it only if this
  client subscribed there). Retries resend the SAME frame, so the same signed transaction
  (the same id: nodes deduplicate by it).
- Decided by `MatchingReplies`: f+1 distinct nodes (by certificate) whose latest answers
  match. OK with the same result → the result; ABORTED → `TransactionAborted` (definite: no
  correct node applies it); ERROR → `RequestRejected`; FORBIDDEN → `Forbidden`. Anything
  else (RETRY, UNAVAILABLE, a lost connection, mixed answers) decides nothing: the call
  resends after `attempt_timeout` and a jittered backoff.
- The call waits until the transaction's deadline plus `abort_grace` (nodes refuse a
  transaction only once its deadline has passed on their clocks, so the abort notices come
  after it); then `ClientTimeout`: it may or may not take effect.
- Reads. STALE: one node answers from its applied state (possibly behind: it may miss
  writes that already completed elsewhere); it rotates on failure like a Raft call.
  Linearizable, the KV helpers (`phalanx.client.kv`): a read-only transaction carrying a
  requirement on the key's version, decided by f+1 matching OK answers (it commits only if
  Q nodes see that version, so it is ordered against every conflicting write). Where the
  caller gives no version the helper first takes f+1 matching STALE version reads
  (`matching_read`): at least one correct node holds that version (never a value nobody
  wrote), though maybe an old one, in which case the transaction aborts and the helper
  reads again.

Must not import: consensus cores (only the pure leaderless message types), storage, the
runtime. Not deterministic (the real clock).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import trio

from phalanx.client.connection import ClientStatistics, ConnectionPool, NodeSlot, PendingCall
from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected, TransactionAborted
from phalanx.consensus.types import ClientRequest
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReadConsistency, ReplyStatus
from phalanx.net.framing import encode_frame

_DECIDING = (ReplyStatus.OK, ReplyStatus.ABORTED, ReplyStatus.ERROR, ReplyStatus.FORBIDDEN)
"""Answers that count towards a decision; the others only explain a wait."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What f+1 nodes agreed on: the status, the result (OK) and one node's message."""

    status: ReplyStatus
    result: bytes
    message: str
    nodes: tuple[str, ...]


class MatchingReplies:
    """f+1 distinct nodes whose latest answers match decide a call (pure).

    An answer is keyed by its status, and for OK by its result too (an ABORTED, ERROR or
    FORBIDDEN reason may be worded differently by each node). A node's later answer replaces
    its earlier one, so a node cannot count twice, and a retried read converges on the
    nodes' newest states.
    """

    __slots__ = ("_latest", "_messages", "needed")

    def __init__(self, faults: int) -> None:
        self.needed = faults + 1
        self._latest: dict[str, tuple[ReplyStatus, bytes]] = {}
        self._messages: dict[str, str] = {}

    def add(self, node: str, reply: ClientReply) -> Decision | None:
        """Record `node`'s answer; the decision once f+1 nodes match, else None."""
        if reply.status not in _DECIDING:
            return None
        key = (reply.status, reply.result if reply.status is ReplyStatus.OK else b"")
        self._latest[node] = key
        self._messages[node] = reply.message
        agree = tuple(sorted(n for n, k in self._latest.items() if k == key))
        if len(agree) < self.needed:
            return None
        return Decision(status=key[0], result=key[1], message=self._messages[node],
                        nodes=agree)

    def summary(self) -> str:
        """The answers so far, for an indeterminate outcome's message."""
        counts: dict[str, int] = {}
        for status, _ in self._latest.values():
            counts[status.name] = counts.get(status.name, 0) + 1
        got = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no answers"
        return f"{got}; need {self.needed} matching"


def decide(decision: Decision, what: str) -> bytes:
    """The result of `decision`, or the error it means."""
    if decision.status is ReplyStatus.OK:
        return decision.result
    node = decision.nodes[0]
    reason = decision.message or "no reason given"
    if decision.status is ReplyStatus.ABORTED:
        raise TransactionAborted(reason, call=what, replicas=decision.nodes)
    if decision.status is ReplyStatus.FORBIDDEN:
        raise Forbidden(f"forbidden by {len(decision.nodes)} nodes: {reason}", replica=node)
    raise RequestRejected(reason, replica=node)


class EndorsementCalls:
    """ENDORSEMENT calls for `phalanx.client.Client`, which provides the state declared
    here (and `signer`, the client's `TransactionSigner`)."""

    timeout: float
    attempt_timeout: float
    abort_grace: float
    endorse_all: bool
    _wall_clock: Callable[[], float]
    _signer: object
    _order: tuple[str, ...]
    _faults: int
    _pool: ConnectionPool
    _slots: dict[str, NodeSlot]
    _stats: ClientStatistics
    _max_frame_size: int
    _check_open: Callable[[], None]
    _timed_out: Callable[[PendingCall[ClientReply], str | None], ClientTimeout]
    _back_off: Callable[[PendingCall[ClientReply], int, float, str | None], Awaitable[None]]

    def _transaction_frame(
        self, client_id: str, request_no: int, command: bytes, *, read_only: bool,
        requirements: Mapping[str, bytes], deadline: float | None,
    ) -> tuple[bytes, float]:
        """The encoded `ClientCall` carrying the signed transaction, and its deadline as an
        absolute wall-clock time in seconds."""
        from phalanx.client.kv import BaseVersion
        from phalanx.consensus.leaderless.messages import (
            LEADERLESS_MESSAGES,
            Requirement,
            Transaction,
        )
        from phalanx.ops.signing_keys import TransactionSigner

        signer = self._signer
        if not isinstance(signer, TransactionSigner):
            raise ValueError(
                "this cluster's clients sign their transactions: open the client with a "
                "signing key (signer=..., or a cluster directory whose cluster.toml names one)")
        wire.register_all(LEADERLESS_MESSAGES)
        expires = self._wall_clock() + self.timeout if deadline is None else deadline
        tx = signer.sign(Transaction(
            client=signer.name, client_id=client_id, request_no=request_no,
            deadline_ms=int(expires * 1000),
            requirements=tuple(
                Requirement(key=k, version=bytes(v), base=isinstance(v, BaseVersion))
                for k, v in sorted(requirements.items())),
            command=command, read_only=read_only,
        ))
        request = ClientRequest(client_id=client_id, request_no=request_no,
                                command=wire.encode(tx), read_only=read_only)
        frame = encode_frame(wire.encode(ClientCall(request=request)),
                             max_frame_size=self._max_frame_size)
        return frame, expires

    async def _call_endorsed(
        self, call: PendingCall[ClientReply], frame: bytes, expires: float,
    ) -> bytes:
        """Send the transaction `frame` and wait for f+1 matching answers, until `expires`
        (wall clock) plus `abort_grace`."""
        wait = max(0.0, expires - self._wall_clock()) + self.abort_grace
        deadline = trio.current_time() + wait
        first = self._order if self.endorse_all else self._order[: self._faults + 1]
        return await self._gather(call, frame, deadline, first=first, what="transaction")

    async def matching_read(self, command: bytes, *, deadline: float | None = None) -> bytes:
        """The result of the read-only `command` on which f+1 nodes agree, each answering
        from its applied state (STALE reads sent to every node, resent until they match).
        At least one correct node had that state; it may be behind the newest writes."""
        self._check_running()
        request_no = self._new_request_no()
        client_id = self._client_id()
        request = ClientRequest(client_id=client_id, request_no=request_no, command=command,
                                read_only=True)
        frame = encode_frame(wire.encode(ClientCall(request=request,
                                                    consistency=ReadConsistency.STALE)),
                             max_frame_size=self._max_frame_size)
        call: PendingCall[ClientReply] = PendingCall(client_id, request_no)
        call.unsent_mark = self._pool.unsent_mark()
        self._stats.calls += 1
        until = trio.current_time() + self.timeout if deadline is None else deadline
        try:
            return await self._gather(call, frame, until, first=self._order, what="read")
        finally:
            self._pool.forget(request_no)

    async def _gather(
        self, call: PendingCall[ClientReply], frame: bytes, deadline: float, *,
        first: tuple[str, ...], what: str,
    ) -> bytes:
        replies = MatchingReplies(self._faults)
        targets = first
        attempt = 0
        last_error: str | None = None
        while True:
            self._check_open()
            if trio.current_time() >= deadline:
                raise self._timed_out(call, last_error or replies.summary())
            for node in targets:
                self._pool.send(node, call, frame)
            for node in self._order:  # answers from subscribed nodes not sent to count too
                slot = self._slots[node]
                if node not in targets and slot.connected and slot.subscribed:
                    self._pool.register(node, call)
            with trio.move_on_at(min(deadline, trio.current_time() + self.attempt_timeout)):
                while True:
                    node, reply = await call.next()
                    if reply is None:
                        last_error = f"connection to {node} lost"
                        continue
                    if reply.status not in _DECIDING:
                        last_error = f"{node}: {reply.status.name} {reply.message}".rstrip()
                        continue
                    decision = replies.add(node, reply)
                    if decision is not None:
                        return decide(decision, f"{what} {call.client_id}/{call.request_no}")
            self._check_open()
            self._stats.retries += 1
            last_node = last_error if last_error and "matching" not in last_error else None
            last_error = replies.summary() + (f"; {last_node}" if last_node else "")
            targets = self._order  # every retry goes to every node, the same bytes
            await self._back_off(call, attempt, deadline, last_error)
            attempt += 1

    # provided by Client
    _check_running: Callable[[], None]
    _new_request_no: Callable[[], int]
    _client_id: Callable[[], str]


def wall_clock() -> float:
    """The default wall clock of transaction deadlines (seconds since the Unix epoch)."""
    return time.time()

"""The driver's client-waiter bookkeeping: which connections wait for which request.

Owns: `ReplyTarget` (where answers to one client connection go) and `ClientWaiters`, the
table from `(client_id, request_no)` to the connections waiting for that request's answer,
plus the reverse index used to forget a closed connection, and the subscriptions
(`phalanx.net.client_protocol.ClientHello`): a client id's newest subscribed connection, which
gets the OK/ERROR answer of an executed request of that client (or of one of its lanes
``<client_id>#<k>``) that has no waiter here, and the ABORTED answer of one the protocol
dropped (a definite failure: the leaderless core's client counts f+1 of them). A PBFT
backup executes requests that reached it only inside a pre-prepare, yet the client needs
f+1 answers. Also the reply counters of
`phalanx.runtime.driver.DriverStatistics` (`replies`, `redirects`, `retries`), which it updates.

Must not import: trio, sockets, any consensus core, `phalanx.runtime.driver` (the driver owns one
`ClientWaiters` and calls it from its core task only; nothing here is thread-safe;
`subscribe` may come from any task of the same trio thread, as it never runs mid-step).

Invariants:
- A waiter is answered at most once: `answer` pops the key before delivering.
- `keys_of[target]` holds exactly the keys whose waiter list contains `target`; a closed
  connection (`forget`) leaves no entry behind, neither a waiter nor a subscription.
- An answer goes to the waiters of its key if there are any, else (OK/ERROR/ABORTED only)
  to the subscribed connection: never to both, so a client gets one answer per replica.
- Iteration order never depends on set order: `fail_all` answers in sorted key order.
"""

from __future__ import annotations

from typing import Protocol

from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net.client_protocol import ClientReply, ReplyStatus, StatusReply

_SUBSCRIBED = frozenset({ReplyStatus.OK, ReplyStatus.ERROR, ReplyStatus.ABORTED})
"""The outcomes a subscribed connection receives for requests it has no waiter for: those of
requests this node executed or the protocol decided, never redirects or retries."""


class ReplyTarget(Protocol):
    """Where answers to one client connection go. `deliver` must not block."""

    def deliver(self, reply: ClientReply | StatusReply) -> None: ...


class _ReplyCounters(Protocol):
    replies: int
    redirects: int
    retries: int


class ClientWaiters:
    """The waiters of one node's client calls (see the module docstring).

    Args:
        node_id: this replica's id (the `replica` field of every reply).
        stats: counters updated per reply delivered.
    """

    __slots__ = ("_keys_of", "_node_id", "_stats", "_subscribed_by", "_subscribers",
                 "_waiters")

    def __init__(self, node_id: NodeId, stats: _ReplyCounters) -> None:
        self._node_id = node_id
        self._stats = stats
        self._waiters: dict[tuple[str, int], list[ReplyTarget]] = {}
        self._keys_of: dict[ReplyTarget, set[tuple[str, int]]] = {}
        self._subscribers: dict[str, ReplyTarget] = {}
        self._subscribed_by: dict[ReplyTarget, list[str]] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def get(self, key: tuple[str, int]) -> list[ReplyTarget] | None:
        return self._waiters.get(key)

    def add(self, key: tuple[str, int], target: ReplyTarget) -> None:
        self._waiters.setdefault(key, []).append(target)
        self._keys_of.setdefault(target, set()).add(key)

    def subscribe(self, client_id: str, target: ReplyTarget) -> None:
        """Unwaited OK/ERROR/ABORTED answers for `client_id` and its lanes go to `target` from now
        on (the newest subscription of a client id wins)."""
        old = self._subscribers.get(client_id)
        if old is target:
            return
        if old is not None:
            self._subscribed_by[old].remove(client_id)
            if not self._subscribed_by[old]:
                del self._subscribed_by[old]
        self._subscribers[client_id] = target
        self._subscribed_by.setdefault(target, []).append(client_id)

    def subscriber(self, client_id: str) -> ReplyTarget | None:
        """The connection subscribed to `client_id`'s answers (a lane ``c#k`` is `c`'s)."""
        if not self._subscribers:
            return None
        return self._subscribers.get(client_id.partition("#")[0])

    def forget(self, target: ReplyTarget) -> None:
        """`target`'s connection closed: drop it from every waiter list and subscription."""
        for client_id in self._subscribed_by.pop(target, ()):
            del self._subscribers[client_id]
        for key in self._keys_of.pop(target, ()):
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters[:] = [w for w in waiters if w is not target]
                if not waiters:
                    del self._waiters[key]

    def answer(
        self,
        client_id: str,
        request_no: int,
        status: ReplyStatus,
        *,
        result: bytes = b"",
        leader_hint: str | None = None,
        message: str = "",
    ) -> None:
        """Answer every waiter of `(client_id, request_no)`; with none, an OK, ERROR or
        ABORTED answer goes to the client's subscribed connection, if any (else a no-op)."""
        key = (client_id, request_no)
        waiters = self._waiters.pop(key, None)
        if not waiters:
            if status in _SUBSCRIBED:
                subscriber = self.subscriber(client_id)
                if subscriber is not None:
                    self.deliver(subscriber, ClientReply(
                        client_id=client_id, request_no=request_no, status=status,
                        replica=self._node_id, result=result, leader_hint=leader_hint,
                        message=message))
            return
        reply = ClientReply(client_id=client_id, request_no=request_no, status=status,
                            replica=self._node_id, result=result, leader_hint=leader_hint,
                            message=message)
        for target in waiters:
            keys = self._keys_of.get(target)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._keys_of[target]
            self.deliver(target, reply)

    def reply(
        self,
        target: ReplyTarget,
        request: ClientRequest,
        status: ReplyStatus,
        *,
        result: bytes = b"",
        leader_hint: str | None = None,
        message: str = "",
    ) -> None:
        """Answer `target` directly (a call that never waited)."""
        self.deliver(target, ClientReply(
            client_id=request.client_id, request_no=request.request_no, status=status,
            replica=self._node_id, result=result, leader_hint=leader_hint, message=message))

    def deliver(self, target: ReplyTarget, reply: ClientReply) -> None:
        st = self._stats
        st.replies += 1
        if reply.status is ReplyStatus.REDIRECT:
            st.redirects += 1
        elif reply.status is ReplyStatus.RETRY:
            st.retries += 1
        target.deliver(reply)

    def fail_all(self, status: ReplyStatus, *, leader_hint: str | None, message: str) -> None:
        """Answer every waiter with `status`, in sorted key order."""
        for client_id, request_no in sorted(self._waiters):
            self.answer(client_id, request_no, status, leader_hint=leader_hint,
                        message=message)

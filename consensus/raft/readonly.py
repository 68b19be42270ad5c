"""ReadIndex bookkeeping for linearizable reads without log entries (§6.4).

Owns: read requests waiting for a leadership-confirmation round, and the rounds in flight.

Protocol (leader side, driven by the core):
  1. A read arrives: it waits in `queued` until the leader has committed an entry of its
     own term (the no-op of §6.4 step 1) and no round is being started.
  2. `start_round(commit, ctx)` moves every queued read into one round whose read index is
     the leader's commit index now; the core sends a heartbeat tagged with `ctx`.
  3. `ack(ctx, node)` records a follower's heartbeat response; once a quorum (with the
     leader) acked round r, rounds <= r are released in order. Every heartbeat carries the
     newest round's context, so a lost heartbeat is made up for by the next one.

Rules:
- Pure: standard library and `phalanx.consensus.types` only. Concurrent reads are batched:
  all reads queued when a round starts share its heartbeat.
- Invariants: round contexts strictly increase; released reads keep their arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from phalanx.consensus.types import ClientRequest, NodeId


@dataclass(slots=True, kw_only=True)
class ReadRound:
    """One leadership-confirmation round."""

    context: int
    index: int
    requests: list[ClientRequest]
    acks: set[NodeId] = field(default_factory=set)


class ReadOnly:
    """Pending ReadIndex requests of one leader term."""

    __slots__ = ("queued", "rounds")

    def __init__(self) -> None:
        self.queued: list[ClientRequest] = []
        self.rounds: list[ReadRound] = []
        # Invariant: contexts of `rounds` strictly increase.

    def add(self, request: ClientRequest) -> None:
        self.queued.append(request)

    def start_round(self, *, index: int, context: int) -> ReadRound | None:
        """Batch every queued read into a new round; None if nothing is queued."""
        if not self.queued:
            return None
        if self.rounds and context <= self.rounds[-1].context:
            raise ValueError("read round contexts must increase")
        rnd = ReadRound(context=context, index=index, requests=self.queued)
        self.queued = []
        self.rounds.append(rnd)
        return rnd

    def ack(
        self,
        context: int,
        node: NodeId,
        has_quorum: Callable[[Iterable[NodeId]], bool],
    ) -> list[tuple[ClientRequest, int]]:
        """Record `node`'s ack of a heartbeat tagged `context`; return the reads now released,
        in order. The heartbeat was sent after every round <= `context` started, so the ack
        confirms leadership for all of them."""
        target = -1
        for k, rnd in enumerate(self.rounds):
            if rnd.context > context:
                break
            rnd.acks.add(node)
            if has_quorum(rnd.acks):
                target = k
        if target < 0:
            return []
        released: list[tuple[ClientRequest, int]] = []
        for rnd in self.rounds[: target + 1]:
            released.extend((r, rnd.index) for r in rnd.requests)
        del self.rounds[: target + 1]
        return released

    def pending(self) -> int:
        return len(self.queued) + sum(len(r.requests) for r in self.rounds)

    def drain(self) -> list[ClientRequest]:
        """Every pending read, in arrival order (the leader is stepping down)."""
        out = [r for rnd in self.rounds for r in rnd.requests] + self.queued
        self.queued = []
        self.rounds = []
        return out

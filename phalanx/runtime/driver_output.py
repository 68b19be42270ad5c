"""When the driver's peer messages leave: early ones at the end of a pass, lazy ones later.

Owns: `PeerOutput`, the part of `phalanx.runtime.driver.Driver` that hands peer messages to the
transport (`send`), in three kinds:
- A Ready's `messages` (step 2 of the `Ready` ordering rule, once durable) go at once
  (`send`).
- `early_messages` (step 0) are held until the pass's client replies are out, then released
  (`release_early`), in step order: the driver calls it at the end of each pass and before
  any write it starts.
- *Lazy* messages, those the injected `lazy` predicate names (a Raft leader's pure commit
  notice: an AppendEntries with no entries), are held further, per peer: until the driver
  sends anything else to that peer (they go first, so each link stays FIFO), or until the
  next tick (`release_lazy`). A closed-loop client's next write then carries the previous
  write's commit notice in the same transport write as its AppendEntries: the follower wakes
  once per write instead of twice, and its two answers travel together too. Sending an
  early message later than it was produced is always allowed (`Ready.early_messages`: it
  depends on nothing not yet durable), and a commit index only ever grows, so a late notice
  is never wrong; the tick bounds the delay (a follower learns a commit at most one tick
  later, and a leader's heartbeats carry the commit index too).
- A held lazy message that the next message to its peer *supersedes* (the injected
  `supersedes` predicate: for Raft, an AppendEntries of the same term whose `leader_commit`
  is at least the notice's) is dropped instead of sent (`superseded_messages`): everything
  it would tell the peer, the newer message tells too, so the follower neither steps nor
  answers it, and the leader reads no answer. Dropping a message is always safe (the
  network may), and no flow control waits for an answer to a pure notice (Raft counts only
  AppendEntries with entries in flight; a probing follower's notice blocks the next
  AppendEntries, so none can supersede it).

`flush` then hands what the transport held to the wire (`Transport(hold_sends=True)`: one
write per peer per pass); the driver calls it at the end of each pass, before any write and
after a batch's messages.

Must not import: trio, sockets, TLS, any consensus core (messages are opaque here; the
predicate is injected). Deterministic: held messages keep their order per peer and leave in
the order their peers were first held (dict insertion order), never by set or id order.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Send
from phalanx.consensus.types import Message, NodeId
from phalanx.runtime.driver_stats import DriverStatistics


class PeerOutput:
    """A driver's outgoing peer messages (see the module docstring).

    Args:
        send: hands one message to the transport without blocking (False: refused; the
            core retransmits what still matters).
        flush: writes what the transport held (None: it holds nothing).
        lazy: names the early messages that may wait for the next message to their peer or
            the next tick (None: none may).
        supersedes: ``supersedes(new, held)``: whether `new`, about to go to a peer, makes
            the lazy message `held` for it useless (then `held` is dropped). None: never.
        stats: counts `early_messages`, `lazy_messages` and `superseded_messages`.
    """

    __slots__ = ("_early", "_flush", "_lazy", "_send", "_stats", "_supersedes", "_waiting")

    def __init__(
        self,
        send: Callable[[NodeId, Message], bool],
        *,
        flush: Callable[[], None] | None,
        lazy: Callable[[Message], bool] | None,
        supersedes: Callable[[Message, Message], bool] | None = None,
        stats: DriverStatistics,
    ) -> None:
        self._send = send
        self._flush = flush
        self._lazy = lazy
        self._supersedes = supersedes
        self._stats = stats
        self._early: list[Send] = []
        self._waiting: dict[NodeId, list[Message]] = {}
        """Lazy messages held, per peer, in step order."""

    @property
    def lazy_held(self) -> int:
        """Lazy messages held now (over all peers)."""
        return sum(len(held) for held in self._waiting.values())

    def hold_early(self, sends: tuple[Send, ...]) -> None:
        """Hold a Ready's `early_messages` for `release_early` (step 0)."""
        self._early.extend(sends)
        self._stats.early_messages += len(sends)

    def release_early(self) -> bool:
        """Hand the early messages held so far to the transport, in step order, lazy ones
        excepted (they wait, per peer); returns whether any was held."""
        if not self._early:
            return False
        early, self._early = self._early, []
        lazy = self._lazy
        for one in early:
            if lazy is not None and lazy(one.message):
                self._stats.lazy_messages += 1
                held = self._waiting.get(one.to)
                if held is None:
                    self._waiting[one.to] = [one.message]
                else:
                    held.append(one.message)
            else:
                self.send(one.to, one.message)
        return True

    def send(self, to: NodeId, message: Message) -> None:
        """Hand `message` to the transport now, after the lazy messages held for `to`
        that it does not supersede (those are dropped)."""
        if self._waiting:
            held = self._waiting.pop(to, None)
            if held is not None:
                supersedes = self._supersedes
                for one in held:
                    if supersedes is not None and supersedes(message, one):
                        self._stats.superseded_messages += 1
                    else:
                        self._send(to, one)
        self._send(to, message)

    def release_lazy(self) -> bool:
        """Hand every held lazy message to the transport (a tick); returns whether any."""
        if not self._waiting:
            return False
        waiting, self._waiting = self._waiting, {}
        for to, held in waiting.items():
            for one in held:
                self._send(to, one)
        return True

    def flush(self) -> None:
        """Write what the transport held (one write per peer)."""
        if self._flush is not None:
            self._flush()

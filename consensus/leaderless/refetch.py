"""The pull of overdue pending transactions: which peer a node asks about which of them, when.

Owns: `OverdueFetch`, the per-transaction schedule of the `FetchTransactions` a node sends
about its pending transactions past their deadline (or committed at a peer: a
`CommittedDigest` named them), and the tick each peer was last heard from.

Why: a pending transaction past its deadline may be committed or aborted elsewhere (a peer
that committed it no longer pushes its endorsement), or may miss signatures some peer holds.
Until 2026-12-02 each node asked every peer about every such transaction every period, each
answered with the full proof: n(n-1) proofs per transaction and period, for as long as it
stayed pending (486 MB in a wedged real-cluster run, docs/LEADERLESS.md "A pbft-mode
real-cluster run"). Now, per transaction:
- the first ask after the schedule (re)starts goes to `FIRST_ASK_PEERS` peers (every peer
  of a 4-node cluster: as before, once), each later one to one peer; the peers rotate
  (starting at a position derived from this node's position and the id, so the nodes and
  transactions spread over the peers), among the peers heard from within `LIVE_PERIODS`
  periods when there are any;
- exponential backoff between asks: 1, 2, 4, then every `MAX_BACKOFF_PERIODS` periods;
- news resets it (asked at the next period): the id named again (`add`: a digest names it,
  committed at that peer), or a peer heard again after a silence longer than `LIVE_PERIODS`
  periods (a healed partition or a restarted peer: what it holds was never asked);
- at most `MAX_OVERDUE_IDS` ids asked per period (the rest wait, earliest due first).
A node's pull is thus bounded per period whatever its backlog (at most
`MAX_OVERDUE_IDS` x `FIRST_ASK_PEERS` asks); a backlog of B costs about
B / `MAX_BACKOFF_PERIODS` asks and proofs per node and period once it has settled. (Asking
one peer from the start made clearing a backlog after a healed partition slower: in the
simulator a third fewer operations completed in the seconds after the heal.)

Rules: sans-IO and deterministic (insertion-ordered dicts, ids' bytes; no set order, no
clock: ticks come from the core). Entries leave when the caller says the transaction is no
longer pending (`due`'s `pending`), or beyond `max_entries` (oldest first).
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Send
from phalanx.consensus.leaderless.messages import FetchTransactions, TxId
from phalanx.consensus.leaderless.recovery import MAX_FETCH_IDS
from phalanx.consensus.types import NodeId

MAX_OVERDUE_IDS = 4 * MAX_FETCH_IDS
"""At most this many overdue ids are asked about per period (each of one peer)."""

FIRST_ASK_PEERS = 3
"""The first ask about a transaction (and the first after news) goes to this many peers."""

MAX_BACKOFF_PERIODS = 8
"""The longest wait between two asks about one transaction, in periods."""

LIVE_PERIODS = 2
"""A peer heard from within this many periods is asked first; one heard again after a longer
silence resets every backoff."""


class OverdueFetch:
    __slots__ = ("_every", "_heard", "_max", "_members", "_offset", "_peers", "_state",
                 "_wake")

    def __init__(self, *, peers: tuple[NodeId, ...], every: int, max_entries: int,
                 offset: int = 0) -> None:
        """`every`: ticks per period (`rebroadcast_ticks`); `offset`: this node's position."""
        self._peers = peers
        self._members = frozenset(peers)
        self._every = every
        self._max = max_entries
        self._offset = offset
        self._state: dict[TxId, list[int]] = {}
        """Per overdue id: [asks since its backoff (re)started, the tick it is due again,
        asks in all (the rotation: a restarted backoff does not go back to the same peer)]."""
        self._heard: dict[NodeId, int] = {}
        self._wake = False

    def __len__(self) -> int:
        return len(self._state)

    def add(self, tx_id: TxId, tick: int) -> None:
        """`tx_id` is overdue, or was named again (news): asked at the next period, and its
        backoff starts over."""
        state = self._state.get(tx_id)
        if state is None:
            self._state[tx_id] = [0, tick, 0]
            while len(self._state) > self._max:
                del self._state[next(iter(self._state))]
        else:
            state[0], state[1] = 0, min(state[1], tick)

    def heard(self, src: NodeId, tick: int) -> None:
        """A message from peer `src` arrived (any message: it is reachable)."""
        if src not in self._members:
            return
        last = self._heard.get(src)
        if last is not None and tick - last > LIVE_PERIODS * self._every:
            self._wake = True
        self._heard[src] = tick

    def due(self, tick: int, pending: Callable[[TxId], bool],
            held: Callable[[tuple[TxId, ...]], bytes] = lambda _ids: b"") -> list[Send]:
        """This period's asks: one peer per due transaction (`FIRST_ASK_PEERS` for a first
        ask), grouped per peer (chunks of `MAX_FETCH_IDS`); ids no longer `pending` are
        forgotten. `held`: the `FetchTransactions.held` field of a chunk of ids (what this
        node holds of them: the answers carry only the rest)."""
        state = self._state
        for tx_id in [t for t in state if not pending(t)]:
            del state[tx_id]
        if self._wake:
            self._wake = False
            for entry in state.values():
                entry[0], entry[1] = 0, min(entry[1], tick)
        if not state or not self._peers:
            return []
        since = tick - LIVE_PERIODS * self._every
        live = [p for p in self._peers if self._heard.get(p, since - 1) >= since]
        choose = live or list(self._peers)
        due = sorted((entry[1], i, tx_id) for i, (tx_id, entry) in enumerate(state.items())
                     if entry[1] <= tick)[:MAX_OVERDUE_IDS]
        by_peer: dict[NodeId, list[TxId]] = {}
        for _, _, tx_id in due:
            entry = state[tx_id]
            start = self._offset + (tx_id[0] if tx_id else 0)
            fanout = min(FIRST_ASK_PEERS, len(choose)) if entry[0] == 0 else 1
            for k in range(fanout):
                by_peer.setdefault(choose[(start + entry[2] + k) % len(choose)], []).append(tx_id)
            entry[1] = tick + min(1 << entry[0], MAX_BACKOFF_PERIODS) * self._every
            entry[0] += 1
            entry[2] += fanout
        chunks = [(peer, tuple(ids[i:i + MAX_FETCH_IDS]))
                  for peer, ids in by_peer.items() for i in range(0, len(ids), MAX_FETCH_IDS)]
        return [Send(to=peer, message=FetchTransactions(tx_ids=chunk, held=held(chunk)))
                for peer, chunk in chunks]

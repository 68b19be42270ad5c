"""Loss recovery and anti-entropy of the leaderless core: how a node learns what it missed.

Owns: the fetch bookkeeping (which ids were asked for, when: one request per id per
`rebroadcast_ticks`, bounded; unknown ids named by endorsements, fetched at once or after
`named_fetch_delay_ticks`), the ids committed here recently (re-pushed once, at the next
period: the own `EndorsementBatch` each was signed in, as sent; else the endorsement in the
`SignatureResend` the core sends each peer), answering
`FetchTransactions`, and the periodic `CommittedDigest` (PnyxDB relies on gossip history
instead): every `rebroadcast_ticks` a node sends one peer, round-robin, the ids of the
committed transactions it still holds (newest `MAX_DIGEST_IDS`). In period t the node at
position p sends to the node at position p + 1 + s(t) (mod n), the same shift s(t) for
all, so the digests of a period form a permutation: every node receives one (before, all
started at the same index and a restarted node late in the order waited up to n-1
periods: 30 s at n = 20 over a WAN). The shift jumps by a golden-ratio stride coprime
with n-1 (`digest_stride`), not by one: a node's senders in successive periods are spread
over the whole order, not its nearest predecessors, so a block of neighbours that were
down together (restarted with nothing: their digests name nothing they miss) is not
caught up one node per period (at n = 180 with 59 such nodes, nodes deep in the block
still missed commits 10 s after the heal); every shift still comes once in n-1 periods.
The peer fetches the ids it does not know or still has pending, and commits them from
the self-certifying proofs. A node that was down or cut off for longer than a period
catches up this way.

A fetch of transactions this node holds says which members' unconditional endorsements of
each it holds (`FetchTransactions.held`, `held.HeldMasks`), and an answer leaves those out
and is not sent when nothing is left: at n = 180 a proof carried up to n endorsements the
asker mostly held already (docs/LEADERLESS.md "Answers by what the asker holds").

Acting on a digest or a fetch needs no trust in the sender: only signed proofs change state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from math import gcd

from phalanx.consensus.core import Send
from phalanx.consensus.leaderless.held import HeldMasks
from phalanx.consensus.leaderless.messages import (
    CommittedDigest,
    Endorsement,
    EndorsementBatch,
    FetchTransactions,
    TransactionProof,
    TxId,
)
from phalanx.consensus.leaderless.safety import SafetyKernel
from phalanx.consensus.leaderless.store import TxState, TxStore
from phalanx.consensus.types import NodeId

MAX_FETCH_IDS = 64
"""At most this many ids go in one `FetchTransactions`, and are answered from one."""

MAX_DIGEST_IDS = 1024
"""At most this many ids go in one `CommittedDigest` (the newest commits)."""

MAX_RESEND_ITEMS = 1024
"""At most this many signatures go in one `SignatureResend`; a larger one is dropped."""


def digest_stride(peers: int) -> int:
    """The step of the digests' shift from one period to the next among `peers` peers: the
    integer nearest `peers` / golden ratio^2 that is coprime with `peers` (successive shifts
    spread evenly over the ring, and `peers` periods take every shift once)."""
    stride = max(1, round(peers * 0.381966))
    while gcd(stride, peers) != 1:
        stride += 1
    return stride


class Recovery:
    __slots__ = ("_aborts", "_asked", "_batches", "_delay", "_every", "_fetched", "_max",
                 "_named", "_offset", "_peers", "_recent", "_stride", "masks")

    def __init__(self, *, peers: tuple[NodeId, ...], members: tuple[NodeId, ...], every: int,
                 max_entries: int, named_delay: int = 0, offset: int = 0) -> None:
        """`members`: the whole membership (the `held` bitmaps name its sorted order, the
        same at every node); `named_delay`: `LeaderlessConfig.named_fetch_delay_ticks`
        (`fetch_named`); `offset`: this node's position, where its digests' round-robin
        starts."""
        self._peers = peers
        self.masks = HeldMasks(members)
        self._delay = named_delay
        self._offset = offset
        self._stride = digest_stride(len(peers)) if peers else 1
        self._every = every
        self._max = max_entries
        self._fetched: dict[TxId, int] = {}
        self._asked: dict[TxId, tuple[NodeId, ...]] = {}
        """Unknown transactions named by endorsements: the endorsers asked for each."""
        self._named: dict[TxId, tuple[int, tuple[NodeId, ...]]] = {}
        """Unknown transactions named by endorsements, not asked for yet: the tick of the
        first naming and the endorsers to ask (tick order)."""
        self._recent: dict[TxId, int] = {}
        self._aborts: dict[TxId, TransactionProof] = {}
        self._batches: dict[TxId, EndorsementBatch] = {}
        """The `EndorsementBatch` each own endorsement left in (bounded, oldest out):
        re-pushed as it is (`pushed_batch`)."""

    def want(self, ids: Iterable[TxId], tick: int) -> tuple[TxId, ...]:
        """The ids of `ids` not asked for in the last period (now marked asked), at most
        `MAX_FETCH_IDS`."""
        out: list[TxId] = []
        for tx_id in ids:
            at = self._fetched.get(tx_id)
            if at is not None and tick - at < self._every:
                continue
            self._fetched.pop(tx_id, None)
            self._fetched[tx_id] = tick
            out.append(tx_id)
            if len(out) == MAX_FETCH_IDS:
                break
        while len(self._fetched) > self._max:
            del self._fetched[next(iter(self._fetched))]
        return tuple(out)

    def fetch(self, src: NodeId, ids: Iterable[TxId], tick: int,
              held: Callable[[TxId], bytes] | None = None) -> list[Send]:
        """Ask `src` for the ids of `ids` not asked for in the last period; `held`: the
        bitmap of what this node holds of an id (`HeldMasks.mask`; b"": nothing)."""
        wanted = self.want(ids, tick)
        if not wanted:
            return []
        return [Send(to=src, message=FetchTransactions(tx_ids=wanted,
                                                       held=self._field(wanted, held)))]

    def fetch_named(self, src: NodeId, tx_id: TxId, tick: int,
                    held: Callable[[TxId], bytes] | None = None) -> list[Send]:
        """Ask `src`, whose endorsement names the unknown `tx_id`, for it: once per
        endorser (a client that sent it to some nodes only makes this the usual way to
        learn it, and a lost answer must not wait a period when another endorser has it),
        for the body alone (`held`, with `body_only`): every endorser sends this node its
        endorsement itself, and an answer repeating up to n of them to each of up to n
        askers per asker was most of the bytes at n = 180 (docs/LEADERLESS.md "Answers by
        what the asker holds")).
        With a delay (`named_delay` ticks) the first namings wait (`named_due`), and once
        those are asked a new endorser is asked at once: the runtime's client sends the
        transaction to every node, and a driver pass steps its client writes at its end
        (`SubmitBatch`), so a peer's endorsements usually come first and fetching at once
        cost a fetch and a proof per transaction and node that told nothing new
        (docs/LEADERLESS.md "Round 4")."""
        waiting = self._named.get(tx_id)
        if waiting is not None:
            if src not in waiting[1]:
                self._named[tx_id] = (waiting[0], (*waiting[1], src))
            return []
        asked = self._asked.get(tx_id)
        if asked is None and self._delay:
            self._named[tx_id] = (tick, (src,))
            while len(self._named) > self._max:
                del self._named[next(iter(self._named))]  # `_fetch_buffered` still asks
            return []
        asked = asked or ()
        if src in asked:
            return []
        self._asked[tx_id] = (*asked, src)
        while len(self._asked) > self._max:
            del self._asked[next(iter(self._asked))]
        return [Send(to=src, message=FetchTransactions(tx_ids=(tx_id,), held=self._field(
            (tx_id,), held)))]

    def _field(self, ids: tuple[TxId, ...], held: Callable[[TxId], bytes] | None) -> bytes:
        return b"" if held is None else self.masks.field(ids, held)

    def named_due(self, tick: int, held: Callable[[TxId], bytes] | None = None) -> list[Send]:
        """The fetches of named transactions whose delay ended by `tick`: one
        `FetchTransactions` per endorser (at most `MAX_FETCH_IDS` ids each; `held` as for
        `fetch`)."""
        named = self._named
        by_peer: dict[NodeId, list[TxId]] = {}
        while named:
            tx_id, (at, endorsers) = next(iter(named.items()))
            if tick - at < self._delay:
                break
            del named[tx_id]
            self._asked[tx_id] = endorsers
            for src in endorsers:
                by_peer.setdefault(src, []).append(tx_id)
        while len(self._asked) > self._max:
            del self._asked[next(iter(self._asked))]
        chunks = [(src, tuple(ids[i:i + MAX_FETCH_IDS]))
                  for src, ids in by_peer.items() for i in range(0, len(ids), MAX_FETCH_IDS)]
        return [Send(to=src, message=FetchTransactions(tx_ids=chunk, held=self._field(
            chunk, held))) for src, chunk in chunks]

    def learned(self, tx_id: TxId) -> None:
        self._fetched.pop(tx_id, None)
        self._asked.pop(tx_id, None)
        self._named.pop(tx_id, None)

    def committed(self, tx_id: TxId, tick: int) -> None:
        self._recent[tx_id] = tick

    def recent(self, tick: int) -> list[TxId]:
        """Ids committed here since the last period (older ones are forgotten): each is
        pushed once. (Twice, before: at one client that made two thirds of all endorsement
        traffic; a peer that still misses one after that learns the commit from the digest
        or from its pull past the deadline.)"""
        since = tick - self._every
        self._recent = {t: at for t, at in self._recent.items() if at > since}
        return list(self._recent)

    def sealed(self, batch: EndorsementBatch) -> None:
        """Own endorsements left in `batch` (`EndorsementBatching._seal`)."""
        batches = self._batches
        for item in batch.items:
            batches[item.tx_id] = batch
        while len(batches) > self._max:
            del batches[next(iter(batches))]

    def pushed_batch(self, tx_id: TxId) -> EndorsementBatch | None:
        """The batch the own endorsement of `tx_id` (committed here: `recent`) left in, to
        re-push instead of the endorsement alone; None when not known (signed before a
        restart, or evicted): then the endorsement goes alone. The batch is the signed
        message sent before, so a peer handles it as it did the first time: items it holds
        or decided are recognised before any hashing or signature check (`_on_batch`),
        and one that misses an item gets it with its path from the tree it rebuilds. At
        ~45 bytes an item against ~250 for an `Endorsement` with its path, this was about
        half of the node-to-node bytes per commit at 64 clients (docs/LEADERLESS.md
        "Round 5")."""
        return self._batches.pop(tx_id, None)

    def aborted(self, tx_id: TxId, certificate: TransactionProof) -> None:
        """Keep the abort certificate of a transaction dropped on refusals (its tombstone's
        lifetime): a peer that missed the refusals gets it when it asks."""
        self._aborts[tx_id] = certificate

    def gc(self, store: TxStore) -> None:
        for tx_id in [t for t in self._aborts if store.state_of(t) is None]:
            del self._aborts[tx_id]

    def answer(self, src: NodeId, ids: tuple[TxId, ...], store: TxStore,
               kernel: SafetyKernel, held: list[bytes] | None = None) -> list[Send]:
        """Proofs of what this node knows of `ids` (at most `MAX_FETCH_IDS` of them): the
        transaction with its endorsements (its own too, which a record restored from the WAL
        lacks), or its abort certificate. `held` (`HeldMasks.split` of the ask): the
        endorsements the asker holds are left out, and a proof left with nothing to tell
        (no endorsement, no refusal) to an asker that holds the transaction is not sent: its
        arrival would change nothing there (a commit is retried every period, `ticks.py`)."""
        out: list[Send] = []
        masks = self.masks
        zero = masks.zero
        for i, tx_id in enumerate(ids[:MAX_FETCH_IDS]):
            mask = held[i] if held is not None else zero
            record = store.get(tx_id) if isinstance(tx_id, bytes) else None
            if record is None:
                certificate = self._aborts.get(tx_id) if isinstance(tx_id, bytes) else None
                mine = kernel.endorsement(tx_id) if isinstance(tx_id, bytes) else None
                tx = kernel.transaction(tx_id) if mine is not None else None
                if certificate is not None:
                    out.append(Send(to=src, message=certificate))
                elif (mine is not None and tx is not None and mine.signature
                      and not (masks.has(mask, mine.endorser) and masks.holds_tx(mask))):
                    # Collected here (its tombstone remains) but still endorsed: the
                    # signature may be what the asker lacks for a quorum.
                    out.append(Send(to=src, message=TransactionProof(tx=tx, endorsements=(mine,))))
                continue
            own = kernel.refusal(tx_id)
            endorsements = dict(record.endorsements)
            mine = kernel.endorsement(tx_id)
            if mine is not None and mine.signature and mine.endorser not in endorsements:
                endorsements[mine.endorser] = mine  # a record restored from the WAL has none
            sent: Iterable[Endorsement] = endorsements.values()
            if masks.body_only(mask):
                sent = ()  # its endorsers send it theirs (`fetch_named`)
            elif mask != zero:  # only what the asker lacks
                sent = [e for e in sent if not masks.has(mask, e.endorser)]
                if not sent and own is None and masks.holds_tx(mask):
                    continue  # nothing it lacks (docs/LEADERLESS.md "Answers by what ...")
            out.append(Send(to=src, message=TransactionProof(
                tx=record.tx, endorsements=tuple(sent),
                refusals=(own,) if own is not None else ())))
        return out

    def digest(self, tick: int, committed: list[TxId]) -> list[Send]:
        """This period's digest to its peer (the period's shift from this node's position,
        see the module docstring); none if nothing committed."""
        if not self._peers or not committed:
            return []
        shift = (tick // self._every) * self._stride
        peer = self._peers[(shift + self._offset) % len(self._peers)]
        ids = tuple(sorted(committed[-MAX_DIGEST_IDS:]))
        return [Send(to=peer, message=CommittedDigest(tx_ids=ids))]

    def on_digest(self, src: NodeId, ids: tuple[TxId, ...], store: TxStore,
                  tick: int) -> list[Send]:
        """Fetch from `src` the digest's ids this node does not know or still has pending
        (saying what it holds of the pending ones)."""
        missing = [t for t in ids[:MAX_DIGEST_IDS] if isinstance(t, bytes)
                   and store.state_of(t) in (None, TxState.PENDING)]
        return self.fetch(src, missing, tick, self.held_of(store))

    def held_of(self, store: TxStore, *, body_only: bool = False) -> Callable[[TxId], bytes]:
        """The bitmap of what this node holds of a transaction: with its record, or the
        endorsements it buffered while the transaction is unknown (b"": nothing);
        `body_only`: an unknown one is asked for its body alone (`fetch_named`)."""
        mask = self.masks.mask

        def held(tx_id: TxId) -> bytes:
            record = store.get(tx_id)
            if record is not None:
                return mask(record.endorsements.values(), holds_tx=True)
            if body_only:
                return mask((), holds_tx=False, body_only=True)
            slot = store.buffered.get(tx_id)
            return b"" if slot is None else mask(slot.values(), holds_tx=False)
        return held

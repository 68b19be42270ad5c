"""What a fetch says its asker already holds: the `FetchTransactions.held` bitmaps.

Owns: `HeldMasks`, the one encoding of "these members' unconditional endorsements of a
transaction are held here" that an asker puts in its `FetchTransactions` and an answerer
reads (`recovery.Recovery.answer`), so an answer carries only the endorsements the asker
lacks (docs/LEADERLESS.md "Answers by what the asker holds").

Format: `held` is empty, or one bitmap of `width` = ceil((n+2)/8) bytes per asked id, in
the ids' order; bit j is byte j // 8, value 1 << (j % 8). Bit j < n is member j of the
sorted membership: set, the asker holds an unconditional endorsement of that transaction by
that member (held with the transaction, or buffered while the transaction is unknown).
Bit n: the asker holds the transaction itself (then an answer with no endorsement left to
send, and no refusal, is not sent; without it the answer always carries the transaction).
Bit n+1: the body alone. A node that learns of a transaction from the endorsements naming
it asks each of their endorsers for the transaction (`Recovery.fetch_named`), while every
endorser's own endorsement reaches it directly (endorsements are broadcast, and re-sent by
their signers: docs/LEADERLESS.md "Answers by what the asker holds"): the answer is the
transaction with no endorsement.
Only unconditional endorsements: one endorsement of a member that counts is all the commit
rule needs of it, and an unconditional one always counts; a conditional one may not (its
condition may commit), and an equivocating member's other endorsement may be the one that
counts, so those are still sent. An all-zero bitmap asks for everything, and a `held` of
all-zero bitmaps is sent empty (one encoding per meaning).

Pure and deterministic; nothing here raises on hostile input (`split` returns None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from phalanx.consensus.leaderless.messages import Endorsement, TxId
from phalanx.consensus.types import NodeId


class HeldMasks:
    """The bitmaps of one membership (see the module docstring)."""

    __slots__ = ("_position", "_tx_bit", "width", "zero")

    def __init__(self, members: Iterable[NodeId]) -> None:
        ordered = sorted(set(members))
        self._position = {m: i for i, m in enumerate(ordered)}
        self._tx_bit = len(ordered)
        self.width = (len(ordered) + 2 + 7) // 8
        self.zero = bytes(self.width)

    def mask(self, endorsements: Iterable[Endorsement], *, holds_tx: bool,
             body_only: bool = False) -> bytes:
        """The bitmap of the members whose endorsement in `endorsements` is unconditional,
        whether the asker holds the transaction (`holds_tx`), and whether it asks for the
        body alone (`body_only`)."""
        bits = (1 << self._tx_bit if holds_tx else 0) | (
            2 << self._tx_bit if body_only else 0)
        position = self._position
        for e in endorsements:
            j = position.get(e.endorser)
            if j is not None and not e.conditions:
                bits |= 1 << j
        return bits.to_bytes(self.width, "little")

    def field(self, ids: Sequence[TxId], mask_of: Callable[[TxId], bytes]) -> bytes:
        """The `held` field of a fetch of `ids`: each id's `mask_of` (a bitmap, or b"" for
        nothing held), or b"" when every one is empty or all-zero."""
        masks = [mask_of(t) or self.zero for t in ids]
        if all(m == self.zero for m in masks):
            return b""
        return b"".join(masks)

    def split(self, held: object, count: int) -> list[bytes] | None:
        """`held` of a fetch of `count` ids as one bitmap per id (all zero when `held` is
        empty), or None when it is malformed (not bytes, or not `count` bitmaps)."""
        if not isinstance(held, bytes):
            return None
        if not held:
            return [self.zero] * count
        w = self.width
        if len(held) != w * count:
            return None
        return [held[i * w:(i + 1) * w] for i in range(count)]

    def has(self, mask: bytes, endorser: NodeId) -> bool:
        """Whether `mask` says the asker holds `endorser`'s unconditional endorsement."""
        j = self._position.get(endorser)
        return j is not None and bool(mask[j >> 3] >> (j & 7) & 1)

    def holds_tx(self, mask: bytes) -> bool:
        """Whether `mask` says the asker holds the transaction itself."""
        j = self._tx_bit
        return bool(mask[j >> 3] >> (j & 7) & 1)

    def body_only(self, mask: bytes) -> bool:
        """Whether `mask` asks for the transaction alone, without endorsements."""
        j = self._tx_bit + 1
        return bool(mask[j >> 3] >> (j & 7) & 1)

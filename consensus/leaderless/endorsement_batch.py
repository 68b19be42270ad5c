"""Batch-signed endorsements: one signature over a Merkle root of many endorsements.

Owns: the leaf and inner hashes, `sign_batch` (a node's endorsements of one step under one
signature, each returned with its Merkle path; `sign_one`: a batch of one), `malformed`
and `expand` (an `EndorsementBatch` received as per-transaction `Endorsement`s), `root_of` (an
endorsement's root from its leaf and path), `VerifiedRoots` (which signed roots this node
already verified: the items of one batch cost one signature check), and
`endorsement_problem` (the check of one endorsement).

Format (docs/LEADERLESS.md "Batch endorsements"):
- leaf = SHA-256(0x00 || len(tx_id) || tx_id || count || (len(c) || c) for each condition),
  lengths as 4-byte big-endian: injective over (tx_id, conditions).
- inner = SHA-256(0x01 || left || right); a level of odd length pairs its last node with
  itself; an endorsement at position `index` climbs its `path` (sibling per level, bit i of
  `index` set: the sibling is on the left). `index < 2**len(path)`, `len(path) <= MAX_PATH`.
- the endorser signs `EndorsementRoot(endorser, root)` (the injected `Crypto`); the
  endorser is inside the signed object, so a batch never verifies under another node.
Leaves and inner nodes are domain-separated, so a leaf can never pass for an inner node.

Pure and deterministic: the `VerifiedRoots` cache changes how much is verified, never a
verdict. Nothing here raises on hostile input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from phalanx.consensus.crypto import Signer, Verifier
from phalanx.consensus.leaderless.messages import (
    EndorsedTx,
    Endorsement,
    EndorsementBatch,
    EndorsementRoot,
    TxId,
)
from phalanx.consensus.types import NodeId

MAX_PATH = 16
"""Deepest Merkle path accepted (batches up to 65,536 endorsements)."""

MAX_BATCH = 1 << MAX_PATH

VERIFIED_ROOTS = 1024
"""Signed roots a `VerifiedRoots` remembers (oldest out first)."""

_LEAF = b"\x00"
_NODE = b"\x01"


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def leaf_hash(tx_id: TxId, conditions: Sequence[TxId]) -> bytes:
    """The leaf of one endorsement (the module docstring's format)."""
    parts = [_LEAF, len(tx_id).to_bytes(4, "big"), tx_id, len(conditions).to_bytes(4, "big")]
    for c in conditions:
        parts += [len(c).to_bytes(4, "big"), c]
    return _sha(b"".join(parts))


def merkle(leaves: Sequence[bytes]) -> tuple[bytes, list[tuple[bytes, ...]]]:
    """The root of `leaves` (at least one) and each leaf's path."""
    paths: list[list[bytes]] = [[] for _ in leaves]
    positions = list(range(len(leaves)))
    level = list(leaves)
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        for i, pos in enumerate(positions):
            paths[i].append(level[pos ^ 1])
            positions[i] = pos >> 1
        level = [_sha(_NODE + level[j] + level[j + 1]) for j in range(0, len(level), 2)]
    return level[0], [tuple(p) for p in paths]


def root_of(leaf: bytes, index: int, path: tuple[bytes, ...]) -> bytes | None:
    """The root `leaf` reaches at `index` through `path`, or None when malformed."""
    if (not isinstance(index, int) or not isinstance(path, tuple) or len(path) > MAX_PATH
            or index < 0 or index >> len(path)):
        return None
    node = leaf
    for level, sibling in enumerate(path):
        if not isinstance(sibling, bytes) or len(sibling) != 32:
            return None
        node = _sha(_NODE + sibling + node) if (index >> level) & 1 else _sha(
            _NODE + node + sibling)
    return node


def sign_batch(signer: Signer, endorser: NodeId,
               items: Sequence[tuple[TxId, tuple[TxId, ...]]]) -> tuple[Endorsement, ...]:
    """`items` ((tx id, conditions), at least one) signed by `endorser` under one
    signature; each endorsement carries its index and path."""
    root, paths = merkle([leaf_hash(tx_id, conds) for tx_id, conds in items])
    signature = signer.sign(EndorsementRoot(endorser=endorser, root=root))
    return tuple(Endorsement(tx_id=tx_id, endorser=endorser, conditions=conds,
                             signature=signature, index=i, path=paths[i])
                 for i, (tx_id, conds) in enumerate(items))


def sign_one(signer: Signer, endorser: NodeId, tx_id: TxId,
             conditions: tuple[TxId, ...] = ()) -> Endorsement:
    """One endorsement signed alone (a batch of one: empty path, root = its leaf)."""
    return sign_batch(signer, endorser, [(tx_id, conditions)])[0]


def batch_of(endorsements: Sequence[Endorsement]) -> EndorsementBatch:
    """The wire form of endorsements `sign_batch` returned (one call's, in its order)."""
    return EndorsementBatch(
        endorser=endorsements[0].endorser, signature=endorsements[0].signature,
        items=tuple(EndorsedTx(tx_id=e.tx_id, conditions=e.conditions) for e in endorsements))


def sorted_ids(ids: object) -> bool:
    return (isinstance(ids, tuple) and all(isinstance(t, bytes) for t in ids)
            and list(ids) == sorted(set(ids)))


def malformed(batch: EndorsementBatch) -> bool:
    """Whether `batch` is malformed: empty, too large, an item not a well-formed
    `EndorsedTx` (what `expand` refuses, without hashing anything)."""
    items = batch.items
    if not isinstance(items, tuple) or not 0 < len(items) <= MAX_BATCH:
        return True
    for item in items:
        if (not isinstance(item, EndorsedTx) or not isinstance(item.tx_id, bytes)
                or not sorted_ids(item.conditions) or item.tx_id in item.conditions):
            return True
    return False


def expand(batch: EndorsementBatch) -> tuple[bytes, tuple[Endorsement, ...]] | None:
    """The root of `batch` and its items as `Endorsement`s (equal to the endorser's own),
    or None when malformed (empty, too large, an item not a well-formed `EndorsedTx`)."""
    if malformed(batch):
        return None
    items = batch.items
    root, paths = merkle([leaf_hash(item.tx_id, item.conditions) for item in items])
    return root, tuple(
        Endorsement(tx_id=item.tx_id, endorser=batch.endorser, conditions=item.conditions,
                    signature=batch.signature, index=i, path=paths[i])
        for i, item in enumerate(items))


class VerifiedRoots:
    """Signed roots already verified here, (endorser, root, signature), bounded: a cache of
    `Verifier.verify` over `EndorsementRoot`s (only successes are remembered)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[tuple[NodeId, bytes, bytes], None] = {}

    def verify(self, crypto: Verifier, endorser: NodeId, root: bytes, signature: bytes) -> bool:
        key = (endorser, root, signature)
        if key in self._seen:
            return True
        if not isinstance(signature, bytes) or not crypto.verify(
                endorser, EndorsementRoot(endorser=endorser, root=root), signature):
            return False
        if len(self._seen) >= VERIFIED_ROOTS:
            del self._seen[next(iter(self._seen))]
        self._seen[key] = None
        return True


def endorsement_problem(e: Endorsement, nodes: tuple[NodeId, ...], crypto: Verifier,
                        roots: VerifiedRoots | None = None) -> str | None:
    """Why endorsement `e` must be dropped (unknown endorser, malformed, forged: its leaf
    and path do not reach a root its endorser signed), or None."""
    if e.endorser not in nodes:
        return "unknown_endorser"
    if (not isinstance(e.tx_id, bytes) or not sorted_ids(e.conditions)
            or e.tx_id in e.conditions):
        return "malformed_endorsement"
    root = root_of(leaf_hash(e.tx_id, e.conditions), e.index, e.path)
    if root is None:
        return "malformed_endorsement"
    if not (roots or VerifiedRoots()).verify(crypto, e.endorser, root, e.signature):
        return "bad_endorsement_signature"
    return None

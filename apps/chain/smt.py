"""A sparse Merkle tree over 256-bit paths, with compressed inclusion and non-inclusion proofs.

Owns: `SparseMerkleTree` (a persistent, immutable tree: every update returns a new tree that
shares all untouched nodes with the old one), the proof format, and `verify_proof`, a pure
function a light client runs without the tree.

Must not import: consensus cores, storage, trio, clocks, randomness.

Layout (the compact form of a 256-level SMT, as in Diem's Jellyfish/`SparseMerkleTree`):
- A key's path is ``SHA-256(key)`` read from its most significant bit: 0 = left, 1 = right.
- An empty subtree hashes to ``EMPTY = 32 zero bytes`` at every height (the default hash).
- A subtree holding exactly one leaf IS that leaf, wherever it sits: a leaf is stored at the
  shallowest depth where it is alone, so the tree has one inner node per branching point and
  storage is proportional to the number of leaves (about 2 nodes per leaf, ~20 levels deep
  at 1M leaves), not 256 nodes per leaf.
- ``leaf hash = SHA-256(0x00 || key_hash || SHA-256(value))``;
  ``inner hash = SHA-256(0x01 || left hash || right hash)``. The prefixes separate the two
  domains, and a leaf commits to its full key hash, so it cannot be claimed at another path.
- Canonical: the shape is a function of the set of keys, so equal contents give equal roots
  whatever the order of updates (tested against a from-scratch build).

Proof format (bytes, strict: `decode_proof` refuses anything else):
    depth: u16 big-endian                (the depth at which the path ends, 0..256)
    bitmap: ceil(depth / 8) bytes         (bit i, MSB first, set = sibling at depth i is
                                           not EMPTY; padding bits zero)
    kind: u8                              (0: the path ends at the key's own leaf or at an
                                           EMPTY subtree; 1: it ends at ANOTHER key's leaf)
    [other key hash 32 | other value hash 32]   (kind 1 only)
    siblings: 32 bytes each, top-down, one per set bitmap bit
`verify_proof(root, key, value, proof)` recomputes the root from the end of the path:
inclusion (value given, kind 0) starts from the key's leaf hash; non-inclusion (value None)
starts from EMPTY (kind 0) or from the other leaf (kind 1, whose key hash must differ from the
key's yet share its first `depth` bits, so that leaf really occupies the key's subtree).

Snapshots are O(1) because nothing is ever mutated: a `SparseMerkleTree` is a root node
reference, and `update_batch` path-copies only the dirty paths (structural sharing).

Batch updates: `update_batch(changes)` sorts the changed key hashes once and descends the
tree splitting them by bit, so every dirty node is rebuilt and re-hashed exactly once per
batch, however many changes share it (BlockRaFT's "re-hash the dirty paths once").
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple, TypeAlias

EMPTY = bytes(32)
"""The hash of an empty subtree, at every height."""
KEY_BITS = 256
_LEAF = b"\x00"
_INNER = b"\x01"
_sha256 = hashlib.sha256


def key_hash(key: bytes) -> bytes:
    """A key's path in the tree."""
    return _sha256(key).digest()


def leaf_hash(kh: bytes, value: bytes) -> bytes:
    return _sha256(_LEAF + kh + _sha256(value).digest()).digest()


def _inner_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(_INNER + left + right).digest()


class _Leaf(NamedTuple):
    """A key and its value. `key` and `value` are kept (they are the very objects the state
    map holds, so this costs references only), so an in-order walk yields the contents."""

    hash: bytes
    kint: int
    kh: bytes
    key: bytes
    value: bytes


_Inner: TypeAlias = tuple[bytes, "_Node", "_Node"]
"""(hash, left, right): a plain tuple, so building one costs no Python call (the update's
hot path builds one per level). Its length (3) tells it from a `_Leaf` (5 fields) for the
type checker too; both keep their hash at index 0."""
_Node: TypeAlias = "_Leaf | _Inner | None"


def _new_leaf(kh: bytes, kint: int, key: bytes, value: bytes) -> _Leaf:
    return _Leaf(leaf_hash(kh, value), kint, kh, key, value)


def _inner(left: _Node, right: _Node) -> _Inner:
    return (_sha256(_INNER + (EMPTY if left is None else left[0])
                    + (EMPTY if right is None else right[0])).digest(), left, right)
# One pending change: (key hash as an int, key hash, key, new value or None to delete).
_Change = tuple[int, bytes, bytes, bytes | None]


class _Batch:
    """One `update_batch`: the sorted changes, their key ints (bisected without a key
    function) and the leaf count delta (+1 per leaf built, -1 per resident leaf consumed)."""

    __slots__ = ("delta", "items", "kints")

    def __init__(self, items: list[_Change]) -> None:
        self.items = items
        self.kints = [item[0] for item in items]
        self.delta = 0


def _first(item: _Change) -> int:
    return item[0]


def _combine(left: _Node, right: _Node) -> _Node:
    """The node for a subtree with these children, collapsing a lone leaf upwards."""
    if left is None and (right is None or type(right) is _Leaf):
        return right
    if right is None and type(left) is _Leaf:
        return left
    return _inner(left, right)


def _build(b: _Batch, lo: int, hi: int, depth: int) -> _Node:
    """The subtree at `depth` holding `b.items[lo:hi]` (sorted, unique; a deletion of an
    absent key just vanishes)."""
    if hi - lo == 1:
        kint, kh, key, value = b.items[lo]
        if value is None:
            return None
        b.delta += 1
        return _new_leaf(kh, kint, key, value)
    return _split(None, b, lo, hi, depth)


def _split(node: _Inner | None, b: _Batch, lo: int, hi: int, depth: int) -> _Node:
    """Descend one level: send b.items[lo:hi] to the children of `node` (None = empty)."""
    if depth >= KEY_BITS:  # two distinct 256-bit hashes always split before this
        raise AssertionError("SHA-256 collision in the sparse Merkle tree")
    shift = KEY_BITS - 1 - depth
    # All items share the bits above `depth`; the first with bit `depth` set starts the right.
    pivot = ((b.kints[lo] >> (shift + 1)) << (shift + 1)) | (1 << shift)
    mid = bisect_left(b.kints, pivot, lo, hi)
    left = None if node is None else node[1]
    right = None if node is None else node[2]
    return _combine(_update(left, b, lo, mid, depth + 1),
                    _update(right, b, mid, hi, depth + 1))


def _update(node: _Node, b: _Batch, lo: int, hi: int, depth: int) -> _Node:
    if lo == hi:
        return node
    if hi - lo == 1:
        return _update_one(node, b, b.items[lo], depth)
    if node is None:
        return _build(b, lo, hi, depth)
    if type(node) is _Leaf:
        # Rebuild from the changes plus the resident leaf, unless a change replaces it.
        b.delta -= 1
        pos = bisect_left(b.kints, node.kint, lo, hi)
        if pos < hi and b.kints[pos] == node.kint:
            return _build(b, lo, hi, depth)
        sub = _Batch([*b.items[lo:pos], (node.kint, node.kh, node.key, node.value),
                      *b.items[pos:hi]])
        built = _build(sub, 0, len(sub.items), depth)
        b.delta += sub.delta
        return built
    assert len(node) == 3
    return _split(node, b, lo, hi, depth)


def _update_one(top: _Node, b: _Batch, change: _Change, depth: int) -> _Node:
    """`_update` for a single change (most of a batch's work below its top levels): walk
    down the key's path, then rebuild it bottom-up, with no recursion or bisection."""
    kint, kh, key, value = change
    path: list[_Inner] = []
    node = top
    shift = KEY_BITS - 1 - depth
    while node is not None and len(node) == 3:
        path.append(node)
        node = node[2] if (kint >> shift) & 1 else node[1]
        shift -= 1
    if node is None:
        if value is None:
            return top  # deleting an absent key
        new: _Node = _new_leaf(kh, kint, key, value)
        b.delta += 1
    elif node.kint == kint:
        new = None if value is None else _new_leaf(kh, kint, key, value)
        b.delta -= value is None
    else:
        if value is None:
            return top
        # another key's leaf: both now share this subtree
        resident = (node.kint, node.kh, node.key, node.value)
        sub = _Batch([change, resident] if kint < node.kint else [resident, change])
        new = _build(sub, 0, 2, KEY_BITS - 1 - shift)
        b.delta += 1
    for parent in reversed(path):
        shift += 1
        if (kint >> shift) & 1:
            sibling = parent[1]
            if sibling is not None and new is not None:  # the common case, inlined
                new = (_sha256(_INNER + sibling[0] + new[0]).digest(), sibling, new)
            else:
                new = _combine(sibling, new)
        else:
            sibling = parent[2]
            if sibling is not None and new is not None:
                new = (_sha256(_INNER + new[0] + sibling[0]).digest(), new, sibling)
            else:
                new = _combine(new, sibling)
    return new


@dataclass(frozen=True, slots=True, kw_only=True)
class Proof:
    """A decoded proof (see the module docstring); `encode_proof` gives its bytes."""

    depth: int
    siblings: tuple[bytes | None, ...]  # one per depth, top-down; None = EMPTY
    other: tuple[bytes, bytes] | None = None  # (key hash, value hash) of another leaf


class SparseMerkleTree:
    """An immutable sparse Merkle tree; `update_batch` returns a new tree sharing nodes."""

    __slots__ = ("_root", "_size")

    def __init__(self, _root: _Node = None, _size: int = 0) -> None:
        self._root = _root
        self._size = _size

    @classmethod
    def from_items(cls, items: Iterable[tuple[bytes, bytes]]) -> SparseMerkleTree:
        """A tree holding these (key, value) pairs (keys unique)."""
        return cls().update_batch(items)

    @property
    def root(self) -> bytes:
        return EMPTY if self._root is None else self._root[0]

    def __len__(self) -> int:
        return self._size

    def update_batch(self, changes: Iterable[tuple[bytes, bytes | None]]) -> SparseMerkleTree:
        """The tree with each (key, value) set, or deleted when value is None.

        Raises ValueError when a key appears twice (our own misuse: the caller batches the
        last write of each key)."""
        items: list[_Change] = []
        for key, value in changes:
            kh = _sha256(key).digest()
            items.append((int.from_bytes(kh, "big"), kh, key, value))
        if not items:
            return self
        items.sort(key=_first)
        for a, b in pairwise(items):
            if a[0] == b[0]:
                raise ValueError(f"key {a[2]!r} changed twice in one batch")
        batch = _Batch(items)
        root = _update(self._root, batch, 0, len(items), 0)
        return SparseMerkleTree(root, self._size + batch.delta)

    def get(self, key: bytes) -> bytes | None:
        leaf = self._find(int.from_bytes(_sha256(key).digest(), "big"))
        return None if leaf is None else leaf.value

    def _find(self, kint: int) -> _Leaf | None:
        node = self._root
        depth = 0
        while node is not None and len(node) == 3:
            node = node[2] if (kint >> (KEY_BITS - 1 - depth)) & 1 else node[1]
            depth += 1
        if type(node) is _Leaf and node.kint == kint:
            return node
        return None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in ascending key-hash order (deterministic; one leaf per step,
        so a checkpoint writer can interleave it with other work)."""
        stack: list[_Node] = [self._root]
        while stack:
            node = stack.pop()
            if node is None:
                continue
            if len(node) == 3:
                stack.append(node[2])
                stack.append(node[1])
            else:
                yield node.key, node.value

    def prove(self, key: bytes) -> bytes:
        """The encoded proof of `key`'s value (inclusion) or absence (non-inclusion)."""
        kint = int.from_bytes(_sha256(key).digest(), "big")
        node = self._root
        siblings: list[bytes | None] = []
        while node is not None and len(node) == 3:
            bit = (kint >> (KEY_BITS - 1 - len(siblings))) & 1
            sibling = node[1] if bit else node[2]
            siblings.append(None if sibling is None else sibling[0])
            node = node[2] if bit else node[1]
        other = None
        if type(node) is _Leaf and node.kint != kint:
            other = (node.kh, _sha256(node.value).digest())
        return encode_proof(Proof(depth=len(siblings), siblings=tuple(siblings), other=other))


def encode_proof(proof: Proof) -> bytes:
    bitmap = bytearray((proof.depth + 7) // 8)
    present = []
    for i, sibling in enumerate(proof.siblings):
        if sibling is not None:
            bitmap[i // 8] |= 0x80 >> (i % 8)
            present.append(sibling)
    head = proof.depth.to_bytes(2, "big") + bytes(bitmap)
    tail = b"\x00" if proof.other is None else b"\x01" + proof.other[0] + proof.other[1]
    return head + tail + b"".join(present)


def decode_proof(data: bytes) -> Proof | None:
    """The proof `data` encodes, or None when it is not exactly one well-formed proof."""
    if type(data) is not bytes or len(data) < 3:
        return None
    depth = int.from_bytes(data[:2], "big")
    if depth > KEY_BITS:
        return None
    nbytes = (depth + 7) // 8
    bitmap = data[2:2 + nbytes]
    pos = 2 + nbytes
    if len(bitmap) != nbytes or pos >= len(data) or data[pos] not in (0, 1):
        return None
    if depth % 8 and bitmap and bitmap[-1] & (0xFF >> (depth % 8)):
        return None  # padding bits must be zero, so each proof has one encoding
    other = None
    if data[pos] == 1:
        if len(data) < pos + 65:
            return None
        other = (data[pos + 1:pos + 33], data[pos + 33:pos + 65])
        pos += 65
    else:
        pos += 1
    siblings: list[bytes | None] = []
    for i in range(depth):
        if bitmap[i // 8] & (0x80 >> (i % 8)):
            if len(data) < pos + 32 or data[pos:pos + 32] == EMPTY:
                return None  # an EMPTY sibling is encoded by its clear bit only
            siblings.append(data[pos:pos + 32])
            pos += 32
        else:
            siblings.append(None)
    if pos != len(data):
        return None
    return Proof(depth=depth, siblings=tuple(siblings), other=other)


def verify_proof(root: bytes, key: bytes, value: bytes | None, proof: bytes) -> bool:
    """Whether `proof` shows that, in the tree with this `root`, `key` maps to `value`
    (or is absent, when `value` is None). Pure; never raises on any input."""
    if type(root) is not bytes or type(key) is not bytes or len(root) != 32:
        return False
    if value is not None and type(value) is not bytes:
        return False
    decoded = decode_proof(proof)
    if decoded is None:
        return False
    kh = _sha256(key).digest()
    kint = int.from_bytes(kh, "big")
    depth = decoded.depth
    if decoded.other is not None:
        okh, ovh = decoded.other
        oint = int.from_bytes(okh, "big")
        shift = KEY_BITS - depth
        if value is not None or oint == kint or (oint >> shift) != (kint >> shift):
            return False
        node = _sha256(_LEAF + okh + ovh).digest()
    elif value is not None:
        node = leaf_hash(kh, value)
    else:
        node = EMPTY
    for i in range(depth - 1, -1, -1):
        sibling = decoded.siblings[i]
        other_hash = EMPTY if sibling is None else sibling
        if (kint >> (KEY_BITS - 1 - i)) & 1:
            node = _inner_hash(other_hash, node)
        else:
            node = _inner_hash(node, other_hash)
    return node == root

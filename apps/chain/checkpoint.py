"""The chain app's checkpoint: an immutable view of the state, its serialisation in bounded
chunks, and the strict loader.

Owns: `ChainView` (everything `ChainStateMachine` is, as persistent parts shared with the
live machine: taking one is O(1)), `ChainSnapshot.chunks`, and `load`.

Must not import: consensus cores, storage, trio, clocks.

Format (version 1), a stream of msgpack objects, concatenated:
    ["phalanx.chain", 1, genesis, height, head_hash, last_timestamp, supply, state_root, batch]
    ["leaves", [account, value, account, value, ...]]   # repeated; the committed tree's
                                                        # leaves, ascending by key hash
    ["dirty", [account, value, ...]]                    # working values changed since the
                                                        # last block, ascending by account
    ["blocks", [block, ...]]                            # repeated (~64 KiB each); encoded
                                                        # `BlockData`s of heights 1, 2, ...
    ["end", leaf_count, block_count]
`genesis` is the encoded `Genesis`; `batch` is nil, or ``[index, timestamp, proposer,
[raw tx, ...]]`` for a batch open when the snapshot was taken (so restore resumes inside it).
Every iteration is in a defined order (tree order, sorted dirty keys, heights), never a
hash map's, so equal states give equal bytes on every replica.

`load` checks the header and types, the genesis (a checkpoint of another chain is refused),
the leaf order, that the rebuilt tree's root IS `state_root` and the last block's state root,
that the blocks link by height and hash up to `head_hash`, that balances sum to `supply`, and
the counts; anything else raises `SnapshotFormatError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import immutables
import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps.chain.block import block_hash, decode_header, genesis_hash
from phalanx.apps.chain.smt import SparseMerkleTree
from phalanx.apps.chain.state import ACCOUNT_BYTES, decode_account
from phalanx.apps.chain.tx import decode_tx
from phalanx.apps.chain.types import (
    MAX_AMOUNT,
    REGISTRY,
    BlockData,
    ChainError,
    Genesis,
    decode_genesis,
)
from phalanx.apps.interface import BatchInfo, SnapshotFormatError

_MAGIC = "phalanx.chain"
_VERSION = 1
LEAVES_PER_CHUNK = 512
CHUNK_BYTES = 64 * 1024
"""Blocks are written in chunks of about this many bytes (a block can hold 1,000 txs)."""
_NOTHING = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainView:
    """The whole state, as immutable parts (`tree`, `accounts` and `blocks` are persistent
    structures shared with the machine; `batch_txs` is a tuple)."""

    genesis: Genesis
    tree: SparseMerkleTree
    """The committed state: accounts as of the last block."""
    accounts: immutables.Map[bytes, bytes]
    """The working state: every account, including this batch's changes."""
    dirty: immutables.Map[bytes, None]
    """Accounts changed since the last block (their tree leaves are stale)."""
    height: int
    head_hash: bytes
    last_timestamp: int
    supply: int
    blocks: immutables.Map[int, bytes]
    batch: BatchInfo | None
    batch_txs: tuple[bytes, ...]
    blocks_acc: bytes = bytes(32)
    """A running hash of the blocks (`blocks_step` over heights 1..height): derived, not in
    the format; `view_digest` covers every block's bytes through it in O(1)."""


def blocks_step(acc: bytes, block: bytes) -> bytes:
    """The running block hash after one more encoded block."""
    return hashlib.sha256(acc + hashlib.sha256(block).digest()).digest()


def _header(v: ChainView) -> bytes:
    batch = None if v.batch is None else [
        v.batch.index, v.batch.timestamp, v.batch.proposer, list(v.batch_txs)]
    return _pack([_MAGIC, _VERSION, REGISTRY.encode(v.genesis), v.height, v.head_hash,
                  v.last_timestamp, v.supply, v.tree.root, batch])


def _dirty(v: ChainView) -> bytes:
    dirty: list[bytes] = []
    for account in sorted(v.dirty):  # at most one block's accounts
        dirty += (account, v.accounts[account])
    return _pack(["dirty", dirty])


_DIGEST_TAG = b"phalanx.chain.checkpoint-digest.v1\x00"


def view_digest(v: ChainView, chain: bytes) -> bytes:
    """The chain's own checkpoint digest (`phalanx.apps.interface.CheckpointDigest`) of `v`,
    whose chain id (the genesis hash, `block.chain_id`) is `chain`:
    SHA-256(tag || chain || SHA-256(header fields) || SHA-256(dirty chunk) || block hash acc).
    The header fields are the height, head hash, last timestamp, supply, state root (which
    binds every leaf: `load` rebuilds the tree and checks it) and the open batch; the
    running hash binds every block's bytes. O(dirty accounts): no leaf, block or genesis
    allocation is serialised or hashed again."""
    batch = None if v.batch is None else [
        v.batch.index, v.batch.timestamp, v.batch.proposer, list(v.batch_txs)]
    fields = _pack([v.height, v.head_hash, v.last_timestamp, v.supply, v.tree.root, batch])
    return hashlib.sha256(_DIGEST_TAG + chain + hashlib.sha256(fields).digest()
                          + hashlib.sha256(_dirty(v)).digest() + v.blocks_acc).digest()


class ChainSnapshot:
    """An O(1) snapshot: it holds a `ChainView`, and serialises it on demand."""

    __slots__ = ("_view",)

    def __init__(self, view: ChainView) -> None:
        self._view = view

    def chunks(self) -> Iterator[bytes]:
        v = self._view
        yield _header(v)
        flat: list[bytes] = []
        for account, value in v.tree.items():
            flat += (account, value)
            if len(flat) >= 2 * LEAVES_PER_CHUNK:
                yield _pack(["leaves", flat])
                flat = []
        if flat:
            yield _pack(["leaves", flat])
        yield _dirty(v)
        blocks: list[bytes] = []
        size = 0
        for height in range(1, v.height + 1):
            block = v.blocks[height]
            blocks.append(block)
            size += len(block)
            if size >= CHUNK_BYTES:
                yield _pack(["blocks", blocks])
                blocks, size = [], 0
        if blocks:
            yield _pack(["blocks", blocks])
        yield _pack(["end", len(v.tree), v.height])


def load(data: bytes, genesis: Genesis) -> ChainView:
    """The view `data` serialises. Raises `SnapshotFormatError` on anything malformed."""
    try:
        return _load(data, genesis)
    except SnapshotFormatError:
        raise
    except Exception as exc:  # msgpack errors, wrong shapes: all mean bad checkpoint data
        raise SnapshotFormatError(f"bad chain checkpoint: {type(exc).__name__}: {exc}") from exc


def _fail(message: str) -> SnapshotFormatError:
    return SnapshotFormatError(f"bad chain checkpoint: {message}")


def _load(data: bytes, genesis: Genesis) -> ChainView:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_map_len=0, max_ext_len=0,
                                max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    objs = iter(unpacker)
    head = next(objs, None)
    if not (type(head) is list and len(head) == 9 and head[:2] == [_MAGIC, _VERSION]):
        raise _fail("missing or unknown header")
    _, _, genesis_bytes, height, head_hash, last_ts, supply, root, batch_raw = head
    if type(genesis_bytes) is not bytes or decode_genesis(genesis_bytes) != genesis:
        raise _fail("checkpoint of another chain (genesis differs)")
    for name, value in (("height", height), ("timestamp", last_ts), ("supply", supply)):
        if type(value) is not int or not 0 <= value <= MAX_AMOUNT:
            raise _fail(f"{name} {value!r}")
    if type(head_hash) is not bytes or type(root) is not bytes:
        raise _fail("head hash and state root are bytes")
    batch, batch_txs = _load_batch(batch_raw)

    obj = next(objs, None)
    leaves: list[tuple[bytes, bytes]] = []
    last_kh = b""
    while type(obj) is list and len(obj) == 2 and obj[0] == "leaves":
        flat = obj[1]
        if type(flat) is not list or not flat or len(flat) % 2:
            raise _fail("a leaves chunk is a non-empty [account, value, ...]")
        for i in range(0, len(flat), 2):
            account, value = _account_pair(flat[i], flat[i + 1])
            kh = hashlib.sha256(account).digest()
            if kh <= last_kh:
                raise _fail("leaves out of key-hash order")
            last_kh = kh
            leaves.append((account, value))
        obj = next(objs, None)
    tree = SparseMerkleTree.from_items(leaves)
    if tree.root != root:
        raise _fail("the leaves do not hash to the state root")
    accounts = immutables.Map(leaves)

    if not (type(obj) is list and len(obj) == 2 and obj[0] == "dirty" and type(obj[1]) is list
            and len(obj[1]) % 2 == 0):
        raise _fail("missing dirty chunk")
    flat, dirty_keys, last = obj[1], [], b""
    with accounts.mutate() as m:
        for i in range(0, len(flat), 2):
            account, value = _account_pair(flat[i], flat[i + 1])
            if account <= last:
                raise _fail("dirty accounts out of order")
            last = account
            m[account] = value
            dirty_keys.append(account)
        accounts = m.finish()
    if sum(decode_account(v)[0] for v in accounts.values()) != supply:
        raise _fail("balances do not sum to the supply")

    blocks: dict[int, bytes] = {}
    prev, prev_root, acc = genesis_hash(genesis), None, bytes(32)
    obj = next(objs, None)
    while type(obj) is list and len(obj) == 2 and obj[0] == "blocks":
        if type(obj[1]) is not list or not obj[1]:
            raise _fail("a blocks chunk is a non-empty list")
        for encoded in obj[1]:
            block = REGISTRY.decode(encoded, expected=BlockData)
            header = decode_header(block.header)
            if header.height != len(blocks) + 1 or header.prev_hash != prev:
                raise _fail(f"block {len(blocks) + 1} does not link")
            prev, prev_root = block_hash(header), header.state_root
            blocks[header.height] = encoded
            acc = blocks_step(acc, encoded)
        obj = next(objs, None)
    if len(blocks) != height or prev != head_hash:
        raise _fail("blocks do not end at the head")
    if prev_root is not None and prev_root != root:
        raise _fail("the last block's state root is not the tree's")
    if obj != ["end", len(leaves), height] or next(objs, _NOTHING) is not _NOTHING:
        raise _fail("bad end marker or trailing data")
    return ChainView(genesis=genesis, tree=tree, accounts=accounts,
                     dirty=immutables.Map(dict.fromkeys(dirty_keys)), height=height,
                     head_hash=head_hash, last_timestamp=last_ts, supply=supply,
                     blocks=immutables.Map(blocks), batch=batch, batch_txs=batch_txs,
                     blocks_acc=acc)


def _load_batch(raw: object) -> tuple[BatchInfo | None, tuple[bytes, ...]]:
    if raw is None:
        return None, ()
    if not (type(raw) is list and len(raw) == 4 and type(raw[0]) is int
            and type(raw[1]) is int and type(raw[2]) is str and type(raw[3]) is list):
        raise _fail("batch is [index, timestamp, proposer, txs]")
    for tx in raw[3]:
        if isinstance(decode_tx(tx), ChainError):
            raise _fail("a batch transaction does not decode")
    return BatchInfo(index=raw[0], timestamp=raw[1], proposer=raw[2]), tuple(raw[3])


def _account_pair(account: object, value: object) -> tuple[bytes, bytes]:
    if not (type(account) is bytes and len(account) == 32 and type(value) is bytes
            and len(value) == ACCOUNT_BYTES):
        raise _fail("an account is 32 bytes and its value 16")
    return account, value


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data

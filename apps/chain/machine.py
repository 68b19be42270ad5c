"""`ChainStateMachine`: the blockchain app as a phalanx `StateMachine` with `BatchHooks`.

Owns: applying signed transactions (`phalanx.apps.chain.tx`) to the accounts
(`phalanx.apps.chain.state`), block building (a block per batch), the state root (a
`SparseMerkleTree` updated once per block), queries, snapshots and restore
(`phalanx.apps.chain.checkpoint`), and the `Admission` hook (stateless checks on arrival).

Must not import: consensus cores, storage, trio, clocks.

Blocks:
- With `BatchHooks` (`begin_batch(info)`, `apply`..., `end_batch()`), a batch is one block:
  `apply` updates the working accounts only and records the transaction; `end_batch` feeds
  the block's changed accounts to the tree in one `update_batch` (each dirty path re-hashed
  once), builds the `BlockHeader` and returns the state root. A batch with no successful
  transaction still makes an (empty) block, so heights follow the batches.
- Without hooks (a replica that does not know them), each `apply` of a transaction that
  succeeds is its own block (timestamp: the previous block's; proposer: ""); a refused one
  makes no block.
- A block holds only the transactions that executed successfully, in order; a refused one
  gets a typed `ChainError` result and changes nothing (not even the sender's nonce).

Invariants:
- `apply`/`query` never raise: every refusal is an encoded `ChainError`.
- Deterministic: results, blocks and roots depend on the commands and the `BatchInfo`s only.
- `snapshot()` is O(1): persistent maps and the persistent tree are shared, the open batch's
  transaction list (one block at most) is copied to a tuple.
- Proof queries answer against the last block (its root, its accounts), never against the
  unfinished batch; balance and nonce queries see the working state.

Signature policy (what `apply` trusts):
- Default (safe under Byzantine faults): `apply` verifies every transaction's signature
  unless this node's own `admit` verified exactly these bytes (its tx id AND signature) and
  they are still in a bounded FIFO cache (`admitted_cache_size`, entries consumed by
  `apply`). A transaction another node admitted, or a Byzantine primary injected, is
  verified in `apply`; a signature check is a pure function of the bytes, so the cache only
  saves work: results never depend on what a node admitted.
- `trust_leader_admission=True` (crash faults only, e.g. Raft): `apply` never verifies a
  signature, trusting that the leader's `admit` checked every transaction it ordered. A
  Byzantine leader breaks this; never use it with a Byzantine-fault protocol.
- The chain id is checked in `admit` and in `apply` under every policy (cheap).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import immutables

from phalanx.apps.chain import checkpoint
from phalanx.apps.chain.block import (
    BlockHeader,
    block_hash,
    chain_id,
    decode_header,
    encode_header,
    genesis_hash,
    tx_root,
)
from phalanx.apps.chain.smt import SparseMerkleTree
from phalanx.apps.chain.state import decode_account, encode_account, execute
from phalanx.apps.chain.tx import (
    MAX_TX_BYTES,
    SignedTransaction,
    decode_tx,
    verify_signature,
    verify_stateless,
    wrong_chain,
)
from phalanx.apps.chain.types import (
    REGISTRY,
    AccountProof,
    Balance,
    BlockData,
    ChainError,
    ChainErrorCode,
    Genesis,
    GetAccountProof,
    GetBalance,
    GetBlock,
    GetHead,
    GetNonce,
    Head,
    Nonce,
    TxApplied,
    decode_query,
)
from phalanx.apps.interface import BatchInfo

MAX_QUERY_BYTES = 256
ADMITTED_CACHE_SIZE = 65_536
"""Default bound on the signatures `admit` verified and `apply` may skip (~100 B each)."""


class ChainStateMachine:
    """Accounts, a minted token and blocks over signed transactions (see docs/CHAIN.md).

    Args:
        genesis: the chain's minter and initial balances (equal on every replica); its hash
            is the chain id transactions must name.
        trust_leader_admission: crash-fault protocols only (Raft): `apply` skips every
            signature check, trusting the leader's `admit` to have checked what it ordered.
            False (the default) is safe under Byzantine faults: `apply` verifies every
            signature `admit` on this node did not (see the module docstring).
        admitted_cache_size: how many transactions `admit` verified are remembered so
            `apply` can skip their signature (0: `apply` verifies every one).
    """

    max_command_bytes = MAX_TX_BYTES

    def __init__(self, genesis: Genesis, *, trust_leader_admission: bool = False,
                 admitted_cache_size: int = ADMITTED_CACHE_SIZE) -> None:
        if admitted_cache_size < 0:
            raise ValueError("admitted_cache_size must be >= 0")
        self._genesis = genesis
        self._chain_id = chain_id(genesis)
        self.trust_leader_admission = trust_leader_admission
        self._admitted_cache_size = admitted_cache_size
        self._admitted: OrderedDict[bytes, None] = OrderedDict()
        self.signature_checks = {"verified": 0, "admitted": 0, "trusted": 0}
        """How `apply` settled each signature: verified there, verified by this node's
        `admit` (cache hit), or trusted to the leader (statistics; not replicated state)."""
        balances = [(a, encode_account(b, 0)) for a, b in genesis.balances]
        self._tree = SparseMerkleTree.from_items(balances)
        self._accounts: immutables.Map[bytes, bytes] = immutables.Map(balances)
        self._dirty: immutables.Map[bytes, None] = immutables.Map()
        self._supply = sum(b for _, b in genesis.balances)
        self._height = 0
        self._head_hash = genesis_hash(genesis)
        self._last_timestamp = 0
        self._blocks: immutables.Map[int, bytes] = immutables.Map()
        self._blocks_acc = bytes(32)  # checkpoint.blocks_step over the blocks
        self._batch: BatchInfo | None = None
        self._batch_txs: list[bytes] = []
        self._batch_ids: list[bytes] = []
        self.refused: dict[str, int] = {}
        """Refused commands by `ChainErrorCode` value (statistics; not replicated state)."""
        self._block_listeners: list[Callable[[int, bytes], None]] = []
        self._loaded: tuple[bytes, checkpoint.ChainView] | None = None  # see `_load`

    # --- StateMachine --------------------------------------------------------------------

    def apply(self, command: bytes) -> bytes:
        tx = decode_tx(command)
        if isinstance(tx, ChainError):
            return self._refuse(tx)
        if tx.chain_id != self._chain_id:
            return self._refuse(wrong_chain(tx))
        if not self._signature_ok(tx):
            return self._refuse(ChainError(code=ChainErrorCode.BAD_SIGNATURE,
                                           message=tx.tx_id.hex()[:16]))
        outcome = execute(self._accounts, self._supply, self._genesis, tx)
        if isinstance(outcome, ChainError):
            return self._refuse(outcome)
        changes, self._supply = outcome
        with self._accounts.mutate() as accounts, self._dirty.mutate() as dirty:
            for account, value in changes.items():
                accounts[account] = value
                dirty[account] = None
            self._accounts = accounts.finish()
            self._dirty = dirty.finish()
        implicit = self._batch is None
        if implicit:
            self.begin_batch(BatchInfo(index=self._height + 1, timestamp=self._last_timestamp,
                                       proposer=""))
        self._batch_txs.append(tx.raw)
        self._batch_ids.append(tx.tx_id)
        if implicit:
            self.end_batch()
            return REGISTRY.encode(TxApplied(tx_id=tx.tx_id, height=self._height))
        return REGISTRY.encode(TxApplied(tx_id=tx.tx_id, height=self._height + 1))

    def query(self, request: bytes) -> bytes:
        if len(request) > MAX_QUERY_BYTES:
            return REGISTRY.encode(ChainError(code=ChainErrorCode.TOO_LARGE))
        q = decode_query(request)
        result: object
        if isinstance(q, ChainError):
            result = q
        elif isinstance(q, GetBalance | GetNonce):
            balance, nonce = decode_account(self._accounts.get(q.account))
            result = (Balance(account=q.account, balance=balance) if isinstance(q, GetBalance)
                      else Nonce(account=q.account, nonce=nonce))
        elif isinstance(q, GetAccountProof):
            result = AccountProof(account=q.account, value=self._tree.get(q.account),
                                  proof=self._tree.prove(q.account), state_root=self._tree.root,
                                  height=self._height, block_hash=self._head_hash)
        elif isinstance(q, GetHead):
            result = Head(height=self._height, block_hash=self._head_hash,
                          state_root=self._tree.root)
        else:
            assert isinstance(q, GetBlock)
            block = self._blocks.get(q.height)
            result = (REGISTRY.decode(block, expected=BlockData) if block is not None else
                      ChainError(code=ChainErrorCode.NOT_FOUND, message=f"height {q.height}"))
        return REGISTRY.encode(result)

    def snapshot(self) -> checkpoint.ChainSnapshot:
        return checkpoint.ChainSnapshot(self._view())

    def restore(self, data: bytes) -> None:
        v = self._load(data)
        self._tree, self._accounts, self._dirty = v.tree, v.accounts, v.dirty
        self._height, self._head_hash, self._supply = v.height, v.head_hash, v.supply
        self._last_timestamp, self._blocks, self._batch = v.last_timestamp, v.blocks, v.batch
        self._blocks_acc = v.blocks_acc
        self._batch_txs = list(v.batch_txs)
        self._batch_ids = []
        for raw in v.batch_txs:
            tx = decode_tx(raw)
            assert not isinstance(tx, ChainError)  # load checked every one
            self._batch_ids.append(tx.tx_id)

    # --- BatchHooks ----------------------------------------------------------------------

    def begin_batch(self, info: BatchInfo) -> None:
        if self._batch is not None:
            raise RuntimeError("begin_batch: a batch is already open")
        self._batch = info

    def end_batch(self) -> bytes:
        """Close the block: update the tree once, store the header; return the state root."""
        info = self._batch
        if info is None:
            raise RuntimeError("end_batch: no batch is open")
        self._loaded = None
        accounts = self._accounts
        self._tree = self._tree.update_batch((a, accounts[a]) for a in self._dirty)
        self._last_timestamp = max(self._last_timestamp, info.timestamp)
        header = BlockHeader(height=self._height + 1, prev_hash=self._head_hash,
                             tx_root=tx_root(self._batch_ids), state_root=self._tree.root,
                             timestamp=self._last_timestamp, proposer=info.proposer)
        self._height = header.height
        self._head_hash = block_hash(header)
        encoded = REGISTRY.encode(
            BlockData(header=encode_header(header), txs=tuple(self._batch_txs)))
        self._blocks = self._blocks.set(header.height, encoded)
        self._blocks_acc = checkpoint.blocks_step(self._blocks_acc, encoded)
        self._dirty = immutables.Map()
        self._batch = None
        self._batch_txs = []
        self._batch_ids = []
        for listener in self._block_listeners:
            listener(header.height, self._head_hash)
        return self._tree.root

    # --- CheckpointDigest --------------------------------------------------------------

    def state_digest(self) -> bytes:
        """The checkpoint digest of the current state (`checkpoint.view_digest`), O(1) in the
        number of accounts and blocks: what PBFT's checkpoint votes carry for the chain."""
        return checkpoint.view_digest(self._view(), self._chain_id)

    def snapshot_digest(self, data: bytes) -> bytes:
        """`state_digest` of checkpoint bytes, checked as strictly as `restore` (state
        transfer). Raises `SnapshotFormatError`; the machine's state is unchanged."""
        return checkpoint.view_digest(self._load(data), self._chain_id)

    def _load(self, data: bytes) -> checkpoint.ChainView:
        """`checkpoint.load` through a one-entry cache keyed by SHA-256 of the bytes: PBFT's
        state transfer digests fetched bytes and then restores them, a restart restores and
        then digests them; each loads (rebuilds the tree: O(state)) once, not twice. Pure
        caching: the result is `load`'s either way; `end_batch` drops it."""
        key = hashlib.sha256(data).digest()
        cached, self._loaded = self._loaded, None
        if cached is not None and cached[0] == key:
            return cached[1]
        view = checkpoint.load(data, self._genesis)
        self._loaded = (key, view)
        return view

    # --- BlockStream (node-local observers; not replicated state) -----------------------

    @property
    def block_id(self) -> bytes:
        """The chain id (`BlockStream`): what block certificates sign with each block."""
        return self._chain_id

    def block_hash_at(self, height: int) -> bytes | None:
        """The hash of this node's block at `height` (`BlockStream`), None when it has none
        (e.g. a checkpoint dropped it)."""
        block = self.block(height) if type(height) is int else None
        if block is None:
            return None
        return block_hash(decode_header(block.header))

    def on_block(self, listener: Callable[[int, bytes], None]) -> None:
        """Call `listener(height, block_hash)` after every block `end_batch` closes from now
        on (`phalanx.apps.interface.BlockStream`; e.g. the block-certifier service)."""
        self._block_listeners.append(listener)

    # --- Admission -----------------------------------------------------------------------

    def admit(self, command: bytes, read_only: bool) -> str | None:
        """The stateless checks on arrival: a query must decode; a transaction must be
        well-formed, for this chain and correctly signed. An accepted transaction's (tx id,
        signature) enters the bounded admitted cache `apply` consults (not replicated state:
        results never depend on it)."""
        if read_only:
            q = decode_query(command) if len(command) <= MAX_QUERY_BYTES else None
            return None if q is not None and not isinstance(q, ChainError) else "bad query"
        tx = verify_stateless(command, chain_id=self._chain_id)
        if isinstance(tx, ChainError):
            return str(tx)
        if not self.trust_leader_admission and self._admitted_cache_size:
            admitted = self._admitted
            admitted[tx.tx_id + tx.signature] = None
            admitted.move_to_end(tx.tx_id + tx.signature)
            if len(admitted) > self._admitted_cache_size:
                admitted.popitem(last=False)
        return None

    # --- for the replica, the CLI and tests ----------------------------------------------

    @property
    def genesis(self) -> Genesis:
        return self._genesis

    @property
    def chain_id(self) -> bytes:
        """What every transaction of this chain names: `block.chain_id(genesis)`."""
        return self._chain_id

    @property
    def height(self) -> int:
        return self._height

    @property
    def state_root(self) -> bytes:
        """The last block's state root (what PBFT checkpoint votes can carry as a digest)."""
        return self._tree.root

    @property
    def head_hash(self) -> bytes:
        return self._head_hash

    @property
    def supply(self) -> int:
        return self._supply

    def block(self, height: int) -> BlockData | None:
        data = self._blocks.get(height)
        return None if data is None else REGISTRY.decode(data, expected=BlockData)

    def balance(self, account: bytes) -> int:
        return decode_account(self._accounts.get(account))[0]

    def _view(self) -> checkpoint.ChainView:
        return checkpoint.ChainView(
            genesis=self._genesis, tree=self._tree, accounts=self._accounts, dirty=self._dirty,
            height=self._height, head_hash=self._head_hash,
            last_timestamp=self._last_timestamp, supply=self._supply, blocks=self._blocks,
            batch=self._batch, batch_txs=tuple(self._batch_txs), blocks_acc=self._blocks_acc)

    def _signature_ok(self, tx: SignedTransaction) -> bool:
        checks = self.signature_checks
        if self.trust_leader_admission:
            checks["trusted"] += 1
            return True
        # keyed by tx id AND signature: the same body with another signature (a Byzantine
        # primary's substitute) was not admitted and is verified here
        key = tx.tx_id + tx.signature
        if key in self._admitted:
            del self._admitted[key]
            checks["admitted"] += 1
            return True
        checks["verified"] += 1
        return verify_signature(tx)

    def _refuse(self, error: ChainError) -> bytes:
        self.refused[error.code.value] = self.refused.get(error.code.value, 0) + 1
        return REGISTRY.encode(error)


"""The bank workload on the chain app: signed transfers between genesis accounts, and reads
of every balance at one block, rebuilt and verified from the blocks themselves.

Owns: `ChainBankWorkload` (the `phalanx.jepsen.workloads.Workload` interface, history
format of `phalanx.jepsen.bank`) and `bank_workload`, its `AppSpec` factory.

Operations:
    * ``init``: the genesis balances (fixed before any transfer: completes ``ok`` at once);
    * ``transfer``: one transaction signed with the source account's key (DIR/chain/keys),
      at a nonce taken from a per-account counter shared by the workers (nonces may skip;
      two in flight for one account may race: the later-ordered lower one is refused as
      ``stale_nonce``, certainly without effect: ``fail``, as are ``insufficient_balance``
      and every other chain refusal); a timeout is ``info`` (may apply later);
    * ``read``: the balances of every account at the head block. The workload keeps a mirror
      `ChainStateMachine` and extends it with the blocks up to the (linearizable) head:
      each block must link (height, previous hash), every transaction must execute, and
      re-execution must give the block's state root, so a read is one consistent snapshot
      the replicas' own state roots vouch for. A block that does not verify is a ``chain``
      checker failure (that read and every later one are ``fail``: the mirror stops there).
      One read fetches at a time; a read that waits `LOCK_WAIT` for it is ``fail``.

Checks: the bank checker (totals conserved, no negative balance, the account set) plus
``chain`` (every fetched block verified).

Must not import: the runtime, consensus cores, the simulator.
"""

from __future__ import annotations

import random
from typing import Final

import immutables
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.block import block_hash, chain_id
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import public_key
from phalanx.apps.chain.types import BlockData, TxApplied, decode_result
from phalanx.apps.interface import BatchInfo
from phalanx.appspec.chain_app import account_key, keys_dir, read_genesis
from phalanx.client.async_client import Client, ClientError
from phalanx.client.chain import ChainClient, ChainCommandError
from phalanx.client.chain_export import fetch_blocks
from phalanx.jepsen import bank as bank_checker
from phalanx.jepsen.checker import CheckerResult, RunResult, check_history
from phalanx.jepsen.history import FAIL, OK, History
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT
from phalanx.jepsen.workloads import Completion, Invocation, WorkloadConfig, _client_error
from phalanx.ops.node_config import ClusterConfig

MIX: Final = (("read", 0.4), ("transfer", 0.6))
LOCK_WAIT: Final = 2.0
"""Longest a read waits for another read's block fetching (then it is ``fail``: reads have
no effect), so one slow fetch under faults does not hold every worker."""


class ChainBankWorkload:
    """See the module docstring."""

    name = "bank"

    def __init__(self, config: WorkloadConfig, cluster: ClusterConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.genesis = read_genesis(cluster.app_files["genesis"])
        funded = {a: b for a, b in self.genesis.balances}
        self.keys: dict[str, Ed25519PrivateKey] = {}
        for path in sorted(keys_dir(cluster.directory).glob("*.key")):
            key = account_key(path)
            if public_key(key) in funded:
                self.keys[path.stem] = key
        self.accounts = tuple(sorted(self.keys))
        if len(self.accounts) < 2:
            raise ValueError("the chain bank needs at least 2 funded account keys")
        self.opening = {a: funded[public_key(self.keys[a])] for a in self.accounts}
        self.functions = (*bank_checker.FUNCTIONS, bank_checker.INIT)
        self._nonces = dict.fromkeys(self.accounts, 0)
        self._mirror = ChainStateMachine(self.genesis)
        self._lock = trio.Lock()
        self.problems: list[str] = []
        self.blocks_verified = 0

    def delay(self) -> float:
        return self.rng.expovariate(self.config.rate)

    def setup_invocations(self) -> tuple[Invocation, ...]:
        return (Invocation(f=bank_checker.INIT, value=immutables.Map(self.opening)),)

    def final_invocations(self) -> tuple[Invocation, ...]:
        return (Invocation(f="read"),)

    def next_invocation(self) -> Invocation:
        if self.rng.choices([f for f, _ in MIX], [w for _, w in MIX])[0] == "read":
            return Invocation(f="read")
        src, dst = self.rng.sample(self.accounts, 2)
        amount = self.rng.randint(1, max(1, min(self.opening.values()) // 4))
        return Invocation(f="transfer",
                          value=immutables.Map({"from": src, "to": dst, "amount": amount}))

    async def execute(self, client: object, invocation: Invocation) -> Completion:
        if not isinstance(client, Client):
            raise TypeError("the chain bank runs on a phalanx.client.Client")
        chain = ChainClient(client, chain_id(self.genesis))
        try:
            if invocation.f == bank_checker.INIT:
                return Completion(type=OK, value=invocation.value)
            if invocation.f == "read":
                return await self._read(chain)
            if invocation.f == "transfer":
                return await self._transfer(chain, invocation)
        except ChainCommandError as exc:
            return Completion(type=FAIL, value=invocation.value, error=str(exc))
        except ClientError as exc:
            return _client_error(exc, wrote=invocation.f == "transfer")
        raise ValueError(f"not a bank invocation: {invocation!r}")

    async def _transfer(self, chain: ChainClient, invocation: Invocation) -> Completion:
        move = invocation.value
        if not isinstance(move, immutables.Map):
            raise ValueError(f"not a transfer: {move!r}")
        src, dst, amount = str(move["from"]), str(move["to"]), move["amount"]
        if not isinstance(amount, int):
            raise ValueError(f"not a transfer: {move!r}")
        self._nonces[src] += 1
        await chain.transfer(self.keys[src], public_key(self.keys[dst]), amount,
                             nonce=self._nonces[src])
        return Completion(type=OK, value=move)

    async def _read(self, chain: ChainClient) -> Completion:
        with trio.move_on_after(LOCK_WAIT) as waiting:
            await self._lock.acquire()
        if waiting.cancelled_caught:
            return Completion(type=FAIL,
                              error=f"another read was fetching blocks for {LOCK_WAIT} s")
        try:
            return await self._read_locked(chain)
        finally:
            self._lock.release()

    async def _read_locked(self, chain: ChainClient) -> Completion:
        if self.problems:  # the mirror stopped at a block that did not verify
            return Completion(type=FAIL, error=self.problems[0])
        head = (await chain.head()).height
        mirror = self._mirror
        for data in await fetch_blocks(chain, mirror.height + 1, head, parallel=8):
            problem = self._extend(data)
            if problem is not None:
                self.problems.append(problem)
                return Completion(type=FAIL, error=problem)
        balances = {a: mirror.balance(public_key(self.keys[a])) for a in self.accounts}
        return Completion(type=OK, value=immutables.Map(balances))

    def _extend(self, data: BlockData) -> str | None:
        """Apply the next block to the mirror; why it does not verify, or None."""
        from phalanx.apps.chain.block import decode_header

        mirror = self._mirror
        height = mirror.height + 1
        try:
            header = decode_header(data.header)
        except ValueError as e:
            return f"block {height}: undecodable header: {e}"
        if header.height != height or header.prev_hash != mirror.head_hash:
            return f"block {height}: does not link to block {mirror.height}"
        mirror.begin_batch(BatchInfo(index=height, timestamp=header.timestamp,
                                     proposer=header.proposer))
        refused = [i for i, raw in enumerate(data.txs)
                   if not isinstance(decode_result(mirror.apply(raw)), TxApplied)]
        root = mirror.end_batch()
        if refused or root != header.state_root or mirror.head_hash != block_hash(header):
            why = (f"transactions {refused} do not execute" if refused
                   else "re-execution gives another state root")
            return f"block {height}: {why}"
        self.blocks_verified += 1
        return None

    def check(self, history: History, *, time_limit: float | None = DEFAULT_TIME_LIMIT
              ) -> RunResult:
        base = check_history(self.name, history, functions=self.functions,
                             time_limit=time_limit)
        chain = CheckerResult(checker="chain", valid=not self.problems,
                              details={"blocks_verified": self.blocks_verified,
                                       "problems": self.problems[:20]})
        return RunResult(workload=base.workload, results=(*base.results, chain),
                         linearizability=base.linearizability)


def bank_workload(config: WorkloadConfig, cluster: ClusterConfig) -> ChainBankWorkload:
    """The `AppSpec` factory (`phalanx.appspec.builtin.CHAIN`)."""
    return ChainBankWorkload(config, cluster)

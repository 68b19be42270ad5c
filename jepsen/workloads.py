"""Client workloads for real-cluster runs: register, bank and set, behind one interface.

Owns:
    `Workload` (the interface the harness drives), `Invocation` / `Completion`, the three
    workloads (`RegisterWorkload`, `BankWorkload`, `SetWorkload`), `make_workload(name)`, and
    `perform(...)`, which records one operation (invoke, execute, complete) in a history.

Interface (what the runner does with a workload ``w``)::

    for inv in w.setup_invocations(): await perform(w, client, recorder, ...)   # bank: init
    while running:                      # from any number of worker tasks
        await trio.sleep(w.delay())     # seeded exponential gaps, mean 1 / rate (global)
        inv = w.next_invocation()
        outcome = await perform(w, client, recorder, process=p, now=now, invocation=inv)
        if outcome == "info": p = fresh_process_id()      # Jepsen: info retires a process
    heal faults, then: for inv in w.final_invocations(): await perform(...)
    verdict = w.check(history)          # `phalanx.jepsen.checker.RunResult`, stats included

Generation is seeded (`random.Random(seed)`), so the same seed gives the same invocations
in the same order (the real interleaving, of course, differs). Keys rotate: after
`per_key_limit` invocations a key is retired and a fresh one takes its slot (Jepsen's
``independent`` generator), so per-key checking stays tractable.

Outcome rules (`execute`), the client's promises mapped to Jepsen's:
    * the operation returned: ``ok`` (a cas/txn whose comparison failed: ``fail``);
    * `RequestRejected` (incl. `KvCommandError`): ``fail``, it certainly had no effect;
    * `ClientTimeout`, `ClientClosed`, any other `ClientError`: ``info``, unless the
      operation is a read-then-write (bank transfer, set add) that had not yet sent any
      write, in which case it certainly had no effect: ``fail`` with the error.

Storage layout in the KV: register ``jr/<n>`` (decimal value); bank ``bank/<account>``
(decimal balance), read with one atomic `scan`, transfers by one `Txn` comparing both
balances; set ``set/<n>`` holding the elements as comma-separated decimals, appended with a
cas loop (a double-applied append would show as a duplicate).

Signed transactions (`WorkloadConfig.transactions`, set by the harness from the protocol's
spec: `CallStrategy.ENDORSEMENT`): the same keys, run as `phalanx.jepsen.tx_workloads`
says (requirements on every key an operation the checker reads as linearizable touches; the
bank reads all accounts in one transaction; the set is a KV set written by commuting
`sadd`). The checkers are the same.

Must not import: the runtime, consensus cores, the simulator. Not deterministic in time
(real clients); no global randomness.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import immutables

from phalanx.apps.kv_types import CasResult, Compare, Put, TxnResult, TxnWrite
from phalanx.client.async_client import ClientError, RequestRejected
from phalanx.jepsen import bank as bank_checker
from phalanx.jepsen import sets as set_checker
from phalanx.jepsen import tx_workloads as tx
from phalanx.jepsen.checker import RunResult, check_history
from phalanx.jepsen.history import FAIL, INFO, OK, History, HistoryRecorder, Key, OpType, Process
from phalanx.jepsen.history import Value as HistoryValue
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT

REGISTER_PREFIX: Final = "jr/"
BANK_PREFIX: Final = "bank/"
SET_PREFIX: Final = "set/"
MAX_RETRIES: Final = 8
"""Compare failures a transfer or an add retries before it gives up (``fail``)."""


class KvClient(Protocol):
    """The slice of `phalanx.client.Client` the workloads use."""

    async def get(self, key: str, *, stale: bool = False) -> bytes | None: ...
    async def put(self, key: str, value: bytes) -> None: ...
    async def cas_result(self, key: str, expected: bytes | None, new: bytes) -> CasResult: ...
    async def scan(
        self, prefix: str, *, limit: int = 1000, stale: bool = False
    ) -> list[tuple[str, bytes]]: ...
    async def txn_result(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
    ) -> TxnResult: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Invocation:
    """What to invoke: the history's ``f``, ``key`` and ``value``."""

    f: str
    key: Key = None
    value: HistoryValue = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """How it ended: the completion's type, value and error (for the history)."""

    type: OpType
    value: HistoryValue = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    """Generator settings. `mix` weights each f (None: the workload's default)."""

    seed: int = 0
    rate: float = 50.0
    mix: tuple[tuple[str, float], ...] | None = None
    per_key_limit: int = 150
    active_keys: int = 5
    accounts: int = 5
    balance: int = 20
    transactions: bool = False
    """The protocol's clients sign transactions (`CallStrategy.ENDORSEMENT`): run every
    operation the `phalanx.jepsen.tx_workloads` way (requirements where the checker needs
    linearizability, commuting set adds)."""

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.per_key_limit < 1 or self.active_keys < 1:
            raise ValueError("rate must be > 0, per_key_limit and active_keys >= 1")
        if self.accounts < 2 or self.balance < 1:
            raise ValueError("a bank needs at least 2 accounts and a positive balance")


class Workload(Protocol):
    """See the module docstring."""

    name: str
    functions: tuple[str, ...]
    """Kinds that must each succeed at least once (the stats checker)."""

    def delay(self) -> float: ...
    def next_invocation(self) -> Invocation: ...
    def setup_invocations(self) -> tuple[Invocation, ...]: ...
    def final_invocations(self) -> tuple[Invocation, ...]: ...
    async def execute(self, client: KvClient, invocation: Invocation) -> Completion: ...
    def check(self, history: History, *, time_limit: float | None = ...) -> RunResult: ...


class _Outcome(Exception):
    def __init__(self, completion: Completion) -> None:
        super().__init__(completion.error)
        self.completion = completion


def _client_error(exc: ClientError, *, wrote: bool = True) -> Completion:
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RequestRejected) or not wrote:
        return Completion(type=FAIL, error=error)
    return Completion(type=INFO, error=error)


class _Base:
    name = ""
    functions: tuple[str, ...] = ()
    default_mix: tuple[tuple[str, float], ...] = ()
    prefix = ""

    def __init__(self, config: WorkloadConfig | None = None) -> None:
        self.config = config if config is not None else WorkloadConfig()
        self.rng = random.Random(self.config.seed)
        mix = self.config.mix if self.config.mix is not None else self.default_mix
        unknown = sorted(f for f, _ in mix if f not in self.functions)
        if unknown or not mix or any(w < 0 for _, w in mix) or sum(w for _, w in mix) <= 0:
            raise ValueError(f"bad {self.name} mix {mix!r} (kinds: {', '.join(self.functions)})")
        self._fs = tuple(f for f, _ in mix)
        self._weights = tuple(w for _, w in mix)
        self._active = [f"{self.prefix}{i}" for i in range(self.config.active_keys)]
        self._next_key = self.config.active_keys
        self.used: dict[str, int] = {}
        """Invocations per key, in first-use order."""

    def delay(self) -> float:
        return self.rng.expovariate(self.config.rate)

    def _pick_f(self) -> str:
        return self.rng.choices(self._fs, self._weights)[0]

    def _pick_key(self) -> str:
        i = self.rng.randrange(len(self._active))
        key = self._active[i]
        self.used[key] = self.used.get(key, 0) + 1
        if self.used[key] >= self.config.per_key_limit:
            self._active[i] = f"{self.prefix}{self._next_key}"
            self._next_key += 1
        return key

    def setup_invocations(self) -> tuple[Invocation, ...]:
        return ()

    def check(
        self, history: History, *, time_limit: float | None = DEFAULT_TIME_LIMIT
    ) -> RunResult:
        return check_history(self.name, history, functions=self.functions, time_limit=time_limit)


def _int(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        raise _Outcome(Completion(type=INFO, error=f"unparseable value {raw!r}")) from None


class RegisterWorkload(_Base):
    """read / write / cas of unique integers on rotating keys; per-key linearizability."""

    name = "register"
    functions: tuple[str, ...] = ("cas", "read", "write")
    default_mix = (("read", 0.4), ("write", 0.4), ("cas", 0.2))
    prefix = REGISTER_PREFIX

    def __init__(self, config: WorkloadConfig | None = None) -> None:
        super().__init__(config)
        self._next_value = 1
        self._written: dict[str, list[int]] = {}

    def next_invocation(self) -> Invocation:
        f = self._pick_f()
        key = self._pick_key()
        if f == "read":
            return Invocation(f=f, key=key)
        value = self._next_value
        self._next_value += 1
        recent = self._written.setdefault(key, [])
        expected = self.rng.choice(recent[-3:]) if recent and self.rng.random() < 0.9 else None
        recent.append(value)
        if f == "write":
            return Invocation(f=f, key=key, value=value)
        return Invocation(f=f, key=key, value=(expected, value))

    def final_invocations(self) -> tuple[Invocation, ...]:
        return tuple(Invocation(f="read", key=k) for k in self.used)

    async def execute(self, client: KvClient, invocation: Invocation) -> Completion:
        key = str(invocation.key)
        value = invocation.value
        signed = self.config.transactions
        try:
            if invocation.f == "read":
                raw = await client.get(key)  # signed: a read-only transaction with requirement
                return Completion(type=OK, value=None if raw is None else _int(raw))
            if invocation.f == "write" and isinstance(value, int):
                if signed:
                    await tx.register_write(tx.tx_client(client), key, str(value).encode())
                else:
                    await client.put(key, str(value).encode())
                return Completion(type=OK, value=value)
            if invocation.f == "cas" and isinstance(value, tuple) and len(value) == 2:
                expected, new = value
                old = None if expected is None else str(expected).encode()
                if signed:
                    result = await tx.register_cas(tx.tx_client(client), key, old,
                                                   str(new).encode())
                else:
                    result = await client.cas_result(key, old, str(new).encode())
                if result.succeeded:
                    return Completion(type=OK, value=value)
                return Completion(type=FAIL, value=value, error="cas comparison failed")
        except ClientError as exc:
            return _client_error(exc)
        except _Outcome as out:
            return out.completion
        raise ValueError(f"not a register invocation: {invocation!r}")


class BankWorkload(_Base):
    """Transfers between accounts and atomic reads of all of them (`phalanx.jepsen.bank`)."""

    name = "bank"
    functions: tuple[str, ...] = bank_checker.FUNCTIONS
    default_mix = (("read", 0.5), ("transfer", 0.5))
    prefix = BANK_PREFIX

    def __init__(self, config: WorkloadConfig | None = None) -> None:
        super().__init__(config)
        self.accounts = tuple(str(i) for i in range(self.config.accounts))
        self.functions = (*bank_checker.FUNCTIONS, bank_checker.INIT)

    def setup_invocations(self) -> tuple[Invocation, ...]:
        opening = immutables.Map({a: self.config.balance for a in self.accounts})
        return (Invocation(f=bank_checker.INIT, value=opening),)

    def next_invocation(self) -> Invocation:
        if self._pick_f() == "read":
            return Invocation(f="read")
        src, dst = self.rng.sample(self.accounts, 2)
        amount = self.rng.randint(1, max(1, self.config.balance // 4))
        return Invocation(
            f="transfer", value=immutables.Map({"from": src, "to": dst, "amount": amount})
        )

    def final_invocations(self) -> tuple[Invocation, ...]:
        return (Invocation(f="read"),)

    async def execute(self, client: KvClient, invocation: Invocation) -> Completion:
        try:
            if invocation.f == bank_checker.INIT:
                return await self._init(client, invocation)
            if invocation.f == "read":
                return Completion(type=OK, value=immutables.Map(await self._read(client)))
            if invocation.f == "transfer":
                return await self._transfer(client, invocation)
        except ClientError as exc:
            return _client_error(exc)
        except _Outcome as out:
            return out.completion
        raise ValueError(f"not a bank invocation: {invocation!r}")

    async def _init(self, client: KvClient, invocation: Invocation) -> Completion:
        result = await client.txn_result(
            [Compare(key=BANK_PREFIX + a, expected=None) for a in self.accounts],
            [
                Put(key=BANK_PREFIX + a, value=str(self.config.balance).encode())
                for a in self.accounts
            ],
        )
        if result.succeeded:
            return Completion(type=OK, value=invocation.value)
        return Completion(type=FAIL, value=invocation.value, error="accounts already exist")

    async def _read(self, client: KvClient) -> dict[str, int]:
        if self.config.transactions:  # no linearizable scan: one transaction over all
            keys = [BANK_PREFIX + a for a in self.accounts]
            seen = await tx.bank_read(tx.tx_client(client), keys)
            return {k[len(BANK_PREFIX):]: _int(v) for k, v in seen.items() if v is not None}
        items = await client.scan(BANK_PREFIX, limit=len(self.accounts) + 16)
        return {k[len(BANK_PREFIX) :]: _int(v) for k, v in items}

    async def _transfer(self, client: KvClient, invocation: Invocation) -> Completion:
        move = invocation.value
        if not isinstance(move, immutables.Map):
            raise ValueError(f"not a transfer: {move!r}")
        src, dst, amount = str(move["from"]), str(move["to"]), move["amount"]
        if not isinstance(amount, int):
            raise ValueError(f"not a transfer: {move!r}")
        keys = (BANK_PREFIX + src, BANK_PREFIX + dst)
        if self.config.transactions:
            return await self._signed_transfer(client, keys, move, amount)
        try:
            seen = await self._read(client)
        except ClientError as exc:
            return _client_error(exc, wrote=False)
        balances: tuple[bytes | None, ...] = tuple(
            None if a not in seen else str(seen[a]).encode() for a in (src, dst)
        )
        for _ in range(MAX_RETRIES):
            if balances[0] is None or balances[1] is None:
                return Completion(type=FAIL, value=move, error="account missing")
            have, other = _int(balances[0]), _int(balances[1])
            if have < amount:
                return Completion(type=FAIL, value=move, error="insufficient funds")
            result = await client.txn_result(
                [Compare(key=k, expected=b) for k, b in zip(keys, balances, strict=True)],
                [
                    Put(key=keys[0], value=str(have - amount).encode()),
                    Put(key=keys[1], value=str(other + amount).encode()),
                ],
            )
            if result.succeeded:
                return Completion(type=OK, value=move)
            balances = result.observed
        return Completion(type=FAIL, value=move, error=f"contention: {MAX_RETRIES} retries")

    async def _signed_transfer(self, client: KvClient, keys: tuple[str, str],
                               move: HistoryValue, amount: int) -> Completion:
        try:
            why = await tx.bank_transfer(tx.tx_client(client), keys[0], keys[1], amount, _int)
        except tx.NotSent as exc:
            return _client_error(exc.error, wrote=False)
        except tx.Contention as exc:
            return Completion(type=FAIL, value=move, error=str(exc))
        if why is not None:
            return Completion(type=FAIL, value=move, error=why)
        return Completion(type=OK, value=move)


def encode_set(elements: Sequence[int]) -> bytes:
    return ",".join(str(e) for e in elements).encode()


def decode_set(raw: bytes | None) -> list[int]:
    if not raw:
        return []
    try:
        return [int(e) for e in raw.split(b",")]
    except ValueError:
        raise _Outcome(Completion(type=INFO, error=f"unparseable set {raw!r}")) from None


class SetWorkload(_Base):
    """Unique adds to rotating set keys, then a final read of each (`phalanx.jepsen.sets`)."""

    name = "set"
    functions: tuple[str, ...] = set_checker.FUNCTIONS
    default_mix = (("add", 1.0),)
    prefix = SET_PREFIX

    def __init__(self, config: WorkloadConfig | None = None) -> None:
        super().__init__(config)
        self._next_element = 0

    def next_invocation(self) -> Invocation:
        f = self._pick_f()
        key = self._pick_key()
        if f == "read":
            return Invocation(f=f, key=key)
        element = self._next_element
        self._next_element += 1
        return Invocation(f="add", key=key, value=element)

    def final_invocations(self) -> tuple[Invocation, ...]:
        return tuple(Invocation(f="read", key=k) for k in self.used)

    async def execute(self, client: KvClient, invocation: Invocation) -> Completion:
        key = str(invocation.key)
        try:
            if self.config.transactions:  # commuting sadd, smembers with a requirement
                signed = tx.tx_client(client)
                if invocation.f == "read":
                    return Completion(type=OK, value=await tx.set_read(signed, key))
                if invocation.f == "add" and isinstance(invocation.value, int):
                    await tx.set_add(signed, key, invocation.value)
                    return Completion(type=OK, value=invocation.value)
            if invocation.f == "read":
                return Completion(type=OK, value=tuple(decode_set(await client.get(key))))
            if invocation.f == "add" and isinstance(invocation.value, int):
                return await self._add(client, key, invocation.value)
        except ClientError as exc:
            return _client_error(exc)
        except _Outcome as out:
            return out.completion
        raise ValueError(f"not a set invocation: {invocation!r}")

    async def _add(self, client: KvClient, key: str, element: int) -> Completion:
        try:
            current = await client.get(key)
        except ClientError as exc:
            return _client_error(exc, wrote=False)
        for _ in range(MAX_RETRIES):
            new = encode_set([*decode_set(current), element])
            result = await client.cas_result(key, current, new)
            if result.succeeded:
                return Completion(type=OK, value=element)
            current = result.current
        return Completion(type=FAIL, value=element, error=f"contention: {MAX_RETRIES} retries")


WORKLOAD_CLASSES: Final[dict[str, Callable[[WorkloadConfig | None], Workload]]] = {
    "bank": BankWorkload,
    "register": RegisterWorkload,
    "set": SetWorkload,
}


def make_workload(name: str, config: WorkloadConfig | None = None) -> Workload:
    """A fresh workload by name (``register``, ``bank``, ``set``); `ValueError` if unknown."""
    try:
        cls = WORKLOAD_CLASSES[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; known: {', '.join(WORKLOAD_CLASSES)}"
        ) from None
    return cls(config)


async def perform(
    workload: Workload,
    client: KvClient,
    recorder: HistoryRecorder,
    *,
    process: Process,
    invocation: Invocation,
    now: _Clock,
    node: int | str | None = None,
) -> OpType:
    """Invoke, execute and complete one operation in `recorder`; returns its outcome.

    `now()` gives the history time (ns since the run started). After ``info`` the caller
    must continue under a fresh process id.
    """
    recorder.invoke(
        process=process,
        f=invocation.f,
        key=invocation.key,
        value=invocation.value,
        time=now(),
        node=node,
    )
    done = await workload.execute(client, invocation)
    recorder.complete(
        process=process, type=done.type, value=done.value, error=done.error, time=now()
    )
    return done.type


class _Clock(Protocol):
    def __call__(self) -> int: ...

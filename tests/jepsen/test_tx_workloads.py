"""The workloads' signed-transaction path (`phalanx.jepsen.tx_workloads`,
`WorkloadConfig.transactions`) against an in-process KV with version requirements: what each
operation requires, how aborts map to outcomes, and that serial runs are valid."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import immutables
import pytest
from test_workloads import drive

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    CasResult,
    Compare,
    CompareAndSet,
    Get,
    KvCommand,
    KvResult,
    Put,
    SAdd,
    Txn,
    TxnResult,
    TxnWrite,
    Value,
)
from phalanx.client.async_client import ClientTimeout, TransactionAborted
from phalanx.jepsen import tx_workloads as tx
from phalanx.jepsen.workloads import Invocation, WorkloadConfig, make_workload

Requirements = Mapping[str, bytes] | None


class TxFake:
    """A signing client over one KV: a transaction commits only if its requirements (the
    caller's, or the versions the keys had when it was built) hold when it runs; the first
    `interfere` callable runs between building and running one (a concurrent commit)."""

    def __init__(self) -> None:
        self.m = KvStateMachine()
        self.required: list[tuple[str, tuple[str, ...]]] = []
        self.interfere: list[Callable[[], None]] = []
        self.timeout_on: set[str] = set()

    def apply(self, cmd: KvCommand) -> KvResult:
        return kv_wire.decode_result(self.m.apply(kv_wire.encode_command(cmd)))

    def _commit(self, name: str, cmd: KvCommand, keys: Sequence[str],
                requirements: Requirements, *, retry: bool) -> KvResult:
        if name in self.timeout_on:
            raise ClientTimeout("timed out")
        while True:
            reqs = dict(requirements) if requirements is not None else dict(
                zip(keys, self.m.versions(keys), strict=True))
            self.required.append((name, tuple(sorted(reqs))))
            if self.interfere:
                self.interfere.pop(0)()
            if dict(zip(reqs, self.m.versions(list(reqs)), strict=True)) == reqs:
                return self.apply(cmd)
            if not retry or requirements is not None:
                raise TransactionAborted("a requirement did not hold")

    async def get(self, key: str, *, stale: bool = False,
                  requirements: Requirements = None) -> bytes | None:
        r = self._commit("get", Get(key=key), [key], requirements, retry=True)
        assert isinstance(r, Value)
        return r.value

    async def put(self, key: str, value: bytes, *, requirements: Requirements = None,
                  retry_aborted: bool = False) -> None:
        self._commit("put", Put(key=key, value=value), [key], requirements, retry=retry_aborted)

    async def cas_result(self, key: str, expected: bytes | None, new: bytes, *,
                         requirements: Requirements = None,
                         retry_aborted: bool = False) -> CasResult:
        r = self._commit("cas", CompareAndSet(key=key, expected=expected, new=new), [key],
                         requirements, retry=retry_aborted)
        assert isinstance(r, CasResult)
        return r

    async def txn_result(self, compares: Sequence[Compare], success: Sequence[TxnWrite],
                         failure: Sequence[TxnWrite] = (), *,
                         requirements: Requirements = None,
                         retry_aborted: bool = False) -> TxnResult:
        keys = sorted({c.key for c in compares} | {w.key for w in (*success, *failure)})
        r = self._commit("txn", Txn(compares=tuple(compares), success=tuple(success),
                                    failure=tuple(failure)), keys, requirements,
                         retry=retry_aborted)
        assert isinstance(r, TxnResult)
        return r

    async def sadd(self, key: str, member: bytes, *, requirements: Requirements = None) -> None:
        self.required.append(("sadd", ()))
        self.apply(SAdd(key=key, member=member))

    async def smembers(self, key: str, *, stale: bool = False,
                       requirements: Requirements = None) -> list[bytes]:
        return kv_ops.decode_set(await self.get(key)) or []

    async def matching_read(self, command: bytes, *, deadline: float | None = None) -> bytes:
        if "read" in self.timeout_on:
            raise ClientTimeout("timed out")
        return self.m.query(command)


CONFIG = dict(seed=5, per_key_limit=10, active_keys=2, transactions=True)


@pytest.mark.parametrize("name", ["register", "bank", "set"])
async def test_serial_signed_runs_are_valid(name: str) -> None:
    client = TxFake()
    w = make_workload(name, WorkloadConfig(**CONFIG))  # type: ignore[arg-type]
    rec = await drive(w, client, 60)
    assert w.check(rec.history()).valid is True
    # Everything a checker reads as linearizable carried requirements; set adds none.
    assert all(keys for f, keys in client.required if f != "sadd")
    assert client.required


async def test_a_bank_read_is_one_transaction_requiring_every_account() -> None:
    client = TxFake()
    w = make_workload("bank", WorkloadConfig(accounts=3, balance=10, transactions=True))
    await drive(w, client, 0)
    client.required.clear()
    done = await w.execute(client, Invocation(f="read"))
    assert done.value == immutables.Map({"0": 10, "1": 10, "2": 10})
    assert client.required == [("txn", ("bank/0", "bank/1", "bank/2"))]


async def test_a_transfer_retries_an_aborted_attempt_with_fresh_reads() -> None:
    client = TxFake()
    w = make_workload("bank", WorkloadConfig(accounts=2, balance=10, transactions=True))
    await drive(w, client, 0)  # the opening balances and a read
    client.required.clear()
    client.interfere.append(lambda: client.apply(Put(key="bank/1", value=b"12")))
    client.interfere.append(lambda: client.apply(Put(key="bank/0", value=b"8")))
    move = immutables.Map({"from": "0", "to": "1", "amount": 3})
    done = await w.execute(client, Invocation(f="transfer", value=move))
    assert done.type == "ok"
    assert [f for f, _ in client.required] == ["txn"] * 3  # two attempts aborted
    assert (client.m.get("bank/0"), client.m.get("bank/1")) == (b"5", b"15")
    too_much = immutables.Map({"from": "0", "to": "1", "amount": 6})
    refused = await w.execute(client, Invocation(f="transfer", value=too_much))
    assert (refused.type, refused.error) == ("fail", "insufficient funds")


async def test_transfer_outcomes_under_contention_and_timeouts() -> None:
    client = TxFake()
    w = make_workload("bank", WorkloadConfig(accounts=2, balance=10, transactions=True))
    await drive(w, client, 0)
    move = immutables.Map({"from": "0", "to": "1", "amount": 1})
    for i in range(tx.MAX_RETRIES):  # every attempt meets a newer version: all abort
        client.interfere.append(
            lambda i=i: client.apply(Put(key="bank/1", value=str(20 + i).encode())))
    busy = await w.execute(client, Invocation(f="transfer", value=move))
    assert busy.type == "fail"
    assert busy.error is not None
    assert "contention" in busy.error
    client.timeout_on.add("read")  # before anything was sent: certainly no effect
    assert (await w.execute(client, Invocation(f="transfer", value=move))).type == "fail"
    client.timeout_on = {"txn"}  # the transaction may have committed
    assert (await w.execute(client, Invocation(f="transfer", value=move))).type == "info"


async def test_register_writes_retry_aborts_and_set_adds_commute() -> None:
    client = TxFake()
    reg = make_workload("register", WorkloadConfig(transactions=True))
    client.interfere.append(lambda: client.apply(Put(key="jr/0", value=b"9")))
    done = await reg.execute(client, Invocation(f="write", key="jr/0", value=1))
    assert done.type == "ok"
    assert client.m.get("jr/0") == b"1"
    assert [f for f, _ in client.required] == ["put", "put"]
    sets = make_workload("set", WorkloadConfig(transactions=True))
    for e in (3, 1, 2):
        assert (await sets.execute(client, Invocation(f="add", key="set/0", value=e))).type == "ok"
    read = await sets.execute(client, Invocation(f="read", key="set/0"))
    assert read.value == (1, 2, 3)


async def test_a_client_that_cannot_sign_is_refused() -> None:
    w = make_workload("set", WorkloadConfig(transactions=True))
    with pytest.raises(TypeError, match="cannot sign transactions"):
        await w.execute(object(), Invocation(f="add", key="set/0", value=1))  # type: ignore[arg-type]

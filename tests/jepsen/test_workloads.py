"""Workloads against an in-process KV state machine: generation, outcome mapping, verdicts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    CasResult,
    Compare,
    CompareAndSet,
    Get,
    KvCommand,
    KvError,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Txn,
    TxnResult,
    TxnWrite,
    Value,
)
from phalanx.client.async_client import ClientTimeout, KvCommandError
from phalanx.jepsen.history import HistoryRecorder
from phalanx.jepsen.workloads import (
    Invocation,
    KvClient,
    Workload,
    WorkloadConfig,
    make_workload,
    perform,
)


class FakeClient:
    """A `KvClient` over a local state machine; `fail_on` makes chosen calls raise."""

    def __init__(self) -> None:
        self.m = KvStateMachine()
        self.fail_on: dict[str, Exception] = {}
        self.calls: list[str] = []

    def _run(self, name: str, cmd: KvCommand) -> KvResult:
        self.calls.append(name)
        if name in self.fail_on:
            raise self.fail_on[name]
        result = kv_wire.decode_result(self.m.apply(kv_wire.encode_command(cmd)))
        if isinstance(result, KvError):
            raise KvCommandError(result)
        return result

    async def get(self, key: str, *, stale: bool = False) -> bytes | None:
        r = self._run("get", Get(key=key))
        assert isinstance(r, Value)
        return r.value

    async def put(self, key: str, value: bytes) -> None:
        self._run("put", Put(key=key, value=value))

    async def cas_result(self, key: str, expected: bytes | None, new: bytes) -> CasResult:
        r = self._run("cas", CompareAndSet(key=key, expected=expected, new=new))
        assert isinstance(r, CasResult)
        return r

    async def scan(
        self, prefix: str, *, limit: int = 1000, stale: bool = False
    ) -> list[tuple[str, bytes]]:
        r = self._run("scan", Scan(prefix=prefix, limit=limit))
        assert isinstance(r, ScanResult)
        return list(r.items)

    async def txn_result(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnWrite],
        failure: Sequence[TxnWrite] = (),
    ) -> TxnResult:
        r = self._run(
            "txn", Txn(compares=tuple(compares), success=tuple(success), failure=tuple(failure))
        )
        assert isinstance(r, TxnResult)
        return r


async def drive(w: Workload, client: KvClient, ops: int) -> HistoryRecorder:
    rec = HistoryRecorder()
    clock = itertools.count()

    def now() -> int:
        return next(clock)

    process = 0
    for inv in (*w.setup_invocations(), *(w.next_invocation() for _ in range(ops))):
        if await perform(w, client, rec, process=process, invocation=inv, now=now) == "info":
            process += 1
    for inv in w.final_invocations():
        await perform(w, client, rec, process=process, invocation=inv, now=now)
    return rec


@pytest.mark.parametrize("name", ["register", "bank", "set"])
async def test_serial_run_is_valid_and_generation_is_seeded(name: str) -> None:
    config = WorkloadConfig(seed=7, per_key_limit=20, active_keys=2)
    a, b = make_workload(name, config), make_workload(name, config)
    assert [a.next_invocation() for _ in range(30)] == [b.next_invocation() for _ in range(30)]
    assert a.delay() == b.delay() > 0
    w = make_workload(name, config)
    rec = await drive(w, FakeClient(), 120)
    result = w.check(rec.history(), time_limit=None)
    assert result.valid is True, result.to_json()
    assert {r.checker for r in result.results} >= {"stats"}
    if name != "bank":  # keys rotate after per_key_limit invocations
        keys = {op.key for op in rec.ops}
        assert len(keys) >= 120 // 20


async def test_register_outcomes_map_client_errors() -> None:
    w = make_workload("register")
    client = FakeClient()
    put = Invocation(f="write", key="jr/0", value=1)
    client.fail_on["put"] = ClientTimeout("deadline")
    done = await w.execute(client, put)
    assert (done.type, done.error) == ("info", "ClientTimeout: deadline")
    del client.fail_on["put"]
    assert (await w.execute(client, put)).type == "ok"
    cas = await w.execute(client, Invocation(f="cas", key="jr/0", value=(7, 8)))
    assert (cas.type, cas.error) == ("fail", "cas comparison failed")
    read = await w.execute(client, Invocation(f="read", key="jr/0"))
    assert (read.type, read.value) == ("ok", 1)
    oversize = await w.execute(client, Invocation(f="read", key="k" * 5000))
    assert oversize.type == "fail"  # a refused command certainly had no effect


async def test_bank_transfer_and_read_semantics() -> None:
    w = make_workload("bank", WorkloadConfig(accounts=3, balance=10))
    client = FakeClient()
    (init,) = w.setup_invocations()
    assert (await w.execute(client, init)).type == "ok"
    assert (await w.execute(client, init)).type == "fail"  # accounts already exist
    move = {"from": "0", "to": "1", "amount": 4}
    inv = Invocation(f="transfer", value=HistoryRecorder().invoke(
        process=0, f="transfer", value=move, time=0).value)  # type: ignore[arg-type]
    assert (await w.execute(client, inv)).type == "ok"
    read = await w.execute(client, Invocation(f="read"))
    assert read.type == "ok"
    assert dict(read.value) == {"0": 6, "1": 14, "2": 10}  # type: ignore[call-overload]
    big = Invocation(f="transfer", value=inv.value.set("amount", 7))  # type: ignore[union-attr]
    assert (await w.execute(client, big)).error == "insufficient funds"
    # A timeout on the initial read: nothing was written yet -> fail, not info.
    client.fail_on["scan"] = ClientTimeout("slow")
    assert (await w.execute(client, inv)).type == "fail"
    # A timeout on the txn itself may have applied -> info.
    del client.fail_on["scan"]
    client.fail_on["txn"] = ClientTimeout("slow")
    assert (await w.execute(client, inv)).type == "info"


async def test_bank_transfer_retries_on_a_concurrent_change() -> None:
    w = make_workload("bank", WorkloadConfig(accounts=2, balance=10))
    client = FakeClient()
    await w.execute(client, w.setup_invocations()[0])
    real_scan = client.scan

    async def stale_scan(prefix: str, *, limit: int = 1000, stale: bool = False
                         ) -> list[tuple[str, bytes]]:
        items = await real_scan(prefix, limit=limit)
        await client.put("bank/0", b"9")  # someone else moved 1 out of account 0...
        await client.put("bank/1", b"11")
        return items

    client.scan = stale_scan  # type: ignore[method-assign]
    inv = Invocation(f="transfer", value=w.next_invocation().value)
    inv = Invocation(f="transfer", value=inv.value.set("from", "0").set("to", "1")  # type: ignore[union-attr]
                     .set("amount", 2))
    done = await w.execute(client, inv)
    assert done.type == "ok"
    assert client.calls.count("txn") == 3  # init, a failed compare, the retry
    assert (client.m.get("bank/0"), client.m.get("bank/1")) == (b"7", b"13")


async def test_set_add_is_a_cas_append_and_detects_a_double_apply() -> None:
    w = make_workload("set", WorkloadConfig(active_keys=1))
    client = FakeClient()
    rec = await drive(w, client, 5)
    assert client.m.get("set/0") == b"0,1,2,3,4"
    assert w.check(rec.history()).valid is True
    client.m.execute(Put(key="set/0", value=b"0,1,2,3,4,4"))  # a replayed append
    final = await w.execute(client, Invocation(f="read", key="set/0"))
    assert final.value == (0, 1, 2, 3, 4, 4)
    clock = itertools.count(10_000)
    await perform(w, client, rec, process=99, invocation=Invocation(f="read", key="set/0"),
                  now=lambda: next(clock))
    verdict = w.check(rec.history())
    assert verdict.valid is False
    assert verdict.to_json()["checkers"]["set"]["duplicated_count"] == 1  # type: ignore[index]


def test_bad_configs_and_names_raise() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("queue")
    with pytest.raises(ValueError, match="mix"):
        make_workload("set", WorkloadConfig(mix=(("remove", 1.0),)))
    with pytest.raises(ValueError, match="rate"):
        WorkloadConfig(rate=0)

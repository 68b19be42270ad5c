"""`phalanx.replicated_class`: a plain class with @replicated / @query methods as a state
machine (typed msgpack commands, error results, snapshots) and its client proxy, checked
against a stand-in client, by a determinism property, and on the simulator."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import phalanx
from phalanx import (
    InvalidArgument,
    Replicated,
    ReplicatedCallError,
    ReplicatedMachine,
    SnapshotFormatError,
    query,
    replicated,
)
from phalanx.appspec.custom import machine_factory
from phalanx.appspec.spec import AppConfigError
from phalanx.jepsen.sim.run import RunConfig, run
from phalanx.replicated_class import encode_call

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "replicated_counter.py"


class Account:
    def __init__(self) -> None:
        self.balance = 0
        self.log: list[str] = []

    @replicated
    def deposit(self, amount: int, memo: str = "") -> int:
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.log.append(memo)
        return self.balance

    @query
    def balance_of(self) -> int:
        return self.balance

    def helper(self) -> None:  # not marked: not callable remotely
        self.balance = -1


class _Local:
    """A stand-in client: `call` applies to (or queries) one local machine."""

    def __init__(self, machine: ReplicatedMachine[Any]) -> None:
        self.machine = machine
        self.sent: list[bytes] = []

    async def call(self, command: bytes, *, read_only: bool = False) -> bytes:
        self.sent.append(command)
        return self.machine.query(command) if read_only else self.machine.apply(command)


def test_the_proxy_calls_methods_exactly_as_written() -> None:
    machine = ReplicatedMachine(Account())
    client = _Local(machine)
    account = Replicated(Account, client)

    async def scenario() -> None:
        assert await account.deposit(5) == 5
        assert await account.deposit(amount=2, memo="gift") == 7
        assert await account.balance_of() == 7
        with pytest.raises(ReplicatedCallError, match="ValueError: amount must be positive"):
            await account.deposit(-1)
        sent = len(client.sent)
        with pytest.raises(InvalidArgument, match="'amount' must be int, got str"):
            await account.deposit("5")
        with pytest.raises(InvalidArgument, match="deposit"):
            await account.deposit(1, 2, 3)
        assert len(client.sent) == sent, "a bad call is refused before anything is sent"
        with pytest.raises(AttributeError, match="helper"):
            account.helper  # noqa: B018

    trio.run(scenario)
    assert machine.target.log == ["", "gift"]


def test_a_sync_client_gets_values_directly() -> None:
    machine = ReplicatedMachine(Account())

    class Sync:
        def call(self, command: bytes, *, read_only: bool = False) -> bytes:
            return machine.query(command) if read_only else machine.apply(command)

    account = Replicated(Account, Sync())
    assert account.deposit(3) == 3
    assert account.balance_of() == 3


def test_replicas_refuse_bad_input_with_an_error_result_never_an_exception() -> None:
    machine = ReplicatedMachine(Account())
    for data in (b"", b"\xc1", encode_call("helper"), encode_call("deposit", ("x",)),
                 encode_call("__init__"), b"\x93\x01\x02\x03"):
        with pytest.raises(ReplicatedCallError):
            phalanx.replicated_class.decode_result("x", machine.apply(data))
    # A read cannot run a command (it would change state outside the log).
    with pytest.raises(ReplicatedCallError, match="no replicated read 'deposit'"):
        phalanx.replicated_class.decode_result("x", machine.query(encode_call("deposit", (1,))))
    assert machine.target.balance == 0


CALLS = st.lists(st.tuples(st.integers(-3, 50), st.text(max_size=5)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(CALLS, st.integers(0, 30))
def test_replicas_agree_and_snapshots_restore(calls: list[tuple[int, str]], cut: int) -> None:
    a, b = ReplicatedMachine(Account()), ReplicatedMachine(Account())
    for i, (amount, memo) in enumerate(calls):
        command = encode_call("deposit", (amount, memo))
        if i == cut:  # b restarts from a's checkpoint
            b.restore(b"".join(a.snapshot().chunks()))
        assert a.apply(command) == b.apply(command)
        snap = a.snapshot()
        a.apply(encode_call("deposit", (1,)))  # later applies never change a snapshot
        b.apply(encode_call("deposit", (1,)))
        assert b"".join(snap.chunks()) != b"".join(a.snapshot().chunks())
    assert b"".join(a.snapshot().chunks()) == b"".join(b.snapshot().chunks())


def test_declared_state_and_refused_state() -> None:
    class Tally:
        def __init__(self) -> None:
            self.seen: set[str] = set()

        @replicated
        def see(self, word: str) -> int:
            self.seen.add(word)
            return len(self.seen)

        def to_state(self) -> list[str]:
            return sorted(self.seen)

        @classmethod
        def from_state(cls, state: list[str]) -> Tally:
            out = cls()
            out.seen = {str(w) for w in state}
            return out

    m = ReplicatedMachine(Tally())
    m.apply(encode_call("see", ("b",)))
    m.apply(encode_call("see", ("a",)))
    fresh = ReplicatedMachine(Tally())
    fresh.restore(b"".join(m.snapshot().chunks()))
    assert fresh.target.seen == {"a", "b"}
    with pytest.raises(SnapshotFormatError):
        ReplicatedMachine(Account()).restore(b"\xc1")

    class Sets:
        def __init__(self) -> None:
            self.items: set[int] = set()

        @replicated
        def add(self, x: int) -> None:
            self.items.add(x)

    with pytest.raises(TypeError, match="not msgpack-able"):
        ReplicatedMachine(Sets())


def test_the_example_class_is_its_own_app_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    machine = machine_factory(f"{EXAMPLE}:Counters")()
    assert isinstance(machine, ReplicatedMachine)
    bad = tmp_path / "bad.py"
    bad.write_text("from phalanx import replicated\nclass S:\n    def __init__(self):\n"
                   "        self.s = {1}\n    @replicated\n    def f(self): pass\n")
    with pytest.raises(AppConfigError, match="not msgpack-able"):
        machine_factory(f"{bad}:S")


def test_the_example_passes_the_simulator() -> None:
    ms = 1_000_000
    result = run(RunConfig(seed=4, nodes=3, app=f"{EXAMPLE}:Counters",
                           time_ns=500 * ms, liveness_ns=800 * ms))
    assert result.ok, result.report()
    assert result.ops_ok > 50
    rng = random.Random(1)
    kinds = {ReplicatedMachine(EXAMPLE_COUNTERS()).random_command(rng).read_only
             for _ in range(50)}
    assert kinds == {True, False}


def _load_counters() -> Any:
    from phalanx.appspec.custom import resolve

    return resolve(f"{EXAMPLE}:Counters")


EXAMPLE_COUNTERS = _load_counters()

"""Checking any state machine's history: the machine as its own sequential specification.

Owns:
    * how a custom app's operations are written in a history: ``f`` is ``apply`` (a
      command) or ``query`` (a read-only request), ``key`` the command's object
      (`phalanx.apps.command_source.GeneratedCommand.key`; null for ""), the invoke's value
      the command and an ``ok`` completion's value ``[command, result]``, both as `to_text`
      (UTF-8 text, else ``"b64:"`` and base64: reversible, readable for text commands);
    * `MachineModel`: the linearizability `Model` over a `StateMachine` factory. A state is
      the machine's snapshot bytes (hashable; equal exactly when the machine's serialisation
      is, which the StateMachine contract makes deterministic); a step restores a fresh
      machine from them, applies (or queries) the command and compares the result;
    * `check_app_history(history, factory)`: linearizability under that model plus the stats
      checker, as a `phalanx.jepsen.checker.RunResult`;
    * `state_digest(machine)`: SHA-256 of a machine's snapshot bytes (replica convergence);
      `model_of(factory)`: the app's `reference_model()` or the app itself.

Must not import: the simulator, consensus cores, trio, the client. Pure given the factory
(the model memoises steps: a machine that is not deterministic shows up as a violation or
as divergence, never as a crash of the checker).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Final

from phalanx.apps.interface import SnapshotFormatError, StateMachine
from phalanx.jepsen.checker import CheckerResult, RunResult, check_stats
from phalanx.jepsen.history import FAIL, INFO, History, HistoryError, OpPair, Value
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT, check

APPLY: Final = "apply"
QUERY: Final = "query"
WORKLOAD: Final = "commands"
"""The name of a custom app's workload (`phalanx.appspec.custom`) and of its checker's run."""
_B64: Final = "b64:"

MachineFactory = Callable[[], StateMachine]
AppCall = tuple[bytes, bytes | None, bool]
"""A prepared operation: (command, the observed result or None if unknown, read-only)."""


def to_text(data: bytes) -> str:
    """`data` as history text: UTF-8 if it is (and does not start ``b64:``), else b64."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith(_B64):
        return text
    return _B64 + base64.b64encode(data).decode()


def from_text(text: Value, *, what: str = "value") -> bytes:
    """The bytes `to_text` wrote. Raises `HistoryError` on anything else."""
    if not isinstance(text, str):
        raise HistoryError(f"{what} must be a string, got {text!r}")
    if text.startswith(_B64):
        try:
            return base64.b64decode(text[len(_B64):], validate=True)
        except binascii.Error:
            raise HistoryError(f"{what}: bad base64 {text!r}") from None
    return text.encode()


def model_of(machine: MachineFactory) -> MachineFactory:
    """The sequential model of the app `machine` builds: its `reference_model()` when it
    declares one (`phalanx.apps.command_source`), else the app itself."""
    from phalanx.apps.command_source import reference_of

    if reference_of(machine()) is None:
        return machine
    return lambda: reference_of(machine()) or machine()


def snapshot_bytes(machine: StateMachine) -> bytes:
    return b"".join(machine.snapshot().chunks())


def state_digest(machine: StateMachine) -> str:
    """A short hex digest of `machine`'s serialised state."""
    return hashlib.sha256(snapshot_bytes(machine)).hexdigest()[:16]


class MachineModel:
    """A `StateMachine` factory as a linearizability model (see the module docstring)."""

    __slots__ = ("_factory", "_initial", "_memo")

    def __init__(self, factory: MachineFactory) -> None:
        self._factory = factory
        self._initial = snapshot_bytes(factory())
        self._memo: dict[tuple[bytes, bytes, bool], tuple[bytes, bytes]] = {}

    @property
    def name(self) -> str:
        return WORKLOAD

    def initial(self) -> bytes:
        return self._initial

    def prepare(self, pair: OpPair) -> AppCall | None:
        inv, done = pair.invoke, pair.completion
        if done is not None and done.type == FAIL:
            raise ValueError("prepare() is not called for failed operations")
        where = f"op #{inv.index} ({inv.f})"
        if inv.f not in (APPLY, QUERY):
            raise HistoryError(f"{where}: an app's history has only {APPLY} and {QUERY}")
        command = from_text(inv.value, what=f"the command of {where}")
        read_only = inv.f == QUERY
        if done is None or done.type == INFO:
            return None if read_only else (command, None, False)
        value = done.value
        if not (isinstance(value, tuple) and len(value) == 2):
            raise HistoryError(f"{where}: an ok value must be [command, result], got {value!r}")
        return command, from_text(value[1], what=f"the result of {where}"), read_only

    def run(self, state: bytes, command: bytes, read_only: bool) -> tuple[bytes, bytes]:
        """(result, next state) of `command` on the state serialised in `state`."""
        memo_key = (state, command, read_only)
        known = self._memo.get(memo_key)
        if known is not None:
            return known
        machine = self._factory()
        try:
            machine.restore(state)
        except SnapshotFormatError as e:  # its own snapshot: a bug in the app, said plainly
            raise HistoryError(f"the model could not restore its own snapshot: {e}") from None
        result = machine.query(command) if read_only else machine.apply(command)
        out = (result, state if read_only else snapshot_bytes(machine))
        self._memo[memo_key] = out
        return out

    def step(self, state: bytes, call: AppCall) -> tuple[bool, bytes]:
        command, expected, read_only = call
        result, after = self.run(state, command, read_only)
        return expected is None or result == expected, after

    def describe_state(self, state: bytes) -> Value:
        return to_text(state)


def check_app_history(history: History, factory: MachineFactory, *,
                      time_limit: float | None = DEFAULT_TIME_LIMIT,
                      step_limit: int | None = None, stats: bool = True) -> RunResult:
    """Linearizability of `history` against `factory`'s machine, plus the stats checker
    (every kind invoked must have succeeded once)."""
    lin = check(history, MachineModel(factory), time_limit=time_limit, step_limit=step_limit)
    doc = lin.to_json()
    results = [CheckerResult(checker="linearizable", valid=lin.valid,
                             details={k: v for k, v in doc.items()
                                      if k not in ("valid", "workload")})]
    if stats:
        results.append(check_stats(history, functions=(APPLY,)))
    return RunResult(workload=WORKLOAD, results=tuple(results), linearizability=lin)

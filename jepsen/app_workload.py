"""Your own state machine on a real cluster under faults: the ``commands`` workload.

Owns: `CommandsWorkload` (a `phalanx.jepsen.workloads.Workload`) and `workload_factory`,
what `phalanx.appspec.custom` registers for a machine with the `random_command` hook
(`phalanx.apps.command_source`), so `phalanx jepsen run --app FILE.py:FACTORY` drives it:
each invocation is the next command `random_command` draws from the run's seeded
generator, sent with `Client.call` (a read-only one as a linearizable read); the history is
checked for linearizability against the app's model (`phalanx.jepsen.app_model`: its
`reference_model()`, else the app itself), plus the stats checker.

Outcomes as the other workloads': the call returned: ``ok`` with ``[command, result]``;
`RequestRejected`: ``fail``; any other client error: ``info``. No final operations (the
app's generator decides what is read).

Must not import: the runtime, consensus cores, the simulator.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from phalanx.apps.command_source import CommandSource, command_source
from phalanx.apps.interface import StateMachine
from phalanx.client.errors import ClientError, RequestRejected
from phalanx.jepsen.app_model import (
    APPLY,
    QUERY,
    WORKLOAD,
    check_app_history,
    from_text,
    model_of,
    to_text,
)
from phalanx.jepsen.checker import RunResult
from phalanx.jepsen.history import FAIL, INFO, OK, History
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT
from phalanx.jepsen.workloads import Completion, Invocation, WorkloadConfig


class CallClient(Protocol):
    """The slice of `phalanx.client.Client` this workload uses."""

    async def call(self, command: bytes, *, read_only: bool = False) -> bytes: ...


class CommandsWorkload:
    """See the module docstring."""

    name = WORKLOAD
    functions: tuple[str, ...] = (APPLY,)

    def __init__(self, machine: Callable[[], StateMachine],
                 config: WorkloadConfig | None = None) -> None:
        self.config = config if config is not None else WorkloadConfig()
        self.rng = random.Random(self.config.seed)
        try:
            probe = command_source(machine())
        except TypeError as e:
            raise ValueError(str(e)) from None
        if probe is None:
            raise ValueError("the app has no random_command(rng): nothing to send it")
        self.source: CommandSource = probe
        self.model: Callable[[], StateMachine] = model_of(machine)

    def delay(self) -> float:
        return self.rng.expovariate(self.config.rate)

    def next_invocation(self) -> Invocation:
        generated = self.source.random_command(self.rng)
        return Invocation(f=QUERY if generated.read_only else APPLY, key=generated.key or None,
                          value=to_text(generated.command))

    def setup_invocations(self) -> tuple[Invocation, ...]:
        return ()

    def final_invocations(self) -> tuple[Invocation, ...]:
        return ()

    async def execute(self, client: CallClient, invocation: Invocation) -> Completion:
        command = from_text(invocation.value)
        try:
            result = await client.call(command, read_only=invocation.f == QUERY)
        except ClientError as e:
            error = f"{type(e).__name__}: {e}"
            return Completion(type=FAIL if isinstance(e, RequestRejected) else INFO, error=error)
        return Completion(type=OK, value=(invocation.value, to_text(result)))

    def check(self, history: History, *,
              time_limit: float | None = DEFAULT_TIME_LIMIT) -> RunResult:
        return check_app_history(history, self.model, time_limit=time_limit)


def workload_factory(reference: str) -> Callable[..., CommandsWorkload]:
    """The `phalanx.appspec.spec.WorkloadFactory` of the app `reference` names."""
    from phalanx.appspec.custom import machine_factory

    machine = machine_factory(reference)

    def make(config: WorkloadConfig, cluster: object = None) -> CommandsWorkload:
        del cluster  # a custom app reads no cluster files
        return CommandsWorkload(machine, config)

    return make

"""The optional hook that lets phalanx TEST your state machine: random commands and a model.

Owns: `GeneratedCommand` (one command of a test workload), the `CommandSource` hook,
`command_source(machine)` (the hook, checked) and `reference_of(machine)`. `phalanx sim
--app FILE.py:FACTORY` and `phalanx jepsen run --app FILE.py:FACTORY` drive a custom app
through it (docs/STATE_MACHINES.md "Test it"):

- `random_command(rng)` (required for testing): the next command of a random client, drawn
  ONLY from `rng` (a seeded `random.Random`: the same seed gives the same commands, which
  is what makes a simulation replayable). Put read-only requests (`query`) in the mix with
  ``read_only=True``.
- `reference_model()` (optional): a fresh `StateMachine` that is the app's *sequential
  specification*: the linearizability checker replays the history's operations on it one
  at a time, in every order the real-time constraints allow, and asks that every observed
  result is the one it gives. Without it the app itself (a fresh machine from the same
  factory) is its own model: that checks the replication (no lost, doubled, reordered or
  stale operation), not the app's logic, which the app's own unit tests cover.

`GeneratedCommand.key` names the independent object a command touches (the ticket queue,
the account): commands on different keys must never change each other's results, so the
checker can check each key on its own (tractable); "" puts everything in one object.

Must not import: anything beyond the standard library and `phalanx.apps.interface`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from phalanx.apps.interface import StateMachine


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratedCommand:
    """One command a test client sends: the bytes, read-only or not, and its object."""

    command: bytes
    read_only: bool = False
    """Sent as a read (`StateMachine.query`), not a command (`apply`)."""
    key: str = ""
    """The independent object the command touches (see the module docstring)."""

    def __post_init__(self) -> None:
        if not isinstance(self.command, bytes):
            raise TypeError(f"GeneratedCommand.command must be bytes, got "
                            f"{type(self.command).__name__}")


@runtime_checkable
class CommandSource(Protocol):
    """Optional on a `StateMachine`: what testing it needs (see the module docstring)."""

    def random_command(self, rng: random.Random) -> GeneratedCommand:
        """A random command, drawn only from `rng`; never reads the machine's state."""
        ...


def command_source(machine: object) -> CommandSource | None:
    """`machine` if it has a working `random_command` (one is drawn, from a fixed seed, to
    check its type), None if it has none. Raises TypeError (one line) when it returns
    something other than a `GeneratedCommand` or raises."""
    if not isinstance(machine, CommandSource):
        return None
    try:
        sample = machine.random_command(random.Random(0))
    except Exception as e:
        raise TypeError(f"random_command raised {type(e).__name__}: {e}") from None
    if not isinstance(sample, GeneratedCommand):
        raise TypeError(f"random_command must return a GeneratedCommand, got "
                        f"{type(sample).__name__}")
    return machine


def reference_of(machine: object) -> StateMachine | None:
    """The machine's own `reference_model()`, or None when it declares none."""
    make = getattr(machine, "reference_model", None)
    return None if make is None else make()

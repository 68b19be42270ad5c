"""Your own state machine as a phalanx app: ``--app MODULE:FACTORY`` or ``--app FILE.py:FACTORY``.

Owns: `custom_spec(reference)`, the `AppSpec` of a state machine that is not registered: the
reference names a callable (a class or a function taking no arguments) that returns a fresh
`phalanx.apps.interface.StateMachine`, either in an importable module (``mypkg.tickets:
TicketMachine``) or in a Python file (``./tickets.py:TicketMachine``; `cluster init` stores
the file's absolute path, so every node loads the same file whatever its working directory).

Such an app has no client helpers or demo: clients send it raw command bytes
(`phalanx.client.Client.call`, `phalanx call`). It runs on any protocol that orders commands
(a total order is not asked for: say so with a registered `AppSpec` if your app needs it).
A machine with the optional `random_command` hook (`phalanx.apps.command_source`) gets the
``commands`` workload (`phalanx.jepsen.app_workload`: `phalanx jepsen run --app REF`) and
runs in the simulator (`machine_factory`; `phalanx sim --app REF`).

A class whose methods are marked `phalanx.replicated` / `phalanx.query` (and that has no
`apply` of its own) is wrapped in `phalanx.replicated_class.ReplicatedMachine`: ``--app
counter.py:Counter`` runs the plain class.

Invariants: the reference is resolved and the factory called once, by `check_custom`
(`cluster init` and node start-up), so a typo is one line naming the module or file, not a
traceback in a running node. Loading a file executes it: only name files you trust.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.appspec.spec import AppConfigError, AppFiles, AppSpec

if TYPE_CHECKING:
    from phalanx.apps.interface import StateMachine


def is_custom(reference: str) -> bool:
    """Whether `reference` names a state machine rather than a registered app."""
    return ":" in reference


def resolve(reference: str) -> Any:
    """The object `reference` (``MODULE:ATTR`` or ``FILE.py:ATTR``) names. Raises
    `AppConfigError` (one line) when it cannot be loaded."""
    where, _, attr = reference.rpartition(":")
    if not where or not attr.isidentifier():
        raise AppConfigError(f"--app {reference!r}: expected MODULE:FACTORY or FILE.py:FACTORY")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            if not path.is_file():
                raise AppConfigError(f"--app {reference!r}: no file {path}")
            name = f"phalanx_app_{abs(hash(str(path)))}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or spec.loader is None:
                    raise AppConfigError(f"--app {reference!r}: cannot load {path}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except AppConfigError:
        raise
    except ModuleNotFoundError as e:
        raise AppConfigError(f"--app {reference!r}: cannot import {e.name!r} (is it on "
                             "PYTHONPATH? or name a file: ./FILE.py:FACTORY)") from None
    except Exception as e:  # the user's module raised while loading: say which, one line
        raise AppConfigError(f"--app {reference!r}: loading it raised "
                             f"{type(e).__name__}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AppConfigError(f"--app {reference!r}: {where} has no {attr!r}") from None


@dataclass(frozen=True, slots=True)
class _Factory:
    """`Lazy`-shaped: `load()` gives the machine factory of a custom reference."""

    reference: str

    def load(self) -> Any:
        factory = resolve(self.reference)

        def build(files: AppFiles) -> StateMachine:
            del files  # a custom app has no [app] files
            return check_machine(self.reference, factory)

        return build


def check_machine(reference: str, factory: Any) -> StateMachine:
    """Call `factory` and check that the result looks like a `StateMachine`."""
    if not callable(factory):
        raise AppConfigError(f"--app {reference!r}: not callable")
    try:
        machine = factory()
        if not callable(getattr(machine, "apply", None)):  # a @replicated class: wrapped
            from phalanx.replicated_class import as_machine

            machine = as_machine(machine)
    except Exception as e:
        raise AppConfigError(f"--app {reference!r}: calling it raised "
                             f"{type(e).__name__}: {e}") from None
    missing = [m for m in ("apply", "query", "snapshot", "restore")
               if not callable(getattr(machine, m, None))]
    if missing:
        raise AppConfigError(f"--app {reference!r}: the object it returned has no "
                             f"{', '.join(missing)} (see docs/STATE_MACHINES.md)")
    return machine  # type: ignore[no-any-return]


def machine_factory(reference: str) -> Callable[[], StateMachine]:
    """A function building fresh machines of `reference` (checked once, now). Raises
    `AppConfigError` (one line) when it will not load."""
    factory = resolve(reference)
    check_machine(reference, factory)
    return lambda: check_machine(reference, factory)


@dataclass(frozen=True, slots=True)
class _Workload:
    """`Lazy`-shaped: `load()` gives the ``commands`` workload factory of `reference`."""

    reference: str

    def load(self) -> Any:
        from phalanx.jepsen.app_workload import workload_factory

        return workload_factory(self.reference)


def absolute(reference: str) -> str:
    """`reference` with a file path made absolute (what `cluster init` writes)."""
    where, _, attr = reference.rpartition(":")
    if where.endswith(".py"):
        return f"{Path(where).resolve()}:{attr}"
    return reference


def custom_spec(reference: str) -> AppSpec:
    """The spec of the state machine `reference` names (checked: loaded and built once)."""
    from phalanx.apps.command_source import CommandSource

    machine = check_machine(reference, resolve(reference))
    workloads = ((("commands", _Workload(reference)),) if isinstance(machine, CommandSource)
                 else ())
    return AppSpec(name=reference, summary=f"your state machine {reference}",
                   machine=_Factory(reference),  # type: ignore[arg-type]
                   workloads=workloads)  # type: ignore[arg-type]

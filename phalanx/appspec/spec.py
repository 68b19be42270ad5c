"""What the rest of phalanx knows about an application: `AppSpec`, one per app.

Owns: `AppSpec` (the app registry entry), `AppFiles` (the files a node's ``[app]`` table
names) and the signatures of the factories an app provides. The runtime, `cluster init`,
the CLI, the harness and the demo decide everything app-specific from a spec, never by
comparing app names (tests/test_app_registry.py holds this).

Invariants: importing this module (and a spec) is cheap: the app's state machine, client
helpers and workloads load only when a `Lazy` reference is resolved. A spec is immutable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.protocols.spec import CallStrategy, Lazy, ProtocolSpec

if TYPE_CHECKING:
    from phalanx.apps.interface import StateMachine
    from phalanx.jepsen.workloads import Workload, WorkloadConfig
    from phalanx.ops.node_config import ClusterConfig

AppFiles = Mapping[str, Path]
"""The ``[app]`` table of a node or cluster config: option name -> an absolute path (the
files an app reads, e.g. the chain's genesis). Keys are the spec's `AppSpec.files`."""

MachineFactory = Callable[[AppFiles], "StateMachine"]
"""Builds a node's state machine from its app files (raises `AppConfigError`)."""

ClusterInit = Callable[[Path], dict[str, Path]]
"""`cluster init`'s hook: writes the app's files under the cluster directory (mode 0600 for
secrets) and returns the ``[app]`` table every node and cluster config gets."""

WorkloadFactory = Callable[["WorkloadConfig", "ClusterConfig"], "Workload"]
"""A harness workload over a created cluster (its files: the chain's account keys)."""


class AppConfigError(Exception):
    """An app's files are missing or malformed (the message names the file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppSpec:
    """Everything the rest of phalanx decides per application (one registry entry).

    Attributes:
        name: the ``app`` config value, `--app` choice.
        summary: one line for `--help` listings.
        machine: builds the node's `StateMachine` from its ``[app]`` files.
        files: the ``[app]`` keys the app reads (required when present here).
        init: `cluster init`'s hook writing the app's files, or None (no files).
        client: the app's client helpers (a class wrapping `phalanx.client.Client`).
        workloads: ``(name, factory)`` of the harness workloads this app runs; the first
            is the default (`default_workload`).
        demo: `phalanx demo --app NAME`'s entry point (``main(args, directory, delete=)``).
        total_order: the app needs every replica to apply the same commands in the same
            order in the same batches (blocks): not for a protocol whose replicas apply
            non-conflicting transactions in different orders (`CallStrategy.ENDORSEMENT`).
        services: node services (`phalanx.services`) `cluster init --app NAME` enables
            for this app besides those asked with ``--service`` (their tables are written
            into every node config, where an operator sees and may disable them).
    """

    name: str
    summary: str
    machine: Lazy[MachineFactory]
    files: tuple[str, ...] = ()
    init: Lazy[ClusterInit] | None = None
    client: Lazy[Any] | None = None
    workloads: tuple[tuple[str, Lazy[WorkloadFactory]], ...] = ()
    demo: Lazy[Callable[..., int]] | None = None
    total_order: bool = False
    services: tuple[str, ...] = ()

    @property
    def default_workload(self) -> str | None:
        return self.workloads[0][0] if self.workloads else None

    @property
    def workload_names(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, _ in self.workloads))

    def workload(self, name: str) -> WorkloadFactory:
        """The factory of workload `name`. Raises ValueError naming this app's workloads."""
        for known, factory in self.workloads:
            if known == name:
                return factory.load()
        raise ValueError(f"the {self.name} app has no workload {name!r}; choose from "
                         f"{', '.join(self.workload_names) or 'none'}")

    def protocol_problem(self, protocol: ProtocolSpec) -> str | None:
        """Why this app cannot run on `protocol`, or None."""
        if self.total_order and protocol.call_strategy is CallStrategy.ENDORSEMENT:
            return (f"the {self.name} app needs one total order of blocks; {protocol.name} "
                    "replicas apply transactions in different orders")
        return None

    def build_machine(self, files: AppFiles) -> StateMachine:
        """The app's state machine. Raises `AppConfigError` (missing or bad files)."""
        missing = [k for k in self.files if k not in files]
        if missing:
            raise AppConfigError(f"the {self.name} app needs [app] {', '.join(missing)}")
        return self.machine.load()(files)

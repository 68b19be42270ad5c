"""What the rest of phalanx knows about a node service: `ServiceSpec`, one per service.

A node service is a sans-IO auxiliary machine a node hosts beside its consensus core (gossip
is the first; the chain's block-certificate exchange is meant to be the next). It gets time
as input (ticks), its own peer messages over the node's existing peer links (routed to it by
message type), its own metrics, an API for the embedding application and, optionally,
operations on the client port (`ServiceCall`, `phalanx.services.messages`).

Owns: `ServiceSpec` (the registry entry), `ServiceOption` (one key of the service's TOML
table in a node config), `ServiceContext` (what the runtime hands the factory) and the
`NodeService` protocol the runtime host (`phalanx.runtime.services`) drives.

Invariants: importing this module (and a spec) is cheap: a service's machine, driver and
client types load only when a `Lazy` reference is resolved. A spec is immutable. The
runtime, the config loader, `cluster init`, the CLI and the demo decide everything
service-specific from a spec, never by comparing service names.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from phalanx.protocols.spec import Lazy

if TYPE_CHECKING:  # not at run time: node configs import this module, and `phalanx kv`
    # reads a node config without loading the consensus package (issue 22: start-up)
    from phalanx.consensus.types import Message, NodeId
    from phalanx.ops.node_config import NodeConfig

OptionValue = int | bool | str
"""What a service option may hold (a TOML integer, boolean or string)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceOption:
    """One key of a service's table (``[gossip] tick_ms = 25``).

    Attributes:
        name: the TOML key.
        default: its value when absent; its type is the key's type (int, bool or str).
        minimum: the smallest legal value of an int option.
        help: one line for docs and errors.
    """

    name: str
    default: OptionValue
    help: str
    minimum: int = 0


class ServiceError(Exception):
    """A service cannot start with this configuration (the message names what to fix)."""


SendFn: TypeAlias = "Callable[[NodeId, Message], bool]"
"""Queue a message for a peer (best effort: False when refused, e.g. a full queue)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceContext:
    """What the runtime hands a service factory.

    Attributes:
        config: the node's configuration.
        options: the service's table, validated against `ServiceSpec.options` (every key
            present, defaults filled in).
        send: queue a peer message (the node's transport; the host flushes after each step).
        wall_clock: seconds since the epoch (timestamps for operators; never a decision).
        rng: the service's own seeded randomness.
        state_dir: a directory for the service's small durable state (created).
        machine: the node's application state machine (as the replica applies it), for a
            service that observes the app through an optional capability it checks with
            ``isinstance`` (e.g. `phalanx.apps.interface.BlockStream`); None when the host
            was built without one.
        submit: hand an application command to this node's consensus, as a local client
            would (best effort: False when the local queue is full; the outcome is read back
            from the replicated state, never from a reply); None when the host has none.
        checkpoint: the node's newest durable checkpoint as (index, SHA-256 of its bytes),
            or None before the first (`phalanx.runtime.stable_checkpoints`); None when the
            host has no replica.
        services: the node's services by name, as the host builds them (the same live
            mapping: complete once every service is built, i.e. by the first tick), so a
            service can use another through a capability it checks with ``isinstance``
            (the announce service spreads through any service that spreads rumors); None
            when the host has none.
    """

    config: NodeConfig
    options: Mapping[str, OptionValue]
    send: SendFn
    wall_clock: Callable[[], float]
    rng: random.Random
    state_dir: Path
    machine: object | None = None
    submit: Callable[[bytes], bool] | None = None
    checkpoint: Callable[[], tuple[int, bytes] | None] | None = None
    services: Mapping[str, NodeService] | None = None


class NodeService(Protocol):
    """A service as the runtime host drives it. Every method is synchronous and called from
    the node's trio tasks one at a time (no locking needed); `receive` gets Byzantine input
    and must drop and count bad messages, never raise."""

    @property
    def tick_seconds(self) -> float: ...

    def tick(self) -> None: ...

    def receive(self, src: NodeId, message: Message) -> None: ...

    def call(self, request: Message) -> Message:
        """Answer a client's operation (`ServiceCall`). Raise `ValueError` for a request
        this service does not serve (answered ERROR with the message)."""
        ...

    def needed_role(self, request: Message) -> str:
        """The weakest client role (`phalanx.ops.pki.CLIENT_ROLES`) that may ask `request`."""
        ...

    def counters(self) -> Mapping[str, int]:
        """Monotonic counters for the metrics page (names: letters, digits, '_', ':')."""
        ...

    def gauges(self) -> Mapping[str, int]: ...

    def close(self) -> None: ...


ServiceFactory = Callable[[ServiceContext], NodeService]
"""Builds a node's service (raises `ServiceError` for bad keys or state)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    """Everything the rest of phalanx decides per node service (one registry entry).

    Attributes:
        name: the service's TOML table in a node config (``[gossip]``), its key in
            `Node.services`, `ServiceCall.service`, `phalanx demo --scenario` choice.
        summary: one line for `--help` listings.
        options: the keys of its table; any other key is a config error.
        messages: its peer wire types (id -> class): registered with the codec and routed
            to the service by type, over the node's existing peer links.
        client_messages: the wire types of its client-port operations (id -> class).
        build: the factory (`ServiceFactory`).
        signing_keys: the service needs every node's signing key (`cluster init` writes
            them even for a protocol that does not sign; the config loader requires them).
        demo: `phalanx demo --scenario NAME`'s entry point (``main(args, directory,
            delete=)``), or None.
        scenario: the demo's `--scenario` name, when it is not the service's name (the
            clustersend service's demo is ``cross-shard``).
    """

    name: str
    summary: str
    options: tuple[ServiceOption, ...]
    messages: Lazy[Mapping[int, type]]
    client_messages: Lazy[Mapping[int, type]] | None = None
    build: Lazy[ServiceFactory]
    signing_keys: bool = False
    demo: Lazy[Callable[..., int]] | None = None
    scenario: str = ""

    @property
    def scenario_name(self) -> str:
        """`phalanx demo --scenario`'s name for this service's demo."""
        return self.scenario or self.name

    def defaults(self) -> dict[str, OptionValue]:
        return {o.name: o.default for o in self.options}

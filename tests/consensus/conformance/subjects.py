"""The protocols the conformance suite checks, from ONE function: `subjects()`.

Owns: `Subject` (a protocol's name, cluster size, wire message classes and a fresh simulator
`ProtocolSetup` per cluster) and `subjects()`. Every conformance test is parametrized over
`subjects()`: one `Subject` per protocol registered in `phalanx.protocols` (a plug-in
registered by the tests, such as the toy protocol, is checked too).

Rules: a setup is built fresh for every cluster (setups keep per-run state: PBFT's durable
cells, the vote watches); honest replicas only (no Byzantine wrappers: the suite checks the
cores, the simulator's Byzantine runs check the protocols).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx import protocols

# The test-only toy protocol (tests/toy_protocol) registers itself on import: the suite
# checks it beside the built-in cores, proving a plug-in meets the same contract.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import toy_protocol  # noqa: F401

from phalanx.consensus.types import Message
from phalanx.jepsen.sim.protocols import ProtocolSetup, protocol_setup


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """One protocol under test."""

    name: str
    nodes: int
    messages: tuple[type[Message], ...]
    """The core's own wire message classes (those a peer can send it)."""
    make_setup: Callable[[], ProtocolSetup]
    """A fresh simulator setup (cores, replicas over the KV app, codec, checker)."""

    def __str__(self) -> str:
        return self.name


def _wire_messages(table: Mapping[int, type]) -> tuple[type[Message], ...]:
    """The `Message` subclasses of a codec table, in type-id order (durable records such as
    PBFT's `PbftDurableState` are registered too but are not peer messages)."""
    return tuple(cls for _, cls in sorted(table.items()) if issubclass(cls, Message))


def subjects() -> tuple[Subject, ...]:
    """Every registered protocol, each at its smallest cluster that tolerates one fault."""
    return tuple(_subject(spec) for spec in protocols.specs())


def _subject(spec: protocols.ProtocolSpec) -> Subject:
    nodes = spec.default_nodes

    def make_setup() -> ProtocolSetup:
        # Frequent checkpoints, so restarts also restore from one.
        return protocol_setup(spec.name, bugs=frozenset(), nodes=nodes, checkpoint_every=20)

    return Subject(name=spec.name, nodes=nodes,
                   messages=_wire_messages(spec.messages.load()), make_setup=make_setup)


SUBJECTS = subjects()
IDS = [s.name for s in SUBJECTS]

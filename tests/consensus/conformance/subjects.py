"""The protocols the conformance suite checks, from ONE function: `subjects()`.

Owns: `Subject` (a protocol's name, cluster size, wire message classes and a fresh simulator
`ProtocolSetup` per cluster) and `subjects()`. Every conformance test is parametrized over
`subjects()`; when the protocol registry lands, only `subjects()` changes (one `Subject` per
registry entry).

Rules: a setup is built fresh for every cluster (setups keep per-run state: PBFT's durable
cells, the vote watches); honest replicas only (no Byzantine wrappers: the suite checks the
cores, the simulator's Byzantine runs check the protocols).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from phalanx.consensus.pbft import PBFT_MESSAGES
from phalanx.consensus.raft.messages import RAFT_MESSAGES
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


def _wire_messages(table: dict[int, type]) -> tuple[type[Message], ...]:
    """The `Message` subclasses of a codec table, in type-id order (durable records such as
    PBFT's `PbftDurableState` are registered too but are not peer messages)."""
    return tuple(cls for _, cls in sorted(table.items()) if issubclass(cls, Message))


def subjects() -> tuple[Subject, ...]:
    """Every protocol the suite checks (the one place to switch to the registry)."""
    return (
        Subject(
            name="raft",
            nodes=3,
            messages=_wire_messages(RAFT_MESSAGES),
            # Frequent checkpoints, so restarts also restore from one.
            make_setup=lambda: protocol_setup("raft", bugs=frozenset(), nodes=3,
                                              knobs=(("checkpoint_every", 20),)),
        ),
        Subject(
            name="pbft",
            nodes=4,
            messages=_wire_messages(PBFT_MESSAGES),
            make_setup=lambda: protocol_setup("pbft", bugs=frozenset(), nodes=4),
        ),
    )


SUBJECTS = subjects()
IDS = [s.name for s in SUBJECTS]

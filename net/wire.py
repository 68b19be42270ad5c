"""The project's default codec registry and its table of STABLE type ids.

Owns: the one `Registry` every node, the simulator and the harness encode with, the ids of
the shared consensus types, and the reserved id ranges below. Must not import trio,
sockets, clocks, or any protocol package at import time (protocol modules import this one
and register their own classes through `register_all`; importing them here would cycle).

Reserved type id ranges (a type id is part of the wire format: never reuse or renumber one):

    =========  ==================================================================
    ids        owner
    =========  ==================================================================
    1-49       shared consensus types (`phalanx.consensus.types`, registered here)
    100-199    Raft messages (`phalanx.consensus.raft.messages`)
    200-299    PBFT messages
    300-399    leaderless (PnyxDB-style) messages
    400-499    applications (KV commands and results, ...)
    500-599    runtime and client protocol (500-505 client protocol; 506-507 checkpoint
               pieces, `phalanx.runtime.piece_messages`; 550-579 gossip,
               `phalanx.gossip.messages.GOSSIP_MESSAGES`)
    600-699    inter-cluster / cluster-sending (600-629 `phalanx.clustersend.messages.
               CLUSTERSEND_MESSAGES`; 620-621 and 627-629 the announce service's,
               `phalanx.services.announce_node` and `.announce_api`)
    710-719    client admin operations (710-711 `phalanx.ops.admin_messages`: membership
               and leadership transfer; 712-715 `phalanx.ops.ops_messages`: backups and
               certificate reloads)
    1000-1999  plug-in protocols outside this repository, and test-only protocols
    =========  ==================================================================

Shared ids: 1 ClientRequest, 2 Configuration, 3 Entry, 4 HardState, 5 SnapshotMeta.

Invariants: `register_all` only accepts ids in a reserved range, is idempotent for identical
pairs and refuses any conflicting one (register through it, not through the registry directly).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar, cast, overload

from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    HardState,
    SnapshotMeta,
)
from phalanx.net.codec import Registry

__all__ = [
    "RANGES",
    "SHARED_TYPES",
    "canonical_bytes",
    "decode",
    "decode_entry",
    "default_registry",
    "encode",
    "register_all",
]

T = TypeVar("T")

RANGES: Final[Mapping[str, range]] = MappingProxyType(
    {
        "shared": range(1, 50),
        "raft": range(100, 200),
        "pbft": range(200, 300),
        "leaderless": range(300, 400),
        "apps": range(400, 500),
        "runtime": range(500, 600),
        "intercluster": range(600, 700),
        "admin": range(710, 720),
        "plugins": range(1000, 2000),
    }
)
"""The reserved type id ranges, by owner."""

SHARED_TYPES: Final[Mapping[int, type]] = MappingProxyType(
    {
        1: ClientRequest,
        2: Configuration,
        3: Entry,
        4: HardState,
        5: SnapshotMeta,
    }
)
"""The stable ids of `phalanx.consensus.types`."""


def _range_of(type_id: int) -> str | None:
    for owner, ids in RANGES.items():
        if type_id in ids:
            return owner
    return None


def register_all(mapping: Mapping[int, type], *, registry: Registry | None = None) -> None:
    """Register ``type_id: class`` pairs into the default registry (or `registry`).

    Call it once at the bottom of a messages module, e.g.
    ``register_all({100: RequestVote, 101: RequestVoteResponse, ...})``.

    Raises:
        TypeError: an id lies outside every reserved range, an id or a class is already
            registered differently, or a class is not encodable (see `Registry.register`).
            Nothing is registered when an id is out of range.
    """
    outside = [tid for tid in mapping if type(tid) is not int or _range_of(tid) is None]
    if outside:
        raise TypeError(f"type ids {outside} lie outside every reserved range of phalanx.net.wire")
    (_DEFAULT if registry is None else registry).register_many(mapping)


def default_registry() -> Registry:
    """The process-wide registry, with the shared consensus types already registered."""
    return _DEFAULT


def encode(obj: object) -> bytes:
    """`Registry.encode` on the default registry."""
    return _DEFAULT.encode(obj)


@overload
def decode(
    data: bytes | bytearray | memoryview, *, expected: type[T], canonical: bool = False
) -> T: ...


@overload
def decode(
    data: bytes | bytearray | memoryview, *, expected: None = None, canonical: bool = False
) -> object: ...


def decode(
    data: bytes | bytearray | memoryview,
    *,
    expected: type[T] | None = None,
    canonical: bool = False,
) -> T | object:
    """`Registry.decode` on the default registry."""
    return _DEFAULT.decode(data, expected=expected, canonical=canonical)


def decode_entry(data: bytes) -> Entry:
    """`decode(data, expected=Entry)` through the registry's hot-path decoder (the same result
    and errors): what decodes the WAL's records on replay."""
    return cast(Entry, _DECODE_ENTRY(data))  # decoder(Entry) yields only an Entry


def canonical_bytes(obj: object, *, omit: tuple[str, ...] = ()) -> bytes:
    """`Registry.canonical_bytes` on the default registry: the bytes to sign or hash."""
    return _DEFAULT.canonical_bytes(obj, omit=omit)


_DEFAULT: Final = Registry()
register_all(SHARED_TYPES)
_DECODE_ENTRY: Final = _DEFAULT.decoder(Entry)

"""Shard-level state transfer for a core that checks the checkpoint bytes it receives
against a certified digest (PBFT): the message that carries them
(`phalanx.protocols.spec.PieceCarrier`, PBFT's `CheckpointData`) travels with a piece manifest
instead, and the receiving node hands its core the message again with the bytes assembled
from pieces it fetched from every peer (`PieceTransfer.resolve`).

Owns: `CarrierLink` (the outgoing rewrite and the incoming fetch-then-deliver task).
Must not import: consensus cores (the carrier names the message type and its fields).

Invariants: the core still decides. Each piece is checked against the manifest's SHA-256
(a Byzantine server's bad piece is dropped, counted and fetched from another peer); the
assembled bytes go to the core, which checks them against the stable checkpoint's
certificate, so a Byzantine sender's false manifest costs a fetch and is dropped by the core
as any wrong `CheckpointData` is (it then asks another replica). One manifest is resolved at
a time; one that arrives meanwhile is dropped and counted (`carrier_busy`: the core asks
again). A checkpoint the store does not hold in pieces (v1, v2) is sent whole, as before.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

import trio

from phalanx.consensus.types import Message, NodeId
from phalanx.protocols.spec import PieceCarrier
from phalanx.runtime.piece_manifest import PieceStore, encode, is_manifest
from phalanx.runtime.piece_transfer import PieceTransfer
from phalanx.storage.interface import StorageError

logger = logging.getLogger(__name__)

GIVE_UP_ROUNDS = 2
"""Rounds in which no peer served what a manifest names before it is given up (the core
asks another replica for the checkpoint meanwhile)."""

Deliver = Callable[[NodeId, object], Awaitable[None]]


class CarrierLink:
    """The carrier's two directions for one node (module docstring)."""

    def __init__(self, carrier: PieceCarrier, pieces: PieceTransfer, store: PieceStore
                 ) -> None:
        self._carrier = carrier
        self._pieces = pieces
        self._store = store
        self._tx, self._rx = trio.open_memory_channel[tuple[NodeId, Message, bytes]](1)

    def outgoing(self, send: Callable[[NodeId, Message], bool]
                 ) -> Callable[[NodeId, Message], bool]:
        """`send`, with the carrier's checkpoint bytes replaced by their piece manifest."""
        carrier, store = self._carrier, self._store
        cls, index_field, data_field = carrier.message, carrier.index_field, carrier.data_field

        def sending(to: NodeId, message: Message) -> bool:
            if type(message) is cls:
                data = getattr(message, data_field)
                if not is_manifest(data[:8]):
                    try:
                        _, pieces = store.piece_list(getattr(message, index_field))
                    except StorageError:  # not held in pieces: sent whole
                        return send(to, message)
                    manifest = encode(getattr(message, index_field), pieces)
                    message = dataclasses.replace(message, **{data_field: manifest})  # type: ignore[type-var]
            return send(to, message)

        return sending

    def incoming(self, deliver: Deliver) -> Deliver:
        """`deliver`, with a carrier holding a manifest queued for `run` instead."""
        cls, data_field = self._carrier.message, self._carrier.data_field
        stats = self._pieces.stats

        async def receiving(src: NodeId, message: object) -> None:
            if type(message) is cls and isinstance(message, Message):
                data = getattr(message, data_field)
                if isinstance(data, bytes) and is_manifest(data):
                    try:
                        self._tx.send_nowait((src, message, data))
                    except trio.WouldBlock:
                        stats.dropped["carrier_busy"] += 1
                    return
            await deliver(src, message)

        return receiving

    async def run(self, deliver: Deliver, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resolve queued manifests one at a time and deliver the assembled messages."""
        task_status.started()
        carrier = self._carrier
        async for src, message, manifest in self._rx:
            index = getattr(message, carrier.index_field)
            try:
                await self._pieces.resolve(manifest, rounds=GIVE_UP_ROUNDS)
            except StorageError as e:
                logger.warning("fetching the pieces of checkpoint %d failed: %s", index, e)
                continue
            got = self._pieces.fetched.get(index)
            if got is None:  # not a valid manifest (counted by `resolve`)
                continue
            await deliver(src, dataclasses.replace(  # type: ignore[type-var]
                message, **{carrier.data_field: got.data()}))

"""Wire types of shard-level state transfer (`phalanx.runtime.piece_transfer`): runtime ids
506 (`PieceRequest`) and 507 (`PieceReply`) of `phalanx.net.wire`'s runtime range.

Semantics: a `PieceRequest(nonce, digests, offsets, lengths)` asks a peer for ranges of
checkpoint pieces it holds (by SHA-256); the `PieceReply` with the same nonce carries one
chunk per range, in order, b"" for a range it cannot serve. Replies are normal peer input:
the fetcher checks each whole piece against its digest (`piece_transfer`).

Rules: pure data, frozen slotted keyword-only dataclasses; `register()` is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.types import Message
from phalanx.net import wire


@dataclass(frozen=True, slots=True, kw_only=True)
class PieceRequest(Message):
    """Ranges (`offsets[i]`, `lengths[i]`) of the pieces `digests[i]`."""

    nonce: int
    digests: tuple[bytes, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    def __str__(self) -> str:
        return f"PieceRequest nonce={self.nonce} ranges={len(self.digests)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PieceReply(Message):
    """The answer to the `PieceRequest` with the same nonce: one chunk per range."""

    nonce: int
    chunks: tuple[bytes, ...]

    def __str__(self) -> str:
        return f"PieceReply nonce={self.nonce} bytes={sum(map(len, self.chunks))}"


PIECE_MESSAGES: dict[int, type] = {506: PieceRequest, 507: PieceReply}


def register() -> None:
    """Register the piece transfer's wire types with the project codec (idempotent)."""
    wire.register_all(PIECE_MESSAGES)

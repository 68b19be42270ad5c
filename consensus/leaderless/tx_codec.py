"""How the leaderless core turns a client request's bytes into a `Transaction` and back.

Owns: the `TxCodec` protocol. The runtime and the simulator pass the wire codec
(`phalanx.net.wire`, with the leaderless types registered); tests may pass any codec.
Invariant: `decode(encode(tx)) == tx`; `decode` never raises (garbage is None).
"""

from __future__ import annotations

from typing import Protocol

from phalanx.consensus.leaderless.messages import Transaction


class TxCodec(Protocol):
    def encode(self, tx: Transaction) -> bytes:
        """The canonical bytes of `tx` (what `transaction_id` hashes)."""
        ...

    def decode(self, data: bytes) -> Transaction | None:
        """The transaction `data` encodes, or None if it encodes no well-typed one."""
        ...

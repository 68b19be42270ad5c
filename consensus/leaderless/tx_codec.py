"""How the leaderless core turns a client request's bytes into a `Transaction` and back.

Owns: the `TxCodec` protocol. The runtime and the simulator pass the wire codec
(`phalanx.net.wire`, with the leaderless types registered); tests may pass any codec.
Invariant: `decode(encode(tx)) == tx`; `decode` never raises (garbage is None).

`TxIds` (optional): a codec that also computes `transaction_id` (e.g. from a memo it shares
with the replica's transaction layer); the core then asks it instead of encoding and
hashing itself. Must equal `messages.transaction_id(tx, encode)`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from phalanx.consensus.leaderless.messages import Transaction, TxId


class TxCodec(Protocol):
    def encode(self, tx: Transaction) -> bytes:
        """The canonical bytes of `tx` (what `transaction_id` hashes)."""
        ...

    def decode(self, data: bytes) -> Transaction | None:
        """The transaction `data` encodes, or None if it encodes no well-typed one."""
        ...


@runtime_checkable
class TxIds(Protocol):
    def transaction_id(self, tx: Transaction) -> TxId:
        """`messages.transaction_id(tx, self.encode)` (module docstring)."""
        ...

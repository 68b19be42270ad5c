"""The leaderless core's status record (`LeaderlessCore.status()`).

Owns: `LeaderlessStatus`, which ignored inputs are benign (`BENIGN_DUPLICATES`) and the
rejection texts (`REASONS`). Pure data; building it never changes the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.consensus.core import CoreStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessStatus(CoreStatus):
    """`CoreStatus` of the leaderless core: role "endorser", term 0, no leader,
    `commit_index` = the last released local index.

    Attributes:
        pending: known undecided transactions.
        oldest_pending_ms: the earliest deadline (ms since the epoch) among them, 0 when
            none (the simulator's `quiescence` check: one stuck for good shows here).
        committed: transactions committed by this process (restored ones included).
        dropped_txs: transactions dropped (checkpoint or abort certificate).
        aborted: `Abort`s emitted.
        gated: committed transactions waiting at the version gate.
        skipped_reads: committed read-only transactions skipped at the gate, past their
            deadline (`ReleaseGate.skip_stale_reads`).
        gc_horizon_ms: the garbage-collection horizon.
        duplicate: benign re-sends ignored, by reason (`BENIGN_DUPLICATES`: peers'
            periodic re-sends, client retries); `dropped` keeps the suspicious input.
        installs: checkpoints installed by state transfer (`catch_up.py`).
        catching_up: why this node is asking peers for a checkpoint ("" when it is not).
        behind_checkpoints: verified checkpoints refused because they lacked a write
            applied here (a newer one is awaited).
    """

    pending: int = 0
    oldest_pending_ms: int = 0
    committed: int = 0
    dropped_txs: int = 0
    aborted: int = 0
    gated: int = 0
    skipped_reads: int = 0
    gc_horizon_ms: int = 0
    duplicate: Mapping[str, int] = field(default_factory=dict)
    installs: int = 0
    catching_up: str = ""
    behind_checkpoints: int = 0


BENIGN_DUPLICATES = frozenset({"duplicate_tx", "decided_tx", "duplicate_endorsement",
                               "decided_endorsement", "duplicate_submit", "duplicate_refusal"})
"""Ignored inputs that the protocol's own re-sends and client retries produce all the time:
counted in `status().duplicate`, not `dropped` (so a drop count means something)."""

REASONS = {
    "undecodable_submit": "the command is not a transaction",
    "submit_mismatch": "client_id, request_no or read_only differ from the transaction's",
    "submit_expired": "the transaction's deadline has passed",
    "malformed_tx": "malformed transaction (request number, deadline or requirements)",
    "client_overloaded": "this client has too many undecided transactions at this node "
                         "(max_pending_per_client): retry once some are decided",
    "bad_tx_signature": "the transaction's signature does not verify with the key this node "
                        "holds for its client (a client key missing from the nodes' keyring?)",
}

INVALID_SUBMITS = frozenset({"undecodable_submit", "submit_mismatch", "malformed_tx",
                             "bad_tx_signature"})
"""Rejections no correct node would answer otherwise: `Rejection.invalid` (the client gets
an error after f+1 matching answers instead of retrying until its deadline)."""
